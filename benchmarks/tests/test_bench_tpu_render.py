"""The TPU results renderer reports what was measured against its targets."""

from benchmarks.bench_tpu import DEFAULT, KERNEL, render


def _payload(kernel_ms: float) -> dict:
    per_call = []
    for dtype in ("float32", "bfloat16"):
        for name, ms in [("x * c", 1.0), (DEFAULT, 3.0), (KERNEL, kernel_ms)]:
            per_call.append({"dtype": dtype, "name": name, "forward_ms": ms, "fwd_bwd_ms": ms})
        for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
            per_call.append(
                {"dtype": dtype, "name": f"flax {impl}", "forward_ms": 2.0, "fwd_bwd_ms": 2.0}
            )
    return {
        "environment": {
            "date_utc": "2026-01-01T00:00:00Z",
            "cpu_model": "test",
            "cpu_count": 1,
            "cpus_usable": 1,
            "load_average_at_start": [0.0, 0.0, 0.0],
            "device": "tpu: test",
            "jax": "0",
            "jaxlib": "0",
            "flax": "0",
            "equinox": "0",
            "haiku": "0",
            "optax": "0",
            "dropmask": "0",
            "git_commit": "abc",
            "python": "3",
            "xla_flags": "",
            "command": "python -m benchmarks.bench_tpu",
        },
        "checks": {"case a": {"default": True, "kernel": False}},
        "per_call": per_call,
        "step": [
            {
                "dtype": "float32",
                "name": "no dropout",
                "step_ms": 10.0,
                "compile_s": 5.0,
                "temp_mib": 1.0,
            },
            {
                "dtype": "float32",
                "name": "flax dropout",
                "step_ms": None,
                "compile_s": 9.0,
                "temp_mib": 2.0,
            },
        ],
        "notes": ["a note"],
    }


def test_targets_are_met_or_missed_by_the_measured_ratio():
    met = render(_payload(kernel_ms=1.2))
    assert f"| float32 | {KERNEL} | 1.200 | 1.20 | 0.60 |" in met
    assert "fwd <= 1.25x: met, fwd+bwd <= 1.3x: met" in met
    missed = render(_payload(kernel_ms=1.4))
    assert "fwd <= 1.25x: missed, fwd+bwd <= 1.3x: missed" in missed


def test_checks_steps_and_notes_are_reported():
    md = render(_payload(kernel_ms=1.2))
    assert "Checks (default path): 1 of 1 outputs equal" in md
    assert (
        "Checks (kernel path): 0 of 1 outputs equal a CPU process's bit for bit; differ: case a"
        in md
    )
    assert "| float32 | flax dropout | - | - | 2 | 9.0 | 4.0 |" in md
    assert "a note" in md
