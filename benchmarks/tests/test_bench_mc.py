"""The Monte Carlo dropout benchmark: both contestants compute the same samples."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from benchmarks import bench_mc

from dropmask import uncertainty


def test_one_call_draws_the_samples_of_k_single_passes() -> None:
    params = bench_mc._mlp.params(jax.random.key(0), 16, 2, jnp.float32)
    f = bench_mc.forward(params, 2)
    x, key = jnp.ones((4, 16)), jax.random.key(1)
    samples = uncertainty.sample(f, x, key, 3)
    for i in range(3):
        np.testing.assert_allclose(
            samples[i], f(x, jax.random.fold_in(key, i)), rtol=1e-6, atol=1e-6
        )


def test_run_gives_one_positive_ratio_per_repeat() -> None:
    ratios = bench_mc.run(batch=8, width=16, layers=1, samples=4, repeats=3, extra=64)
    assert len(ratios) == 3
    assert all(r > 0 or np.isnan(r) for r in ratios)
