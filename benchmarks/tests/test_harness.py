"""The benchmark's per-pass timing arithmetic, on a fake clock (nothing here is timed)."""

from __future__ import annotations

import math

import pytest
from benchmarks import _harness


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
    monkeypatch.setattr(_harness.time, "perf_counter", fake)
    monkeypatch.setattr(_harness.jax, "block_until_ready", lambda x: x)
    return fake


def test_per_pass_cancels_fixed_cost(clock):
    # A 30 ms fixed cost per call would make a 4-pass loop read 10.5 ms per pass.
    loops = {
        "limit": _harness.Looped(fake_loop(clock, 0.030, 0.003), (), extra=16),
        "ours": _harness.Looped(fake_loop(clock, 0.030, 0.009), (), extra=4),
    }
    per_pass = _harness.per_pass_medians(loops, repeats=3)
    assert per_pass["limit"] == pytest.approx(0.003)
    assert per_pass["ours"] == pytest.approx(0.009)


def test_paired_ratios_use_each_sides_extra_passes(clock):
    ours = _harness.Looped(fake_loop(clock, 0.030, 0.009), (), extra=8)
    limit = _harness.Looped(fake_loop(clock, 0.040, 0.003), (), extra=24)
    ratios = _harness.paired_per_pass_ratios(ours, limit, repeats=5)
    assert ratios == pytest.approx([3.0] * 5)


def test_probe_gives_cheap_kernels_more_passes(clock):
    cheap = _harness.looped(fake_loop(clock, 0.030, 0.001), (), extra_seconds=0.25)
    dear = _harness.looped(fake_loop(clock, 0.030, 0.100), (), extra_seconds=0.25)
    assert cheap.extra == 250
    assert dear.extra == 8  # the floor
    assert _harness.looped(fake_loop(clock, 0.0, 1e-7), (), max_extra=512).extra == 512


def test_a_loop_that_does_not_grow_is_an_error(clock):
    flat = _harness.Looped(fake_loop(clock, 0.030, 0.0), (), extra=8)
    with pytest.raises(RuntimeError, match="not slower"):
        _harness.per_pass_medians({"flat": flat}, repeats=3)


def test_paired_seconds_give_every_loop_one_value_per_repeat(clock):
    loops = {
        "a": _harness.Looped(fake_loop(clock, 0.010, 0.002), (), extra=4),
        "b": _harness.Looped(fake_loop(clock, 0.050, 0.005), (), extra=2),
    }
    seconds = _harness.paired_per_pass_seconds(loops, repeats=4)
    assert seconds["a"] == pytest.approx([0.002] * 4)
    assert seconds["b"] == pytest.approx([0.005] * 4)


def test_write_section_replaces_appends_and_puts_first(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# title\n\nold text\n")
    _harness.write_section(path, "a", "one")
    _harness.write_section(path, "b", "two", first=True)
    _harness.write_section(path, "a", "three")
    text = path.read_text()
    assert text.index("<!-- b:begin -->") < text.index("old text") < text.index("three")
    assert "one" not in text and text.startswith("# title\n")


def test_one_burst_of_load_discards_a_repeat_not_the_run(clock):
    calls = {"n": 0}

    def make(passes: int):
        def run() -> None:
            calls["n"] += 1
            # The first short run of the first repeat is hit by a 1 s burst.
            burst = 1.0 if calls["n"] == 3 and passes == 2 else 0.0
            clock.now += 0.01 + passes * 0.002 + burst

        return run

    seconds = _harness.paired_per_pass_seconds(
        {"a": _harness.Looped(make, (), extra=4)}, repeats=3, warmup=1
    )
    assert math.isnan(seconds["a"][0])
    assert seconds["a"][1:] == pytest.approx([0.002, 0.002])
    assert _harness.quartiles(seconds["a"]) == pytest.approx((0.002, 0.002, 0.002))


def test_a_loop_that_never_grows_is_still_an_error(clock):
    flat = _harness.Looped(fake_loop(clock, 0.030, 0.0), (), extra=8)
    with pytest.raises(RuntimeError, match="not slower"):
        _harness.paired_per_pass_seconds({"flat": flat}, repeats=3)
