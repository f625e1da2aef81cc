"""The GPU results renderer reports what was measured, failures included."""

from benchmarks.bench_gpu import render


def _payload(ok: bool) -> dict:
    return {
        "peak_gbps": 4800.0,
        "environment": {
            "date_utc": "2026-01-01T00:00:00Z",
            "device": "gpu: test",
            "nvidia_smi": "",
            "jax": "0",
            "flax": "0",
            "equinox": "0",
            "haiku": "not installed",
            "python": "3",
        },
        "annotations": ["a note"],
        "checks": [{"check": "GPU == CPU", "ok": ok, "gradient": ok}],
        "speed": [
            {
                "shape": [8, 8],
                "dtype": "f32",
                "mode": "fwd",
                "contestant": "dm",
                "us_per_pass": 2.0,
                "ratio_to_limit": 2.0,
                "ideal_gbps": 1.0,
                "frac_of_peak": 0.5,
                "drop_frac": 0.1,
                "ok": ok,
            }
        ],
        "memory": [],
        "errors": [] if ok else ["speed (8, 8): Traceback\nValueError"],
        "skipped": [] if ok else ["speed (16, 16) f32 fwd"],
    }


def test_render_lists_checks_rows_and_notes():
    md = render(_payload(ok=True))
    assert "- a note" in md
    assert "- ok: GPU == CPU" in md
    assert "| dm | 2.0 | 2.00 | 1 | 0.50 | 10.00 | ok |" in md
    assert "FAILED" not in md and "Skipped" not in md


def test_render_shows_failures_skips_and_errors():
    md = render(_payload(ok=False))
    assert "- FAILED: GPU == CPU" in md
    assert "| FAILED |" in md
    assert "Skipped (time budget): speed (16, 16) f32 fwd" in md
    assert "1 errors" in md and "- speed (8, 8): Traceback" in md
