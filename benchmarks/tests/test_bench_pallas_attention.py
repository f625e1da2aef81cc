"""The Pallas attention benchmark refuses a CPU in one line, and its helpers work."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from benchmarks import bench_pallas_attention as bench


def test_refuses_a_cpu_in_one_line_and_exits_0(capsys):
    assert jax.default_backend() == "cpu"
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "needs a GPU" in out
    assert bench.gpu_refusal("gpu") is None


def test_rows_and_target_from_paired_seconds():
    seconds = {
        bench.OURS: [1.2e-3, 1.1e-3, math.nan],
        bench.JAX_MHA: [1.0e-3, 1.0e-3, 1.0e-3],
    }
    rows = {r["name"]: r for r in bench.rows(seconds, bench.JAX_MHA)}
    assert rows[bench.OURS]["ratio"] == np.median([1.2, 1.1])
    assert rows[bench.JAX_MHA]["ratio"] == 1.0
    assert "= 1.15 (not met)" in bench.target_line(seconds)
    assert "(met)" in bench.target_line({**seconds, bench.OURS: [1.05e-3] * 3})
    assert "not available" in bench.target_line({bench.OURS: [1e-3]})


def test_contestants_compute_attention_and_loop():
    """Our contestants run (in interpret mode here); a looped pass feeds the next."""
    attend = bench.contestants(causal=True, depth=8)
    assert {bench.OURS, bench.OURS_NO_DROPOUT, bench.DENSE} <= set(attend)
    data = bench.inputs(1, 32, 2, 8, jnp.float32)
    diffs = bench.check({bench.OURS_NO_DROPOUT: attend[bench.OURS_NO_DROPOUT]}, data, True)
    assert diffs[bench.OURS_NO_DROPOUT] < 1e-5
    q, k, v = bench.looped_passes(attend[bench.OURS], 2)(*data)
    np.testing.assert_array_equal(q, data[0])
