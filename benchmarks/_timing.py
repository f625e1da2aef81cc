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


def paired_ratios(
    numerator: tuple[Callable[..., Any], Sequence[Any]],
    denominator: tuple[Callable[..., Any], Sequence[Any]],
    *,
    repeats: int = 21,
    warmup: int = 2,
) -> list[float]:
    """``time(numerator) / time(denominator)`` for each of ``repeats`` back-to-back pairs.

    The two calls of a pair run within milliseconds of each other, so load that
    drifts over seconds on a shared machine cancels in each ratio; which one runs
    first alternates between pairs so that neither always gets the warmer cache.
    """
    for fn, args in (numerator, denominator):
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))

    def timed(fn: Callable[..., Any], args: Sequence[Any]) -> float:
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        return time.perf_counter() - start

    ratios = []
    for i in range(repeats):
        if i % 2:
            den = timed(*denominator)
            num = timed(*numerator)
        else:
            num = timed(*numerator)
            den = timed(*denominator)
        ratios.append(num / den)
    return ratios


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile)."""
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3
