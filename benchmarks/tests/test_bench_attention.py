"""The long-sequence contestants compute the same layer; the memory probe measures."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from benchmarks import bench_attention
from benchmarks import bench_transformer_step as step


@pytest.mark.parametrize("causal", [True, False])
def test_flax_and_dropmask_layers_compute_the_same_function(causal: bool) -> None:
    # Flax's layer gets a causal mask array, dropmask's is_causal=True: without
    # dropout both must give the same output from the same parameters.
    x = jax.random.normal(jax.random.key(0), (2, 8, 16))
    layers = {
        lib: step.EncoderLayer(lib, 0.0, 2, 32, x.dtype, causal=causal)
        for lib in (step.FLAX, step.DROPMASK)
    }
    params = layers[step.FLAX].init(jax.random.key(1), x, True)
    flax_out, ours = (np.asarray(layer.apply(params, x, True)) for layer in layers.values())
    np.testing.assert_allclose(ours, flax_out, rtol=1e-5, atol=1e-5)


def test_causal_layer_does_not_see_the_future() -> None:
    x = jax.random.normal(jax.random.key(0), (1, 8, 16))
    later = x.at[:, 5:].set(0.0)
    layer = step.EncoderLayer(step.DROPMASK, 0.0, 2, 32, x.dtype, causal=True)
    params = layer.init(jax.random.key(1), x, True)
    a, b = (np.asarray(layer.apply(params, v, True)) for v in (x, later))
    np.testing.assert_array_equal(a[:, :5], b[:, :5])
    assert not np.allclose(a[:, 5:], b[:, 5:], atol=1e-3)


def test_attention_temp_bytes_grows_with_length() -> None:
    small, large = (bench_attention.attention_temp_bytes(n, heads=2, depth=8) for n in (16, 64))
    assert 0 < small < large


def test_paths_table_has_a_row_per_length_and_path(monkeypatch) -> None:
    # Timing at this size is noise: each contestant gets fixed per-repeat seconds
    # (Flax's 1 s, the paths 2 s), so the table's ratios are known; memory is real.
    def seconds(loops, repeats):
        return {name: [1.0 if name == "flax" else 2.0] * repeats for name in loops}

    monkeypatch.setattr(step, "paired_per_pass_seconds", seconds)
    table = step.profile_paths((16, 32), tokens=64, width=16, heads=2, mlp_dim=16, repeats=2)
    rows = [line for line in table.splitlines() if line.startswith(("| 16 ", "| 32 "))]
    assert len(rows) == 2 * len(step.PATHS), table
    assert all(name in table for name in step.PATHS)
    assert all("| 2.000x (2.000x to 2.000x) |" in row for row in rows), table


def test_layer_takes_the_chosen_algorithm() -> None:
    x = jax.numpy.ones((1, 16, 16))
    dense = step.EncoderLayer(step.DROPMASK, 0.0, 2, 16, jax.numpy.float32, algorithm="dense")
    tiled = step.EncoderLayer(
        step.DROPMASK, 0.0, 2, 16, jax.numpy.float32, algorithm="blockwise", block=8
    )
    params = dense.init(jax.random.key(0), x, True)["params"]
    jaxpr = str(jax.make_jaxpr(lambda p: tiled.apply({"params": p}, x, True))(params))
    assert "custom_vjp_call" in jaxpr
    np.testing.assert_allclose(
        dense.apply({"params": params}, x, True),
        tiled.apply({"params": params}, x, True),
        rtol=1e-5,
        atol=1e-5,
    )
