"""What dense attention keeps for its backward pass: the weights, and nothing else as large.

The NaN-safe path (masked softmax, non-finite inputs zeroed and flagged) must cost no
more memory than plain attention: one ``[batch, heads, q, k]`` array saved for the
backward pass, and no copies of the ``q``, ``k``, ``v`` gradients in the compiled step.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dropmask as dm

B, T, H, D = 2, 16, 2, 8


def _weights_sized_residuals(dtype, **kwargs):
    """Leaves of ``jax.vjp``'s closure as large as the weights (or larger)."""
    s = jax.ShapeDtypeStruct((B, T, H, D), dtype)

    def closure(q, k, v):
        return jax.vjp(lambda q, k, v: dm.dot_product_attention(q, k, v, **kwargs), q, k, v)[1]

    leaves = jax.tree_util.tree_leaves(jax.eval_shape(closure, s, s, s))
    return [(str(x.dtype), x.shape) for x in leaves if math.prod(x.shape) >= B * H * T * T]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"is_causal": True},
        {"mask": np.tril(np.ones((T, T), bool))[None, None]},
        {"mask": np.ones((B, 1, T, T), bool), "bias": np.zeros((1, H, T, T), np.float32)},
    ],
    ids=["plain", "causal", "mask", "mask_bias"],
)
def test_backward_keeps_only_the_weights(kwargs):
    # One f32 array of the weights' shape: no mask broadcast to it, no zeros
    # instantiated for a where's unused branch.
    assert _weights_sized_residuals(jnp.float32, **kwargs) == [("float32", (B, H, T, T))]


def test_backward_in_bf16_keeps_the_f32_weights_and_their_bf16_copy():
    # The softmax's backward reads the f32 weights; the values einsum's reads the
    # bf16 ones it multiplied.
    got = sorted(_weights_sized_residuals(jnp.bfloat16))
    assert got == [("bfloat16", (B, H, T, T)), ("float32", (B, H, T, T))]


def _plain_attention(q, k, v):
    """Attention without masks or NaN safety: the memory floor."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q / jnp.sqrt(q.shape[-1]).astype(q.dtype), k)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits), v)


def _layer_temp_bytes(attention):
    """XLA's temporaries for the gradient of a projection followed by attention."""
    b, t, w, h = 4, 64, 64, 4
    x = jax.ShapeDtypeStruct((b, t, w), jnp.float32)
    kernel = jax.ShapeDtypeStruct((w, 3, h, w // h), jnp.float32)

    def loss(kernel, x):
        q, k, v = jnp.einsum("btw,wjhd->jbthd", x, kernel)
        return jnp.sum(jnp.square(attention(q, k, v)))

    analysis = jax.jit(jax.grad(loss)).lower(kernel, x).compile().memory_analysis()
    assert analysis is not None, "this backend reports no memory analysis"
    return analysis.temp_size_in_bytes


def test_compiled_gradient_needs_no_more_temporaries_than_plain_attention():
    # Zeroing non-finite q, k, v with a where would make XLA write each of their
    # gradients twice (the einsum's output and the where's); the NaN-safe path must
    # fit in plain attention's temporaries.
    ours = _layer_temp_bytes(dm.dot_product_attention)
    plain = _layer_temp_bytes(_plain_attention)
    assert ours <= plain, (ours, plain)


def test_forward_mode_matches_plain_attention():
    # The custom derivatives (softmax, zeroing non-finite inputs) hold in jvp too.
    rng = np.random.default_rng(0)
    q, k, v, tq, tk, tv = (
        jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32) for _ in range(6)
    )
    _, ours = jax.jvp(dm.dot_product_attention, (q, k, v), (tq, tk, tv))
    _, want = jax.jvp(_plain_attention, (q, k, v), (tq, tk, tv))
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)
