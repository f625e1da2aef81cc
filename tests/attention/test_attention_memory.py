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
from tests.covering import covering

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


def test_backward_in_bf16_keeps_only_the_bf16_weights():
    # The softmax is computed in f32, but its backward pass widens the bf16 weights
    # the values einsum multiplied instead of keeping an f32 copy beside them.
    assert _weights_sized_residuals(jnp.bfloat16) == [("bfloat16", (B, H, T, T))]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "per_head"])
def test_dropout_keeps_no_dropped_copy_of_the_weights(dtype, broadcast):
    # The dropped weights are recomputed in the backward pass from the weights and
    # the 1-bit mask words; only those two are kept.
    kwargs = {"dropout_rate": 0.1, "dropout_rng": jax.random.key(0), "deterministic": False}
    got = _weights_sized_residuals(dtype, broadcast_dropout=broadcast, **kwargs)
    assert got == [(jnp.dtype(dtype).name, (B, H, T, T))]


# Fast: a static rate without a bias and a run-time rate with one.
@pytest.mark.parametrize(
    ("with_bias", "run_time_rate"),
    covering(
        [(b, r) for b in (False, True) for r in (False, True)],
        [(False, False), (True, True)],
        unpack=True,
    ),
    ids=[f"{b}-{r}" for b in ("", "bias") for r in ("static", "run_time")],
)
def test_dropout_gradient_is_unchanged_by_the_recomputation(run_time_rate, with_bias):
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32) for _ in range(3))
    bias = jnp.asarray(rng.normal(size=(1, H, T, T)), jnp.float32) if with_bias else None
    key = jax.random.key(3)
    rate = jnp.float32(0.2) if run_time_rate else 0.2

    def loss(q, k, v, bias, attention):
        out = attention(q, k, v, bias=bias, dropout_rate=rate, dropout_rng=key, deterministic=False)
        return jnp.sum(jnp.sin(out))

    # The same computation written out: plain softmax, dropmask.dropout on the
    # weights (the key and broadcast dims attention uses), its dropped copy kept.
    def reference(q, k, v, bias, **_):
        logits = jnp.einsum("bqhd,bkhd->bhqk", q / jnp.sqrt(D).astype(q.dtype), k)
        logits = logits if bias is None else logits + bias
        w = dm.dropout(jax.nn.softmax(logits), rate, key, broadcast_dims=(0, 1))
        return jnp.einsum("bhqk,bkhd->bqhd", w, v)

    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
    got = jax.grad(loss, argnums)(q, k, v, bias, dm.dot_product_attention)
    want = jax.grad(loss, argnums)(q, k, v, bias, reference)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_dropout_second_derivative_matches_the_computation_written_out():
    # Reverse over reverse through the dropout rule's own backward pass.
    rng = np.random.default_rng(2)
    q, k, v, u = (jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32) for _ in range(4))
    key = jax.random.key(4)

    def attention(q, k, v):
        return dm.dot_product_attention(q, k, v, dropout_rate=0.2, key=key, deterministic=False)

    def reference(q, k, v):
        logits = jnp.einsum("bqhd,bkhd->bhqk", q / jnp.sqrt(D).astype(q.dtype), k)
        w = dm.dropout(jax.nn.softmax(logits), 0.2, key, broadcast_dims=(0, 1))
        return jnp.einsum("bhqk,bkhd->bqhd", w, v)

    def hvp(f):
        grad_q = jax.grad(lambda q: jnp.sum(jnp.sin(f(q, k, v))))
        return jax.grad(lambda q: jnp.vdot(grad_q(q), u))(q)

    np.testing.assert_allclose(hvp(attention), hvp(reference), rtol=1e-4, atol=1e-5)


