"""Habits of the project itself: license, version, lint hooks, test targets, README size."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re

import dropmask

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _make_recipe(target: str) -> list[str]:
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, target
    return [line.strip() for line in match.group(1).splitlines()]


def test_the_license_file_is_the_license_pyproject_declares():
    assert 'license = { text = "Apache-2.0" }' in PYPROJECT
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer


def test_the_version_lives_in_pyproject_alone():
    assert len(re.findall(r'^version = "\d+\.\d+\.\d+"$', PYPROJECT, re.M)) == 1
    assert dropmask.__version__ == importlib.metadata.version("dropmask")
    sources = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
    assert not re.search(r"__version__\s*=\s*['\"]\d+\.", sources)


def test_pre_commit_runs_what_make_lint_runs():
    hooks = re.findall(
        r"entry: \.venv/bin/python (.+)", (ROOT / ".pre-commit-config.yaml").read_text()
    )
    lint = [line.replace("$(PY) ", "") for line in _make_recipe("lint")]
    assert hooks == lint, (hooks, lint)
    assert 'include = ["src", "tests", "examples"]' in PYPROJECT


def test_make_test_is_the_fast_loop_and_ci_runs_the_rest():
    (test,) = _make_recipe("test")
    assert '-m "not slow"' in test and "--durations=10" in test
    assert any("-m slow" in line for line in _make_recipe("test-slow"))
    ci = (ROOT / ".ci" / "run").read_text()
    for target in ("make test\n", "make test-slow", "make lint", "make wheel-test"):
        assert target in ci, target


def test_rngtest_names_its_prerequisite_instead_of_installing_it():
    recipe = "\n".join(_make_recipe("rngtest"))
    assert "dieharder" in recipe and "apt-get install -y" not in recipe


def test_no_module_puts_the_working_directory_on_sys_path():
    for path in (ROOT / "src").rglob("*.py"):
        assert "sys.path.insert" not in path.read_text(), path


def test_the_readme_is_a_five_minute_read():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert 120 <= len(lines) <= 200, len(lines)
    text = "\n".join(lines)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dates belong in RESULTS.md"
    assert not re.search(r"\bat [0-9a-f]{7,40}\b", text), "no commit hashes"
    for section in ("## Install", "## Quick start", "make demo", "make test"):
        assert section in text, section


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
    """Linen and NNX modules never import each other's private modules, and a layer
    module takes from its recurrent module only the recurrent layers it re-exports."""
    src = ROOT / "src" / "dropmask"
    linen = {"dropmask.linen", "dropmask._linen_rnn"}
    nnx = {"dropmask.nnx", "dropmask._nnx_rnn"}
    for own, other in ((linen, nnx), (nnx, linen)):
        for name in own:
            path = src / f"{name.split('.')[-1]}.py"
            crossing = _module_imports(path, name) & other
            assert not crossing, (name, crossing)
    for layers, rnn in (("linen", "_linen_rnn"), ("nnx", "_nnx_rnn")):
        text = (src / f"{layers}.py").read_text()
        taken = set(re.findall(rf"^from \.{rnn} import (\w+)", text, re.M))
        assert taken == {"Bidirectional", "MaskedRNN"}, (layers, taken)
