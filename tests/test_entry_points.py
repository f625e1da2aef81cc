"""Every ``python -m`` entry point of the package and its examples, and every ``dropmask``
subcommand, answers a user's mistake in one line on stderr with a non-zero exit, before
writing anything: a missing path, a number out of range, NaN.

Each runs in-process as ``python -m`` runs it (``runpy`` with ``__name__ ==
"__main__"``), from an empty working directory that must stay empty. A mistake that an
entry point cannot be given (a path to one that takes none) is left out of its row.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import runpy
import sys
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MISSING = "no/such/dir"  # relative to the empty working directory
TRAIN = {
    "missing path": ["--resume", f"--workdir={MISSING}"],
    "out of range": ["--rate", "1.5"],
    "nan": ["--rate", "nan"],
}
# module run with ``python -m``: {mistake: argv}
ENTRY_POINTS: dict[str, dict[str, list[str]]] = {
    "dropmask.cli": {
        **{f"train {k}": ["train", "digits", *v] for k, v in TRAIN.items()},
        "audit missing path": ["audit", MISSING],
        "audit unknown flag": ["audit", "digits", "--steps=3"],
        "why out of range": ["why", "--size", "0"],
        "why nan": ["why", "--repeats", "nan"],
        "no command": [],
    },
    **{
        module: TRAIN
        for module in (
            "dropmask.examples.digits.train",
            "dropmask.examples.digits_nnx.train",
            "examples.seq2seq.train",
            "examples.sst2.train",
            "examples.translate.train",
            "examples.lm.train",
        )
    },
    "dropmask.examples.digits.ood": {
        "missing path": ["--workdir", MISSING],
        "out of range": ["--workdir", MISSING, "--samples", "0"],
        "nan": ["--workdir", MISSING, "--samples", "nan"],
    },
    "examples.translate.prune": {
        "missing path": ["--workdir", MISSING],
        "out of range": ["--workdir", MISSING, "--rate", "1.5"],
        "nan": ["--workdir", MISSING, "--rate", "nan"],
    },
    "examples.lm.sample": {
        "missing path": ["--workdir", MISSING, "--prompt", "a"],
        "out of range": ["--workdir", MISSING, "--prompt", "a", "--length", "0"],
        "nan": ["--workdir", MISSING, "--prompt", "a", "--temperature", "nan"],
    },
    "examples.lm.memory": {
        "out of range": ["--context", "0"],
        "nan": ["--batch-size", "nan"],
    },
    "examples.lm.token_speed": {
        "out of range": ["--token-drop", "1.5"],
        "nan": ["--token-drop", "nan"],
    },
}
CASES = [(module, mistake) for module, rows in ENTRY_POINTS.items() for mistake in rows]


def _modules_with_a_main() -> set[str]:
    found = set()
    for top in ("src", "examples"):
        for path in (ROOT / top).rglob("*.py"):
            if re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M):
                parts = path.relative_to(ROOT / "src" if top == "src" else ROOT).with_suffix("")
                found.add(".".join(parts.parts))
    return found


def test_every_entry_point_is_tested():
    assert _modules_with_a_main() == set(ENTRY_POINTS)


def _run(module: str, argv: list[str]) -> tuple[object, str, str]:
    """``(exit status, stdout, stderr)`` of ``python -m module *argv``, in-process."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = [module, *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with warnings.catch_warnings():
                # runpy warns that the module is already imported (it runs it again).
                warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        status: object = 0
    except SystemExit as exit_:
        status = exit_.code
    finally:
        sys.argv = saved
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("module", "mistake"), CASES, ids=[f"{m}: {k}" for m, k in CASES])
def test_a_mistake_is_one_line_and_a_nonzero_exit_before_anything_is_written(
    module, mistake, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    status, _, err = _run(module, ENTRY_POINTS[module][mistake])
    lines = err.strip().splitlines()
    assert status not in (0, None), (status, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(r"error|must|no finished run", lines[0]), lines[0]
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
