"""The LayerDrop and token-dropping benchmarks: the contestants do what they say."""

from __future__ import annotations

import jax
import numpy as np
from benchmarks import bench_structured as bs


def test_layer_drop_contestants_skip_exactly_the_drawn_layers() -> None:
    x = jax.random.normal(jax.random.key(0), (4, 8))
    params = bs.layer_drop_params(8, 3)
    key = jax.random.key(1)
    assert float(bs.layer_drop_step(3, 1.0, x)(params, key)) == 0.0  # every block skipped
    full = float(bs.layer_drop_step(3, 0.0, x)(params, key))
    assert full > 0.0
    keys = jax.random.split(key, 64)
    # One compilation for every key: the step run eagerly retraces the skipped-branch
    # conditionals op by op on each call.
    half = jax.jit(bs.layer_drop_step(3, 0.5, x))
    norms = np.array([float(half(params, k)) for k in keys])
    # Some draws keep every block (the full step, up to the tiny per-step shift of x),
    # some skip every one, and the rest lie between.
    assert np.isclose(norms, full, rtol=1e-2).any() and (norms == 0.0).any()
    assert len(np.unique(np.round(norms, 3))) > 2


def test_token_contestant_trains_on_the_kept_tokens_only() -> None:
    x = jax.random.normal(jax.random.key(0), (2, 16, 8))
    params = bs.token_params(8)
    key = jax.random.key(1)
    half = jax.jit(bs.token_step(0.5, x))(params, key)
    every = jax.jit(bs.token_step(0.0, x))(params, key)
    assert np.isfinite(float(half)) and np.isfinite(float(every)) and float(half) != float(every)


def test_runs_give_one_positive_ratio_per_repeat() -> None:
    layer = bs.run_layer_drop(repeats=3, extra=8, batch=8, width=16, layers=2)
    tokens = bs.run_tokens(repeats=3, extra=8, batch=2, length=16, width=8)
    assert len(layer) == len(tokens) == 3
    assert all(r > 0 or np.isnan(r) for r in layer + tokens)
