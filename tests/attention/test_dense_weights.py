"""The dense path's two softmax branches compute one function; the fast one is the default.

``attention_weights`` picks at run time between a softmax XLA fuses into the scores'
product (``fast``) and the masked softmax that flags non-finite rows element by element
(``safe``), from a bound on the scores computed before they exist. Both must give the
same weights, flags and derivatives for every input the fast one may see, and the
bound must send every input that could make a score NaN or +inf to the safe one.
"""

from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import dropmask as dm
from dropmask._attention import _dense_weights as dw
from dropmask._attention._dot_product import _heads_major_scores

B, T, H, D = 2, 6, 4, 8


def _case(seed, kv_heads=H, masked=True, biased=True, bad=True):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(B, T, kv_heads, D)), jnp.float32)
    groups = H // kv_heads
    allowed = None
    if masked:
        # Causal, one padded key in the first sequence, and one query with no key.
        a = np.tril(np.ones((T, T), bool))[None, None].repeat(B, 0)
        a[0, :, :, T - 1] = False
        a[1, :, 2, :] = False
        allowed = jnp.asarray(a)
    bias = jnp.asarray(rng.normal(size=(1, H, T, T)), jnp.float32) if biased else None
    rows = np.zeros((B, H, T, 1), bool)
    cols = np.zeros((B, H, 1, T), bool)
    if bad:
        rows[0, 1, 3] = True
        cols[1, :, :, 1] = True
    score = functools.partial(_heads_major_scores, kv_heads, groups, None, jnp.float32)
    return score, q, k, bias, allowed, jnp.asarray(rows), jnp.asarray(cols)


def _weights(bounded, score, q, k, bias, allowed, rows, cols):
    return dw.attention_weights(
        score, q, k, bias, allowed, rows, cols, jnp.float32, bounded=bounded
    )


@pytest.mark.parametrize("kv_heads", [H, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize(
    "parts",
    [(True, True, True), (False, False, False), (True, False, True), (False, True, True)],
    ids=["mask_bias_bad", "plain", "mask_bad", "bias_bad"],
)
def test_fast_and_safe_branches_agree_in_values_and_derivatives(kv_heads, parts):
    score, q, k, bias, allowed, rows, cols = _case(0, kv_heads, *parts)
    assert not bool(dw._may_be_non_finite(q, k, bias, jnp.float32))  # the fast branch runs
    fast = jax.jit(functools.partial(_weights, True, score))
    safe = jax.jit(functools.partial(_weights, False, score))
    (yf, tf), (ys, ts) = (
        fast(q, k, bias, allowed, rows, cols),
        safe(q, k, bias, allowed, rows, cols),
    )
    np.testing.assert_array_equal(tf, ts)
    np.testing.assert_allclose(yf, ys, rtol=1e-6, atol=1e-7)
    assert (np.asarray(yf)[np.asarray(jnp.broadcast_to(tf, yf.shape))] == 0).all()
    if allowed is not None:
        assert (np.asarray(yf)[~np.asarray(jnp.broadcast_to(allowed, yf.shape))] == 0).all()

    cot = jnp.asarray(np.random.default_rng(1).normal(size=yf.shape), jnp.float32)

    def loss(f, q, k, bias):
        return jnp.sum(f(q, k, bias, allowed, rows, cols)[0] * cot)

    args = (q, k, bias) if bias is not None else (q, k, None)
    argnums = (0, 1, 2) if bias is not None else (0, 1)
    gf = jax.grad(functools.partial(loss, fast), argnums)(*args)
    gs = jax.grad(functools.partial(loss, safe), argnums)(*args)
    for a, b in zip(gf, gs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Forward mode too: the derivative is one closed form for both branches.
    tq, tk = jnp.ones_like(q), -jnp.ones_like(k)
    _, jf = jax.jvp(lambda q, k: fast(q, k, bias, allowed, rows, cols)[0], (q, k), (tq, tk))
    _, js = jax.jvp(lambda q, k: safe(q, k, bias, allowed, rows, cols)[0], (q, k), (tq, tk))
    np.testing.assert_allclose(jf, js, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "change, expected",
    [
        ("none", False),
        ("nan_bias", True),
        ("inf_bias", True),
        ("neg_inf_bias", False),  # a mask, not a hazard
        ("huge_negative_bias", True),  # can push a score to -inf: an overflow
        ("huge_positive_bias", True),
        ("huge_q", True),
    ],
)
def test_the_bound_sends_every_possible_nan_or_inf_score_to_the_safe_branch(change, expected):
    _, q, k, bias, _, _, _ = _case(2)
    bias = np.asarray(bias).copy()
    if change == "nan_bias":
        bias[0, 1, 2, 3] = np.nan
    elif change == "inf_bias":
        bias[0, 1, 2, 3] = np.inf
    elif change == "neg_inf_bias":
        bias[0, 1, 2, 3] = -np.inf
    elif change == "huge_negative_bias":
        bias[0, 1, 2, 3] = np.finfo(np.float32).min
    elif change == "huge_positive_bias":
        bias[0, 1, 2, 3] = np.finfo(np.float32).max / 2
    elif change == "huge_q":
        q = q.at[0, 0, 0, 0].set(1e30)
    got = dw._may_be_non_finite(q, k, jnp.asarray(bias), jnp.float32)
    assert bool(got) is expected


def test_scores_that_could_overflow_their_dtype_take_the_safe_branch():
    # Scores in float16 would overflow at 65504: |q| * |k| = 300 * 300 could reach it;
    # the dense path computes float16 inputs' scores in float32, where it cannot.
    q = jnp.zeros((1, 2, 1, 4), jnp.float16).at[0, 0, 0, 0].set(300)
    k = jnp.zeros((1, 2, 1, 4), jnp.float16).at[0, 1, 0, 0].set(300)
    assert bool(dw._may_be_non_finite(q, k, None, jnp.float16))
    assert not bool(dw._may_be_non_finite(q / 8, k / 8, None, jnp.float16))
    assert not bool(dw._may_be_non_finite(q, k, None, jnp.float32))


def test_under_vmap_one_branch_runs_for_the_whole_batch():
    # A batched predicate would turn the cond into a select that computes both
    # branches; the choice is reduced over the batch instead.
    q = jnp.ones((3, 1, T, H, D))
    jaxpr = jax.make_jaxpr(jax.vmap(lambda q: dm.dot_product_attention(q, q, q)))(q)
    names = [e.primitive.name for e in jaxpr.eqns]

    def conds(eqns):
        found = []
        for e in eqns:
            if e.primitive.name == "cond":
                found.append(e)
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                found += conds(sub.eqns)
        return found

    found = conds(jaxpr.eqns)
    assert found, names
    assert all(e.invars[0].aval.shape == () for e in found)
    # And the batch gets what each member gets alone.
    one = dm.dot_product_attention(q[0], q[0], q[0])
    np.testing.assert_allclose(jax.vmap(lambda q: dm.dot_product_attention(q, q, q))(q)[0], one)
