"""Timing helpers shared by the benchmarks: compile once, then median of repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
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
