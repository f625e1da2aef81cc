"""Habits of the project itself: license, version, what `make` and CI run, the README.

The make targets are checked by what they do (``make -n`` prints the commands a
target would run; ``make rngtest`` is run without dieharder on the PATH; CI's script
is run with a ``make`` that only records its targets), not by the Makefile's text.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess

import pytest

import dropmask

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="needs GNU make")


def _make_dry_run(target: str) -> list[str]:
    """The commands ``make TARGET`` would run, the virtualenv taken as installed.

    Run from a make (as ``make test`` runs the suite), a nested make inherits its
    parent's flags and prints "Entering directory" lines: those are dropped here.
    """
    assert MAKE is not None
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        [MAKE, "-n", "--no-print-directory", "-o", ".venv/.installed-dev"]
        + ["-o", ".venv/.installed-bench", "-o", ".venv/.installed-docs", target],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_license_file_is_the_license_the_package_declares():
    assert importlib.metadata.metadata("dropmask")["License"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer


def test_the_version_is_the_installed_packages_and_no_module_hard_codes_one():
    assert dropmask.__version__ == importlib.metadata.version("dropmask")
    sources = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
    assert not re.search(r"__version__\s*=\s*['\"]\d+\.", sources)


@needs_make
def test_pre_commit_runs_what_make_lint_runs():
    hooks = re.findall(r"entry: (.+)", (ROOT / ".pre-commit-config.yaml").read_text())
    assert [line.strip() for line in hooks] == _make_dry_run("lint")


@needs_make
def test_make_test_is_the_fast_loop_and_make_test_slow_the_rest():
    (fast,) = [line for line in _make_dry_run("test") if "pytest" in line]
    (slow,) = [line for line in _make_dry_run("test-slow") if "pytest" in line]
    assert '-m "not slow"' in fast and "-m slow" in slow, (fast, slow)


@needs_make
def test_make_docs_fails_on_any_warning_and_builds_afresh():
    (build,) = [line for line in _make_dry_run("docs") if "sphinx" in line]
    assert {"-W", "--keep-going", "-n"} <= set(build.split()), build
    assert "rm -rf docs/_build/html docs/_build/doctrees" in _make_dry_run("docs")


def test_ci_runs_the_tests_the_docs_lint_and_the_wheel_test(tmp_path):
    log = tmp_path / "targets"
    fake = tmp_path / "bin" / "make"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, check=True)
    ran = log.read_text().split()
    assert {"test", "test-slow", "lint", "wheel-test", "docs", "docs-check"} <= set(ran), ran
    # The slow tests check the browser check on the site that `docs` built.
    assert ran.index("docs") < ran.index("docs-check") < ran.index("test-slow"), ran


@needs_make
def test_rngtest_names_its_prerequisite_instead_of_installing_it(tmp_path):
    assert MAKE is not None
    done = subprocess.run(
        [MAKE, "-o", ".venv/.installed-dev", "rngtest"],
        cwd=ROOT,
        env={"PATH": str(tmp_path)},  # no dieharder, and no apt-get either
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "needs the dieharder program: apt-get install dieharder" in done.stderr, done.stderr
    assert "not found" not in done.stderr, done.stderr  # nothing else was tried


def test_no_module_puts_the_working_directory_on_sys_path():
    for path in (ROOT / "src").rglob("*.py"):
        assert "sys.path.insert" not in path.read_text(), path


def test_the_readme_carries_no_run_history():
    text = (ROOT / "README.md").read_text()
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dates belong in RESULTS.md"
    assert not re.search(r"\bat [0-9a-f]{7,40}\b", text), "no commit hashes"


def _module_imports(path: pathlib.Path, name: str) -> set[str]:
    """Modules of dropmask that ``path`` imports at module level (type-only imports too)."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    statements = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks
            statements += node.body
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if node.module is None else module)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dropmask"):
            found.add(node.module or "")
    return found


def test_no_import_cycle_between_modules():
    src = ROOT / "src"
    modules = {}
    for path in src.rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {m for m in _module_imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
        if path.name != "__init__.py"  # a package re-exports its modules
    }
    graph = {name: {m for m in deps if m in graph} for name, deps in graph.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start]:
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    cycles = sorted(name for name in graph if reaches(name, name, set()))
    assert not cycles, cycles


def test_front_ends_share_helpers_through_core_modules():
    """Linen and NNX modules never import each other's modules, and a layer package
    takes from its recurrent module only the recurrent layers it re-exports."""
    src = ROOT / "src" / "dropmask"
    for own, other in (("linen", "nnx"), ("nnx", "linen")):
        for path in (src / own).glob("*.py"):
            name = f"dropmask.{own}" + ("" if path.name == "__init__.py" else f".{path.stem}")
            found = _module_imports(path, name)
            crossing = {m for m in found if (m + ".").startswith(f"dropmask.{other}.")}
            assert not crossing, (name, crossing)
    for layers in ("linen", "nnx"):
        text = (src / layers / "__init__.py").read_text()
        taken = set(re.findall(r"^from \._recurrent import (\w+)", text, re.M))
        assert taken == {"Bidirectional", "MaskedRNN"}, (layers, taken)
