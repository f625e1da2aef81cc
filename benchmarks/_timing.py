"""Timing helpers shared by the benchmarks: compile once, then median of repeats."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
    cases: Mapping[Any, tuple[Callable[..., Any], Sequence[Any]]],
    *,
    repeats: int = 7,
    warmup: int = 2,
) -> dict[Any, float]:
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
    times: dict[Any, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (fn, args) in cases.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


@dataclass(frozen=True)
class Looped:
    """One contestant as loops of passes inside one jit, at two lengths.

    ``make(passes)`` returns a jitted function of ``*args`` running ``passes`` passes;
    ``short`` passes and ``short + extra`` passes are timed, and the per-pass time is
    the difference over ``extra``: whatever a call pays once (copying the input into
    the loop, page-faulting a fresh output: tens of ms for 64 MiB on this CPU) cancels,
    so a slow kernel cannot hide behind a large fixed cost.
    """

    make: Callable[[int], Callable[..., Any]]
    args: Sequence[Any]
    extra: int
    short: int = 2

    @functools.cached_property
    def short_fn(self) -> Callable[..., Any]:
        return self.make(self.short)

    @functools.cached_property
    def long_fn(self) -> Callable[..., Any]:
        return self.make(self.short + self.extra)


def looped(
    make: Callable[[int], Callable[..., Any]],
    args: Sequence[Any],
    *,
    extra_seconds: float = 0.25,
    min_extra: int = 8,
    max_extra: int = 512,
) -> Looped:
    """A :class:`Looped` whose extra passes take about ``extra_seconds``.

    A probe times loops of 2 and 10 passes to estimate the per-pass time; cheap
    kernels get many extra passes (so their difference clears the per-call noise),
    slow ones few (so the run stays short). Clamped to ``[min_extra, max_extra]``.
    """
    probe = Looped(make, args, extra=min_extra)
    for fn in (probe.short_fn, probe.long_fn):
        jax.block_until_ready(fn(*args))
    short = min(_timed(probe.short_fn, args) for _ in range(2))
    long = min(_timed(probe.long_fn, args) for _ in range(2))
    per_pass = (long - short) / min_extra
    extra = max_extra if per_pass <= 0 else round(extra_seconds / per_pass)
    extra = max(min_extra, min(max_extra, extra))
    if extra == min_extra:
        return probe
    return Looped(make, args, extra=extra)


def per_pass_medians(
    loops: Mapping[str, Looped], *, repeats: int = 7, warmup: int = 2
) -> dict[str, float]:
    """Seconds per pass of each loop: ``(median(long) - median(short)) / extra``, with
    all loops timed round-robin (see :func:`interleaved_medians`)."""
    cases = {}
    for name, loop in loops.items():
        cases[(name, "short")] = (loop.short_fn, loop.args)
        cases[(name, "long")] = (loop.long_fn, loop.args)
    medians = interleaved_medians(cases, repeats=repeats, warmup=warmup)
    return {
        name: _positive_slope(medians[(name, "long")] - medians[(name, "short")], name) / loop.extra
        for name, loop in loops.items()
    }


def paired_per_pass_ratios(
    numerator: Looped, denominator: Looped, *, repeats: int = 21, warmup: int = 2
) -> list[float]:
    """Per-pass time ratios numerator / denominator, one per repeat.

    The four calls of a repeat (both loops of both sides) run back to back, in an order
    that alternates between repeats, so that load drifting on a shared machine cancels
    in each ratio, and per-call fixed costs cancel in each difference (see
    :class:`Looped`).
    """
    calls = [
        (numerator.short_fn, numerator.args),
        (numerator.long_fn, numerator.args),
        (denominator.short_fn, denominator.args),
        (denominator.long_fn, denominator.args),
    ]
    for fn, args in calls:
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    ratios = []
    for i in range(repeats):
        t = [0.0] * 4
        for j in range(4) if i % 2 == 0 else reversed(range(4)):
            t[j] = _timed(*calls[j])
        num = _positive_slope(t[1] - t[0], "numerator") / numerator.extra
        ratios.append(num / (_positive_slope(t[3] - t[2], "denominator") / denominator.extra))
    return ratios


def _timed(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


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
