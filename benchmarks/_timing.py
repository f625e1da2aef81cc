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


def per_pass_medians(
    short: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]],
    long: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]],
    extra_passes: int,
    *,
    repeats: int = 7,
    warmup: int = 2,
) -> dict[str, float]:
    """Seconds per pass of each looped case: ``(median(long) - median(short)) / extra_passes``.

    ``short[name]`` and ``long[name]`` run the same loop with ``extra_passes`` more
    passes in ``long``. Whatever a call pays once (copying the input into the loop,
    page-faulting a freshly allocated output: tens of ms for 64 MiB on CPU) cancels in
    the difference, so a slow kernel cannot hide behind a large fixed cost. All cases
    are timed round-robin (see :func:`interleaved_medians`).
    """
    cases = {("short", k): v for k, v in short.items()} | {("long", k): v for k, v in long.items()}
    medians = interleaved_medians(cases, repeats=repeats, warmup=warmup)
    return {
        name: _positive_slope(medians[("long", name)] - medians[("short", name)], name)
        / extra_passes
        for name in short
    }


def paired_per_pass_ratios(
    numerator: tuple[tuple[Callable[..., Any], Callable[..., Any]], Sequence[Any]],
    denominator: tuple[tuple[Callable[..., Any], Callable[..., Any]], Sequence[Any]],
    *,
    repeats: int = 21,
    warmup: int = 2,
) -> list[float]:
    """Per-pass time ratios, one per repeat: ``(num_long - num_short) / (den_long - den_short)``.

    Each side is ``((short_fn, long_fn), args)``: the same loop with fewer and more
    passes (the same number more on both sides). The four calls of a repeat run back
    to back, in an order that alternates between repeats, so that load drifting on a
    shared machine cancels in each ratio, and per-call fixed costs cancel in each
    difference (see :func:`per_pass_medians`).
    """
    calls = [(fn, numerator[1]) for fn in numerator[0]]
    calls += [(fn, denominator[1]) for fn in denominator[0]]
    for fn, args in calls:
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))

    def timed(fn: Callable[..., Any], args: Sequence[Any]) -> float:
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        return time.perf_counter() - start

    ratios = []
    for i in range(repeats):
        order = range(4) if i % 2 == 0 else reversed(range(4))
        t = [0.0] * 4
        for j in order:
            t[j] = timed(*calls[j])
        num = _positive_slope(t[1] - t[0], "numerator")
        ratios.append(num / _positive_slope(t[3] - t[2], "denominator"))
    return ratios


def _positive_slope(seconds: float, name: Any) -> float:
    if seconds <= 0:
        raise RuntimeError(
            f"{name}: the longer loop was not slower than the shorter one "
            f"({seconds * 1e3:.3f} ms); add passes so the difference clears the noise."
        )
    return seconds


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile)."""
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3
