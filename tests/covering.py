"""A parametrization's covering set for the fast suite, the rest under ``slow``.

``make test`` runs the cases named fast; ``make test-slow`` (and CI) runs the others. A
case belongs in the fast set when no other fast case exercises what it does; each call
site says what its fast cases cover. Most of these tests run Pallas kernels in the TPU
interpreter or compile a model, so each case is a compilation of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest


def covering(cases: Iterable[Any], fast: Iterable[Any], *, unpack: bool = False) -> list[Any]:
    """``cases`` as ``pytest.mark.parametrize`` values, those not in ``fast`` marked slow.

    ``unpack``: each case is a tuple of several arguments' values (a parametrization of
    several names). Raises ``ValueError`` when ``fast`` names a case that ``cases`` lacks
    (a renamed case would otherwise leave the fast suite silently).
    """
    cases = list(cases)
    fast = list(fast)
    missing = [f for f in fast if f not in cases]
    if missing:
        raise ValueError(f"covering: fast cases {missing!r} are not among {cases!r}")
    slow = pytest.mark.slow
    return [
        c if c in fast else pytest.param(*c, marks=slow) if unpack else pytest.param(c, marks=slow)
        for c in cases
    ]
