"""The layers of docs/architecture.md hold: every module placed, no import reaching up.

The page's tables are the one record of which layer each module is in: a top-level
module by its row, a package by its folder's row. Each package's README is the one table
of its modules. This test reads both. Every ``import`` counts, at module level, inside a
function or under ``TYPE_CHECKING``: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Mapping

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "dropmask"
DOC = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `([^`]+)` \|", re.M)

# A module's source and whether it is a package's ``__init__.py``.
Sources = Mapping[str, tuple[str, bool]]


def layer_table(text: str) -> dict[str, int]:
    """``{path under src/dropmask: layer}`` from the page's ``## N. Name`` sections.

    A path ending in ``/`` places every module beneath it that has no row of its own.
    """
    layers: dict[str, int] = {}
    layer = None
    for line in text.splitlines():
        heading = re.match(r"## (\d)\. ", line)
        if heading:
            layer = int(heading.group(1))
        elif line.startswith("## "):
            layer = None
        row = ROW.match(line)
        if row and layer is not None:
            assert row.group(1) not in layers, f"{row.group(1)} has two rows"
            layers[row.group(1)] = layer
    return layers


def module_name(path: str) -> str:
    """``training/_loop.py`` -> ``dropmask.training._loop``; a directory row likewise."""
    parts = path.rstrip("/").removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["dropmask", *parts])


def source_tree() -> Sources:
    """Every module of ``src/dropmask``: its source and whether it is a package."""
    tree = {}
    for path in (SRC / "dropmask").rglob("*.py"):
        relative = path.relative_to(SRC / "dropmask").as_posix()
        tree[module_name(relative)] = (path.read_text(), path.name == "__init__.py")
    return tree


def layer_of(table: Mapping[str, int]) -> dict[str, int]:
    """``{module name: layer}`` for the rows of ``table`` (directory rows as prefixes)."""
    return {module_name(path) + ("." if path.endswith("/") else ""): n for path, n in table.items()}


def find_layer(name: str, layers: Mapping[str, int]) -> int | None:
    if name in layers:
        return layers[name]
    prefixes = [p for p in layers if p.endswith(".") and (name + ".").startswith(p)]
    return layers[max(prefixes, key=len)] if prefixes else None


def imports(name: str, source: str, is_package: bool, modules: Sources) -> set[str]:
    """The modules of ``modules`` that ``source`` imports, wherever the import stands."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            candidates = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:  # `from pkg import name`
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def import_violations(modules: Sources, layers: Mapping[str, int]) -> list[str]:
    """Each import that breaks the rule of docs/architecture.md, as a sentence."""
    broken = []
    for name, (source, is_package) in sorted(modules.items()):
        own = find_layer(name, layers)
        for target in sorted(imports(name, source, is_package, modules)):
            theirs = find_layer(target, layers)
            if own is not None and theirs is not None and theirs > own:
                broken.append(f"{name} (layer {own}) imports {target} (layer {theirs})")
            family, _, leaf = target.rpartition(".")
            inside = name == family or name.startswith(family + ".")
            if leaf.startswith("_") and family != "dropmask" and not inside:
                broken.append(f"{name} imports {target}, a private module of {family}")
    return broken


def test_every_module_has_one_layer_and_every_row_a_module():
    table = layer_table(DOC.read_text())
    assert sorted(set(table.values())) == [1, 2, 3, 4, 5, 6], sorted(set(table.values()))
    layers = layer_of(table)
    modules = source_tree()
    unplaced = sorted(name for name in modules if find_layer(name, layers) is None)
    assert not unplaced, f"add these to docs/architecture.md: {unplaced}"
    missing = sorted(p for p in table if not (SRC / "dropmask" / p).exists())
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def packages() -> list[str]:
    """The folders of ``src/dropmask`` that are packages: each has a README of its modules."""
    return sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def readme_text(package: str) -> str:
    readme = PACKAGE / package / "README.md"
    return readme.read_text() if readme.is_file() else ""


