"""Benchmarks reach dropmask's internals only through ``dropmask.testing``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"\bdropmask\._|from dropmask import _|from dropmask\.\w+ import _")


@pytest.mark.parametrize(
    "path", sorted(BENCHMARKS.rglob("*.py")), ids=lambda p: str(p.relative_to(BENCHMARKS))
)
def test_no_private_dropmask_names(path: Path) -> None:
    hits = [
        f"{path.name}:{i}: {line.strip()}"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line) and path.name != "test_public_api_only.py"
    ]
    assert not hits, "use dropmask.testing instead of private modules:\n" + "\n".join(hits)
