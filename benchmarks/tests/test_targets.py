"""The target table's verdicts: median against the bound, spread, failed checks."""

from __future__ import annotations

import jax
import pytest
from benchmarks import targets
from benchmarks.targets import Target


def test_median_decides_and_straddling_quartiles_say_within_noise() -> None:
    t = Target("t", 1.9, True, [1.7, 1.8, 1.85, 1.95, 2.0])
    s = t.summary()
    assert (s["status"], s["noise"]) == ("PASS", True)
    assert t.row()["status"] == "PASS (within noise)"


def test_clear_miss_is_a_plain_fail() -> None:
    t = Target("speedup", 8.0, False, [5.0, 5.5, 6.0])
    assert t.row()["status"] == "FAIL"
    assert targets.failed([t]) == ["speedup"]


def test_failed_output_check_fails_a_fast_contestant() -> None:
    t = Target("speedup", 8.0, False, [20.0, 21.0, 22.0], extra_check=False)
    row = t.row()
    assert row["status"] == "FAIL"
    assert "output check failed" in row["note"]


def test_single_measurement_has_no_spread() -> None:
    row = Target("residual", 0.13, True, [0.125], unit=" B/element").row()
    assert row["measured"] == "0.125 B/element"
    assert row["status"] == "PASS"


def test_no_finite_value_fails() -> None:
    assert Target("ratio", 0.1, True, [float("nan")]).row()["status"] == "FAIL"


def test_bound_for_another_backend_is_not_judged() -> None:
    other = "gpu" if jax.default_backend() != "gpu" else "cpu"
    t = Target("bandwidth", 0.85, False, [0.1, 0.2, 0.3], backend_only=other)
    assert t.row()["status"] == "n/a"
    assert targets.failed([t]) == []


def test_percent_formatting() -> None:
    row = Target("share", 0.04, True, [0.02, 0.03, 0.035], unit="%", scale=100).row()
    assert row["target"] == "share <= 4%"
    assert row["measured"].startswith("3%")


def test_markdown_has_one_row_per_target() -> None:
    ts = [Target("a", 1.0, True, [0.5]), Target("b", 1.0, True, [2.0])]
    text = targets.markdown(ts, targets.QUICK)
    assert "| a <= 1x | 0.5x | PASS |" in text
    assert "| b <= 1x | 2x | FAIL |" in text


@pytest.mark.parametrize("size", [targets.FULL, targets.QUICK])
def test_sizes_match_the_issue(size: targets.Size) -> None:
    if not size.quick:
        assert size.dropout_shape == (4096, 4096)
        assert size.step["batch"] == 16 and size.step["heads"] == 8
        assert size.step["mlp_dim"] == 1024
        long = size.long
        assert (long["batch"], long["length"], long["width"], long["heads"]) == (2, 4096, 256, 8)
        assert size.longest == 16384
        assert size.growth == (1024, 4096)
    assert size.flax_pairs >= 3 and size.limit_pairs >= 5
    assert size.long["repeats"] >= 3


def test_discarded_repeats_are_counted_not_judged() -> None:
    row = Target("ratio", 1.9, True, [1.5, float("nan"), 1.6, 1.7]).row()
    assert row["status"] == "PASS"
    assert "3 pairs, 1 discarded" in row["measured"]


@pytest.mark.slow  # a few minutes, mostly compiling; `make bench-test BENCH_TEST_FLAGS=`
def test_whole_suite_at_a_tiny_size_with_the_gpu_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs every measurement path, the GPU-only rows included (their bounds are not
    # judged here: the backend is really the CPU), at sizes that take seconds.
    from benchmarks import _contestants

    monkeypatch.setattr(_contestants, "DTYPES", {"f32": _contestants.DTYPES["f32"]})
    on_gpu = {"value": True}
    monkeypatch.setattr(targets, "_on_gpu", lambda: on_gpu["value"])
    tiny = targets.Size(
        (64, 256),
        limit_pairs=3,
        flax_pairs=3,
        step={
            "batch": 1,
            "length": 8,
            "width": 16,
            "heads": 2,
            "mlp_dim": 32,
            "repeats": 3,
            "extra": 40,
        },
        long={"batch": 1, "length": 64, "width": 16, "heads": 2, "mlp_dim": 32, "repeats": 3},
        longest=128,
        growth=(64, 128),
        quick=True,
        layer_drop={"batch": 4, "width": 16, "layers": 2},
        tokens={"batch": 2, "length": 16, "width": 8},
        compile={
            "layers": (1,),
            "apis": ("linen", "nnx"),
            "repeats": 1,
            "scan_layers": 2,
            "examples": ("digits",),
        },
    )
    measured, compile_table = targets.run(tiny)
    names = [t.name for t in measured]
    assert sum("speedup over flax" in n for n in names) == 2
    assert sum(n.startswith("GPU ") for n in names) == 3  # fwd, fwd+bwd, train step
    assert sum("residual" in n for n in names) == 1
    # time, memory, GPU; Flax-style code swapped: time, memory
    assert sum("Transformer step" in n for n in names) == 5
    assert sum("nn.scan-ned" in n for n in names) == 2  # time, memory
    assert sum("causal, attention dropout" in n for n in names) == 3  # time, memory, 128
    assert sum("fwd+bwd temporaries" in n for n in names) == 1
    assert sum("LayerDrop 0.5 / rate 0" in n or "token dropping 0.5" in n for n in names) == 2
    assert sum("compile time" in n for n in names) == 4  # layers, + attention; Linen, NNX
    assert sum("trace+lower" in n for n in names) == 2
    assert "nn.scan" in compile_table and "nn.remat" in compile_table
    assert "| digits |" in compile_table
    for t in measured:
        row = t.row()
        assert row["status"].split()[0] in ("PASS", "FAIL", "n/a"), row
        if t.extra_check is not None:
            assert t.extra_check, row  # every timed dropout output looked like dropout
