"""Timing helpers shared by the benchmarks: compile once, then median of repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax


def median_seconds(fn: Callable[..., Any], *args: Any, repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn(*args)`` with outputs blocked on; ``fn`` should be jitted."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(
    cases: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]],
    *,
    repeats: int = 7,
    warmup: int = 2,
) -> dict[str, float]:
    """Median wall time of each ``fn(*args)`` in ``cases``, timed round-robin.

    On a shared machine the background load drifts during a run; timing the
    contestants in turn within every repeat spreads that drift over all of them
    instead of penalising whichever happened to run during a busy spell.

    Args:
      cases: name -> (jitted fn, args). Every fn is compiled and run ``warmup`` times
        before any timing.
      repeats: timed calls per case; the median is reported.
      warmup: untimed calls per case.

    Returns:
      name -> median seconds.
    """
    for fn, args in cases.values():
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (fn, args) in cases.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}
