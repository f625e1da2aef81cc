"""The benchmark's per-pass timing arithmetic, on a fake clock (nothing here is timed)."""

from __future__ import annotations

import math

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


def test_paired_seconds_give_every_loop_one_value_per_repeat(clock):
    loops = {
        "a": common.Looped(fake_loop(clock, 0.010, 0.002), (), extra=4),
        "b": common.Looped(fake_loop(clock, 0.050, 0.005), (), extra=2),
    }
    seconds = common.paired_per_pass_seconds(loops, repeats=4)
    assert seconds["a"] == pytest.approx([0.002] * 4)
    assert seconds["b"] == pytest.approx([0.005] * 4)


def test_write_section_replaces_appends_and_puts_first(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# title\n\nold text\n")
    common.write_section(path, "a", "one")
    common.write_section(path, "b", "two", first=True)
    common.write_section(path, "a", "three")
    text = path.read_text()
    assert text.index("<!-- b:begin -->") < text.index("old text") < text.index("three")
    assert "one" not in text and text.startswith("# title\n")


def test_apart_vjp_has_a_barrier_and_the_plain_vjps_values():
    import jax
    import jax.numpy as jnp
    import numpy as np

    ours = common.contestants(full=False)[0][0]
    x, g = common.inputs((8, 64), jnp.float32)
    key = ours.make_aux(jnp.float32)
    y, dx = common.fwd_bwd_fn(ours)(x, key, g)
    want_y, vjp_fn = jax.vjp(lambda x: ours.apply(x, key), x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want_y))
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(vjp_fn(g)[0]))
    lowered = common.fwd_bwd_fn(ours).lower(x, key, g).as_text()
    assert "optimization_barrier" in lowered


def test_outputs_are_checked_for_dropout():
    import jax.numpy as jnp

    ours, _, limit = common.contestants(full=False)[0]
    assert common.checked(ours, (256, 256), "f32", "fwd+bwd")["ok"]
    assert common.checked(limit, (256, 256), "f32", "fwd")["ok"] is None
    x, g = common.inputs((256, 256), jnp.float32)
    assert not common.check_output(x, x, None, None)["ok"]  # nothing dropped


def test_generator_loop_xors_the_packed_words():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dropmask import testing

    key = jax.random.key(5)
    got = common.looped_mask_words((4, 64), 2)(jnp.zeros(()), key)
    want = np.bitwise_xor(
        *(
            np.asarray(testing.packed_mask_words(jax.random.fold_in(key, i), (4, 64), 0.1))
            for i in range(2)
        )
    )
    np.testing.assert_array_equal(np.asarray(got), want)


def test_one_burst_of_load_discards_a_repeat_not_the_run(clock):
    calls = {"n": 0}

    def make(passes: int):
        def run() -> None:
            calls["n"] += 1
            # The first short run of the first repeat is hit by a 1 s burst.
            burst = 1.0 if calls["n"] == 3 and passes == 2 else 0.0
            clock.now += 0.01 + passes * 0.002 + burst

        return run

    seconds = common.paired_per_pass_seconds(
        {"a": common.Looped(make, (), extra=4)}, repeats=3, warmup=1
    )
    assert math.isnan(seconds["a"][0])
    assert seconds["a"][1:] == pytest.approx([0.002, 0.002])
    assert common.quartiles(seconds["a"]) == pytest.approx((0.002, 0.002, 0.002))


def test_a_loop_that_never_grows_is_still_an_error(clock):
    flat = common.Looped(fake_loop(clock, 0.030, 0.0), (), extra=8)
    with pytest.raises(RuntimeError, match="not slower"):
        common.paired_per_pass_seconds({"flat": flat}, repeats=3)


def test_residuals_name_what_grows_with_the_input():
    import jax.numpy as jnp

    by_name = {c.name: c for c in common.contestants()[0]}
    ours = common.residuals(by_name[common.dropmask_name()], jnp.float32)
    assert ours["residual_bytes_per_element"] == pytest.approx(0.125)
    assert ours["growing_residuals"] == ["uint8[2048,256]"]  # 1 bit per element, in bytes
    assert ours["residual_bytes_constant"] == pytest.approx(0)  # nothing but the flags
    limit = common.residuals(by_name[common.LIMIT], jnp.float32)
    assert limit["residual_bytes_per_element"] == 0 and limit["growing_residuals"] == []
    for choice in common.residual_choices():
        keyed = common.residuals(by_name[f"dropmask residual={choice!r}"], jnp.float32)
        assert keyed["growing_residuals"] == []
