"""The benchmark's per-pass timing arithmetic, on a fake clock (nothing here is timed)."""

from __future__ import annotations

import pytest
from benchmarks import _common as common


class FakeClock:
    """``perf_counter`` that only moves when a fake kernel "runs"."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_loop(clock: FakeClock, fixed: float, per_pass: float):
    """``make(passes)`` for a kernel costing ``fixed + passes * per_pass`` seconds a call."""

    def make(passes: int):
        def run() -> None:
            clock.now += fixed + passes * per_pass

        return run

    return make


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(common.time, "perf_counter", fake)
    monkeypatch.setattr(common.jax, "block_until_ready", lambda x: x)
    return fake


def test_per_pass_cancels_fixed_cost(clock):
    # A 30 ms fixed cost per call would make a 4-pass loop read 10.5 ms per pass.
    loops = {
        "limit": common.Looped(fake_loop(clock, 0.030, 0.003), (), extra=16),
        "ours": common.Looped(fake_loop(clock, 0.030, 0.009), (), extra=4),
    }
    per_pass = common.per_pass_medians(loops, repeats=3)
    assert per_pass["limit"] == pytest.approx(0.003)
    assert per_pass["ours"] == pytest.approx(0.009)


def test_paired_ratios_use_each_sides_extra_passes(clock):
    ours = common.Looped(fake_loop(clock, 0.030, 0.009), (), extra=8)
    limit = common.Looped(fake_loop(clock, 0.040, 0.003), (), extra=24)
    ratios = common.paired_per_pass_ratios(ours, limit, repeats=5)
    assert ratios == pytest.approx([3.0] * 5)


def test_probe_gives_cheap_kernels_more_passes(clock):
    cheap = common.looped(fake_loop(clock, 0.030, 0.001), (), extra_seconds=0.25)
    dear = common.looped(fake_loop(clock, 0.030, 0.100), (), extra_seconds=0.25)
    assert cheap.extra == 250
    assert dear.extra == 8  # the floor
    assert common.looped(fake_loop(clock, 0.0, 1e-7), (), max_extra=512).extra == 512


def test_a_loop_that_does_not_grow_is_an_error(clock):
    flat = common.Looped(fake_loop(clock, 0.030, 0.0), (), extra=8)
    with pytest.raises(RuntimeError, match="not slower"):
        common.per_pass_medians({"flat": flat}, repeats=3)
