"""Every ```python block of docs/*.md and README.md runs, in order, one namespace per file.

A block written as a doctest (``>>>`` prompts) must also print what it shows; a plain
block must run without error. Blocks of one file share their variables, as a reader
who pastes them one after another would.
"""

from __future__ import annotations

import doctest
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(first line number, source)`` of each python block of ``path``."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def test_the_guide_and_the_readme_have_python_blocks():
    names = {p.name for p in FILES if blocks(p)}
    assert {"guide.md", "masking.md", "README.md"} <= names


# The docs pages run whole workflows (training loops, attention at length, Monte
# Carlo sampling): end to end, so under the slow marker; the README's blocks stay in
# the inner loop.
@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=() if p.name == "README.md" else pytest.mark.slow) for p in FILES],
    ids=[p.name for p in FILES],
)
def test_every_python_block_runs(path):
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    for line, source in blocks(path):
        where = f"{path.name}:{line}"
        if ">>>" in source:
            test = parser.get_doctest(source, namespace, where, str(path), line)
            result = runner.run(test, clear_globs=False)
            namespace.update(test.globs)  # DocTest ran on a copy of the namespace
            assert result.failed == 0, f"doctest block at {where} failed (output above)"
        else:
            # dont_inherit: a block runs as a reader's script would, without this
            # module's `from __future__ import annotations` (dataclass fields of a
            # block's Flax modules would otherwise be strings of an unimported module).
            code = compile(source, where, "exec", dont_inherit=True)
            exec(code, namespace)  # noqa: S102