def test_forward_mode_with_dropout_on_the_weights_takes_the_flax_generator():
    # The dropout rule is a custom_vjp (its backward pass depends on the cotangent, to
    # hold no dropped copy of the weights): jax.jvp raises with impl="fast" and works
    # with impl="flax", whose rule is the plain one.
    rng = np.random.default_rng(3)
    q, k, v, tq = (jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32) for _ in range(4))
    key = jax.random.key(5)

    def attention(impl):
        return lambda q: dm.dot_product_attention(
            q, k, v, dropout_rate=0.2, key=key, deterministic=False, impl=impl
        )

    with pytest.raises(dm.DropmaskTypeError, match="impl must be 'flax' for forward-mode"):
        jax.jvp(attention("fast"), (q,), (tq,))

    def reference(q):
        logits = jnp.einsum("bqhd,bkhd->bhqk", q / jnp.sqrt(D).astype(q.dtype), k)
        w = dm.dropout(jax.nn.softmax(logits), 0.2, key, broadcast_dims=(0, 1), impl="flax")
        return jnp.einsum("bhqk,bkhd->bqhd", w, v)

    _, got = jax.jvp(attention("flax"), (q,), (tq,))
    _, want = jax.jvp(reference, (q,), (tq,))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dropout_on_the_weights_adds_only_its_mask_words_to_the_gradient():
    # At this size XLA:CPU computed the dropped weights that v's gradient needs in the
    # forward pass and kept them until then: one more f32 [b, h, q, k] array at rate
    # 0.1 than at rate 0 (4 bytes per weight; the packed mask is 1 bit). The dropout
    # rule's backward pass rebuilds them from the cotangent (_dense_dropped).
    b, t, h, d = 1, 1024, 4, 32
    s = jax.ShapeDtypeStruct((b, t, h, d), jnp.float32)

    def temporaries(rate):
        def loss(q, k, v):
            out = dm.dot_product_attention(
                q,
                k,
                v,
                is_causal=True,
                dropout_rate=rate,
                key=jax.random.key(0),
                deterministic=rate == 0,
                algorithm="dense",
            )
            return jnp.sum(out)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        analysis = grad.lower(s, s, s).compile().memory_analysis()
        assert analysis is not None, "this backend reports no memory analysis"
        return analysis.temp_size_in_bytes

    added = temporaries(0.1) - temporaries(0.0)
    assert added <= 0.25 * b * h * t * t, added / (b * h * t * t)


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
    # fit in plain attention's temporaries, give or take one f32 per query row and
    # head and one byte per weight (at this size XLA keeps the softmax's flags of
    # non-finite scores apart; at [16, 8, 256, 256] it fuses them and the step's
    # temporaries grow by 0.13 %); one gradient of q, k or v is four times the weights.
    ours = _layer_temp_bytes(dm.dot_product_attention)
    plain = _layer_temp_bytes(_plain_attention)
    b, t, h = 4, 64, 4
    assert ours <= plain + 4 * b * h * t + b * h * t * t, (ours, plain)


def test_forward_mode_matches_plain_attention():
    # The custom derivatives (softmax, zeroing non-finite inputs) hold in jvp too.
    rng = np.random.default_rng(0)
    q, k, v, tq, tk, tv = (
        jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32) for _ in range(6)
    )
    _, ours = jax.jvp(dm.dot_product_attention, (q, k, v), (tq, tk, tv))
    _, want = jax.jvp(_plain_attention, (q, k, v), (tq, tk, tv))
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_long_causal_gradient_holds_three_arrays_of_the_weights():
    # A causal forward and backward pass at a long sequence peaks at three arrays of
    # the weights' size (the scores, the exponentials, the weights; plain attention
    # holds four). The softmax's check for an overflowed -inf score, done element by
    # element beside the exponentials, kept the scores alive until the weights were
    # written: four arrays. It is a row minimum now (docs/attention.md).
    t, h, d = 512, 2, 16
    s = jax.ShapeDtypeStruct((1, t, h, d), jnp.float32)

    def loss(q, k, v):
        return jnp.sum(jnp.square(dm.dot_product_attention(q, k, v, is_causal=True)))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    analysis = grad.lower(s, s, s).compile().memory_analysis()
    assert analysis is not None, "this backend reports no memory analysis"
    weights = h * t * t * 4
    assert analysis.temp_size_in_bytes <= 3.25 * weights, analysis.temp_size_in_bytes / weights
