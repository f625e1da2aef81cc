"""The MLP that the train-step benchmarks share: ``relu`` layers, dropout after each."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Drop = Callable[[jax.Array, jax.Array], jax.Array] | None


def params(key: jax.Array, width: int, layers: int, dtype: Any) -> dict[str, jax.Array]:
    """``layers`` hidden ``[width, width]`` layers and an output layer, biases at 0."""
    keys = jax.random.split(key, layers + 1)
    scale = 1.0 / math.sqrt(width)
    return {
        f"w{i}": (jax.random.normal(k, (width, width)) * scale).astype(dtype)
        for i, k in enumerate(keys)
    } | {f"b{i}": jnp.zeros((width,), dtype) for i in range(layers + 1)}


def loss(drop: Drop, layers: int) -> Callable[..., jax.Array]:
    """``(params, x, y, key) -> mean squared error``, ``drop(h, key_i)`` after each hidden
    layer (none if ``drop`` is None), in f32."""

    def mse(params: dict, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        keys = jax.random.split(key, layers)
        h = x
        for i in range(layers):
            h = jax.nn.relu(h @ params[f"w{i}"] + params[f"b{i}"])
            if drop is not None:
                h = drop(h, keys[i])
        out = h @ params[f"w{layers}"] + params[f"b{layers}"]
        return jnp.mean((out.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)

    return mse