def readme_problems(package: str, readme: str) -> list[str]:
    """What is wrong with ``package``'s README table, as sentences; empty when it holds.

    Each module of the folder (``*.py``) and each package inside it (``name/``) has
    exactly one row; a row that names neither is wrong too.
    """
    folder = PACKAGE / package
    entries = {p.name for p in folder.glob("*.py")}
    entries |= {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}
    rows = ROW.findall(readme)
    problems = [f"{package}/README.md: {e} has no row" for e in sorted(entries - set(rows))]
    problems += [f"{package}/README.md: {r} does not exist" for r in sorted(set(rows) - entries)]
    problems += [
        f"{package}/README.md: {r} has {rows.count(r)} rows"
        for r in sorted(set(rows))
        if rows.count(r) > 1
    ]
    return problems


def test_every_package_has_one_row_here_and_its_modules_none():
    text = DOC.read_text()
    table = layer_table(text)
    for package in packages():
        assert f"{package}/" in table, f"docs/architecture.md: add a row for {package}/"
        readme = f"(../src/dropmask/{package}/README.md)"
        (row,) = [line for line in text.splitlines() if line.startswith(f"| `{package}/` |")]
        assert readme in row, f"docs/architecture.md: {package}/'s row links {readme}"
        said = {
            int(n) for n in re.findall(r"`docs/architecture.md`, layer (\d)", readme_text(package))
        }
        assert said <= {table[f"{package}/"]}, f"{package}/README.md names layer {said}"
    inside = sorted(p for p in table if "/" in p.rstrip("/"))
    assert not inside, f"rows of a package's modules belong in its README: {inside}"


def test_every_module_of_a_package_has_one_row_in_its_readme():
    problems = []
    for package in packages():
        readme = PACKAGE / package / "README.md"
        assert readme.is_file(), f"{package}/ has no README.md"
        problems += readme_problems(package, readme.read_text())
    assert not problems, "\n".join(problems)


def test_the_readme_check_finds_a_missing_row_a_ghost_row_and_a_repeated_row():
    readme = (PACKAGE / "_attention" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `_dense.py` |"))
    assert readme_problems("_attention", readme.replace(row + "\n", "")) == [
        "_attention/README.md: _dense.py has no row"
    ]
    assert readme_problems("_attention", readme + "| `_gone.py` | a module since deleted |\n") == [
        "_attention/README.md: _gone.py does not exist"
    ]
    assert readme_problems("_attention", readme + row + "\n") == [
        "_attention/README.md: _dense.py has 2 rows"
    ]


def test_no_import_reaches_up_a_layer_or_into_another_packages_private_module():
    layers = layer_of(layer_table(DOC.read_text()))
    assert import_violations(source_tree(), layers) == []


def test_the_check_finds_a_planted_upward_import_at_any_depth():
    layers = layer_of(layer_table(DOC.read_text()))
    modules = dict(source_tree())
    source, is_package = modules["dropmask._dropout"]
    planted = {
        "module level": "from .training import TrainState\n",
        "in a function": "def f():\n    from .linen import Dropout\n    return Dropout\n",
        "type checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    import dropmask.audit\n",
    }
    expected = {
        "module level": "dropmask._dropout (layer 3) imports dropmask.training (layer 6)",
        "in a function": "dropmask._dropout (layer 3) imports dropmask.linen (layer 4)",
        "type checking": "dropmask._dropout (layer 3) imports dropmask.audit (layer 6)",
    }
    for where, line in planted.items():
        modules["dropmask._dropout"] = (source + line, is_package)
        assert import_violations(modules, layers) == [expected[where]], where


def test_the_check_finds_a_planted_reach_into_another_packages_private_module():
    layers = layer_of(layer_table(DOC.read_text()))
    modules = dict(source_tree())
    source, is_package = modules["dropmask.audit._target"]
    modules["dropmask.audit._target"] = (
        source + "def f():\n    from ..training._loop import train\n    return train\n",
        is_package,
    )
    assert import_violations(modules, layers) == [
        "dropmask.audit._target imports dropmask.training._loop, a private module of "
        "dropmask.training"
    ]
