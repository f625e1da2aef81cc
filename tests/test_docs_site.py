"""The documentation site's sources: every public name has an entry, the guides link
names, the command's reference is the command's parser; and the browser check fails
when a page is missing.

The first tests read the sources (no Sphinx build); ``make docs`` builds them strictly.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pathlib
import pkgutil
import re
import shutil
import subprocess
import sys
import types

import pytest

import dropmask
from dropmask import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load(path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _load(DOCS / "_ext" / "dropmask_reference.py")
cli_reference = _load(DOCS / "_ext" / "dropmask_cli.py")

# Public modules that are no namespace of the API reference, and where they are instead.
NOT_IN_API = {
    "dropmask.cli": "docs/cli.md, from its parsers",
    "dropmask.examples": "docs/examples/, the examples' READMEs",
}


def test_every_public_module_with_an_all_has_an_api_page_or_a_reason():
    public = {
        f"dropmask.{m.name}"
        for m in pkgutil.iter_modules(dropmask.__path__)
        if not m.name.startswith("_")
        and hasattr(importlib.import_module(f"dropmask.{m.name}"), "__all__")
    }
    assert public - set(NOT_IN_API) == set(reference.NAMESPACES) - {"dropmask"}
    toc = (DOCS / "api" / "index.md").read_text()
    for namespace in reference.NAMESPACES:
        page = DOCS / "api" / f"{namespace}.md"
        assert f"{{public-api}} {namespace}\n" in page.read_text(), page
        assert f"\n{namespace}\n" in toc, f"api/index.md's toctree misses {namespace}"


@pytest.mark.parametrize("namespace", reference.NAMESPACES)
def test_every_name_in_all_has_a_summary_row_and_an_entry(namespace):
    source = reference.api_source(namespace)
    summary, _, entries = source.partition(".. autosummary::")[2].partition("\n.. auto")
    rows = re.findall(r"^   (\w+)$", summary, re.M)
    documented = re.findall(r"^\.\. auto(?:class|exception|function|data):: (\w+)$", source, re.M)
    names = importlib.import_module(namespace).__all__
    assert rows == list(names)
    assert documented == list(names)
    assert entries  # the entries follow the table


# The namespaces whose every public function and class shows a `>>>` example, which
# `make test` runs (`--doctest-modules`).
EXAMPLED = (
    "dropmask",
    "dropmask.linen",
    "dropmask.nnx",
    "dropmask.uncertainty",
    "dropmask.training",
    "dropmask.audit",
    "dropmask.testing",
    "dropmask.why",
)


@pytest.mark.parametrize("namespace", EXAMPLED)
def test_every_public_function_and_class_has_an_example(namespace):
    # Constants (DROPOUT_MASK_NAME, audit.CODES, why.HOLDS) have no docstring of their own.
    module = importlib.import_module(namespace)
    objects = {name: getattr(module, name) for name in module.__all__}
    documented = {
        name: ">>>" in (obj.__doc__ or "")  # a class's own docstring, not a base's
        for name, obj in objects.items()
        if inspect.isclass(obj) or inspect.isroutine(obj)
    }
    missing = sorted(name for name, has in documented.items() if not has)
    assert documented and not missing, f"{namespace}: no `>>>` example in {missing}"


def test_a_name_added_to_all_gets_its_entry_without_editing_a_page(monkeypatch):
    module = importlib.import_module("dropmask.why")
    monkeypatch.setattr(module, "__all__", [*module.__all__, "added_name"])
    monkeypatch.setattr(module, "added_name", lambda: None, raising=False)
    assert ".. autofunction:: added_name\n" in reference.api_source("dropmask.why")


GUIDES = sorted(
    p for p in DOCS.glob("*.md") if "```{include}" not in p.read_text() and p.name != "cli.md"
)


@pytest.mark.parametrize("path", GUIDES, ids=[p.name for p in GUIDES])
def test_every_guide_names_public_objects_that_link_to_their_entries(path):
    targets = reference.link_targets()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # code blocks
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    linked = {s for s in spans if s.removesuffix("()") in targets}
    assert linked, f"{path.name} names no public object in inline code"


def test_bare_names_link_only_where_one_namespace_owns_them_and_no_word_is_meant():
    targets = reference.link_targets()
    assert targets["drop_block"] == ("obj", "dropmask.drop_block")
    assert targets["dl.Dropout"] == ("obj", "dropmask.linen.Dropout")
    assert targets["NnxTrainState"] == ("obj", "dropmask.training.NnxTrainState")
    assert targets["dropmask.linen"] == ("mod", "dropmask.linen")
    for word in ("Dropout", "train", "sample", "HOLDS", "CODES"):  # two owners, or a word
        assert word not in targets, word


def test_links_to_included_files_become_links_to_their_pages():
    text = "[a](../examples/digits/README.md#results) [b](../benchmarks/RESULTS.md) [c](x.md)"
    assert reference.rewrite_repo_links(text, "training") == (
        "[a](/examples/digits.md#results) [b](/benchmarks.md) [c](x.md)"
    )
    # An included file's links, from its own place: CHANGELOG.md at the root.
    text = "[d](docs/guide.md#part-1-dropout) [e](examples/sst2/README.md) [f](LICENSE)"
    assert reference.rewrite_repo_links(text, "../CHANGELOG") == (
        "[d](/guide.md#part-1-dropout) [e](/examples/sst2.md) [f](LICENSE)"
    )
    for path, page in reference.PAGES.items():
        source = (DOCS / f"{page}.md").read_text()
        assert "```{include} " in source and source.split()[1].endswith(path), (path, page)


def test_every_package_readme_is_a_page_and_a_docs_path_names_its_page():
    readmes = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "src" / "dropmask").glob("*/README.md")
    }
    assert readmes and readmes <= set(reference.PAGES), readmes - set(reference.PAGES)
    assert reference.page_of("docs/attention.md") == "attention"
    assert reference.page_of("src/dropmask/linen/README.md") == "internals/linen"
    assert reference.page_of("docs/no_such_page.md") is None
    assert reference.page_of("src/dropmask/_dropout.py") is None


def test_the_cli_reference_is_the_command_s_own_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    parser = cli_reference.parser()
    (subparsers,) = [a for a in parser._actions if a.dest == "command"]
    assert list(subparsers.choices) == list(cli.COMMANDS)
    for name, sub in subparsers.choices.items():
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        assert capsys.readouterr().out == sub.format_help(), name


SITE = DOCS / "_build" / "html"
BROWSER = (pathlib.Path("/usr/bin/chromium"), pathlib.Path("/usr/bin/chromedriver"))


def _site_checkable() -> bool:
    return (
        (SITE / "index.html").is_file()
        and all(p.is_file() for p in BROWSER)
        and importlib.util.find_spec("selenium") is not None
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not _site_checkable() and not os.environ.get("CI"),
    reason="needs `make docs-check` first: the built site, selenium and Debian's chromium",
)
def test_the_browser_check_passes_on_the_site_and_fails_when_a_page_is_removed(tmp_path):
    site = tmp_path / "html"
    shutil.copytree(SITE, site)

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(DOCS / "check_site.py"), str(site)]
            + ["--screenshots", str(tmp_path / "screenshots")],
            capture_output=True,
            text=True,
            timeout=300,
        )

    whole = check()
    assert whole.returncode == 0, whole.stderr
    assert {p.name for p in (tmp_path / "screenshots").iterdir()} == {
        "home.png",
        "api-linen.png",
        "search-layerdrop.png",
    }
    (site / "api" / "dropmask.linen.html").unlink()
    broken = check()
    assert broken.returncode == 1, broken.stdout
    lines = broken.stderr.splitlines()
    assert "docs-check: api/dropmask.linen.html: no element table.autosummary" in lines
    assert any("api/dropmask.linen.html: console error" in line and "404" in line for line in lines)
    # The home page does not link the API page's contents; the search fetches the page
    # for a result's excerpt, so it fails too.
    assert not any(line.startswith("docs-check: index.html") for line in lines), lines
    assert any(
        line.startswith("docs-check: search.html?q=LayerDrop: console error") for line in lines
    )
