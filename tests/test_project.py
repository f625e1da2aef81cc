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
