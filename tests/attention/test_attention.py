"""dot_product_attention: Flax parity, empty rows, padding junk, dropout, Flax plug-in."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import dropmask as dm

TOL = {"rtol": 1e-5, "atol": 1e-6}
SHAPES = [(2, 5, 3, 6, 4), (1, 3, 2, 3, 8)]  # batch, q_len, heads, kv_len, depth


def _qkv(seed, b, q_len, h, kv_len, d):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, q_len, h, d)).astype(np.float32)
    k = rng.normal(size=(b, kv_len, h, d)).astype(np.float32)
    v = rng.normal(size=(b, kv_len, h, d)).astype(np.float32)
    return q, k, v, rng


@jax.jit
def _both(q, k, v, mask, bias):
    return (
        dm.dot_product_attention(q, k, v, mask=mask, bias=bias),
        nn.dot_product_attention(q, k, v, mask=mask, bias=bias),
    )


@given(st.sampled_from(SHAPES), st.integers(0, 2**32 - 1))
def test_matches_flax_when_every_query_has_a_key(shape, seed):
    q, k, v, rng = _qkv(seed, *shape)
    b, q_len, h, kv_len, _ = shape
    mask = rng.random((b, 1, q_len, kv_len)) < 0.5
    mask[..., rng.integers(kv_len)] = True  # at least one valid key per query
    bias = rng.normal(size=(1, h, q_len, kv_len)).astype(np.float32)
    ours, flax = _both(q, k, v, mask, bias)
    np.testing.assert_allclose(ours, flax, **TOL)


def _padded_case(junk=True):
    """Batch 0 is fully valid; batch 1 has 2 valid tokens, so its last queries see nothing."""
    q, k, v, _ = _qkv(0, 2, 4, 2, 4, 8)
    valid = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    mask = jax.jit(dm.attention_mask)(valid, valid)
    if junk:
        for a in (q, k, v):
            a[1, 2:] = np.nan
            a[1, 3, 0, 0] = np.inf
    else:
        for a in (q, k, v):
            a[1, 2:] = 0.0
    return q, k, v, mask, valid


@jax.jit
def _flax_and_jax(q, k, v, mask):
    return (
        nn.dot_product_attention(q, k, v, mask=mask),
        jax.nn.dot_product_attention(q, k, v, mask=mask),
    )


@jax.jit
def _loss_and_grads(q, k, v, mask):
    def loss(q, k, v):
        out = dm.dot_product_attention(q, k, v, mask=mask)
        return jnp.sum(out * jnp.arange(out.size, dtype=out.dtype).reshape(out.shape) / out.size)

    out = dm.dot_product_attention(q, k, v, mask=mask)
    return out, jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def test_query_with_no_valid_key_outputs_zeros_with_finite_gradients():
    q, k, v, mask, valid = _padded_case()
    with jax.debug_nans(True):
        out, grads = _loss_and_grads(q, k, v, mask)
    assert (np.asarray(out)[1, 2:] == 0).all()
    for g in grads:
        g = np.asarray(g)
        assert np.isfinite(g).all() and (g[1, 2:] == 0).all()
    # Padding junk never leaks: identical to the same batch padded with zeros.
    q0, k0, v0, _, _ = _padded_case(junk=False)
    out0, grads0 = _loss_and_grads(q0, k0, v0, mask)
    np.testing.assert_array_equal(out, out0)
    for g, g0 in zip(grads, grads0, strict=True):
        np.testing.assert_array_equal(g, g0)
    # The anchors average the values over the padding instead.
    flax, jaxnn = (np.asarray(a) for a in _flax_and_jax(q0, k0, v0, mask))
    np.testing.assert_allclose(flax[1, 2:], np.broadcast_to(v0[1].mean(0), (2, 2, 8)), **TOL)
    np.testing.assert_allclose(jaxnn[1, 2:], flax[1, 2:], **TOL)
    # Where a query has keys, everything matches Flax.
    out0 = np.asarray(out0)
    np.testing.assert_allclose(out0[0], flax[0], **TOL)
    np.testing.assert_allclose(out0[1, :2], flax[1, :2], **TOL)


@jax.jit
def _causal_variants(q, k, v, pad):
    attend = functools.partial(dm.dot_product_attention, q, k, v)
    kg, vg = k[:, :, :2], v[:, :, :2]  # 4 query heads share 2 key/value heads
    return {
        "is_causal": attend(is_causal=True),
        "causal_mask": attend(mask=dm.causal_mask(5)),
        "jax": jax.nn.dot_product_attention(q, k, v, is_causal=True),
        "neg_inf_bias": attend(bias=jnp.where(dm.causal_mask(5), 0.0, -jnp.inf)),
        "pad_is_causal": attend(mask=pad, is_causal=True),
        "pad_and_causal": attend(mask=dm.combine_masks(pad, dm.causal_mask(5))),
        "grouped": dm.dot_product_attention(q, kg, vg, mask=pad),
        "repeated": dm.dot_product_attention(
            q, kg.repeat(2, axis=2), vg.repeat(2, axis=2), mask=pad
        ),
    }


def test_is_causal_bias_and_grouped_query_heads():
    q, k, v, _ = _qkv(1, 2, 5, 4, 5, 8)
    pad = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)[:, None, None, :]
    out = _causal_variants(q, k, v, pad)
    for name in ("causal_mask", "jax", "neg_inf_bias"):  # an -inf bias acts as a mask
        np.testing.assert_allclose(out[name], out["is_causal"], err_msg=name, **TOL)
    np.testing.assert_allclose(out["pad_is_causal"], out["pad_and_causal"], **TOL)
    np.testing.assert_allclose(out["grouped"], out["repeated"], **TOL)


@functools.partial(jax.jit, static_argnames="broadcast")
def _dropout_pair(q, k, v, mask, key, broadcast):
    kwargs = {"dropout_rate": 0.4, "deterministic": False, "broadcast_dropout": broadcast}
    return (
        dm.dot_product_attention(q, k, v, mask=mask, key=key, impl="flax", **kwargs),
        dm.dot_product_attention(q, k, v, mask=mask, dropout_rng=key, impl="flax", **kwargs),
        nn.dot_product_attention(q, k, v, mask=mask, dropout_rng=key, **kwargs),
    )


@pytest.mark.parametrize("broadcast", [True, False])
def test_dropout_matches_flax_with_the_flax_generator(broadcast):
    q, k, v, rng = _qkv(2, 2, 4, 3, 5, 4)
    mask = rng.random((2, 1, 4, 5)) < 0.7
    mask[..., 0] = True
    ours, same, flax = _dropout_pair(q, k, v, mask, jax.random.key(3), broadcast)
    np.testing.assert_allclose(ours, flax, **TOL)
    np.testing.assert_array_equal(same, ours)


@jax.jit
def _dropout_modes(q, k, v, key):
    weights = []

    class Capture:
        def sow(self, collection, name, value):
            weights.append(value)

    out = dm.dot_product_attention(q, k, v, dropout_rate=0.5, key=key, deterministic=False)
    plain = dm.dot_product_attention(q, k, v, dropout_rate=0.5, key=key, deterministic=True)
    default = dm.dot_product_attention(q, k, v)
    # Undo the dropout by hand: the same key gives the same mask, shared across batch and heads.
    dm.dot_product_attention(q, k, v, module=Capture())
    keep = dm.keep_mask(key, weights[0].shape, 0.5, broadcast_dims=(0, 1))
    manual = jnp.einsum("...hqk,...khd->...qhd", jnp.where(keep, weights[0] / 0.5, 0), v)
    return out, plain, default, keep, manual


def test_dropout_default_generator_and_modes():
    q, k, v, _ = _qkv(3, 2, 4, 3, 4, 4)
    key = jax.random.key(0)
    out, plain, default, keep, manual = _dropout_modes(q, k, v, key)
    assert not np.allclose(out, plain)
    np.testing.assert_allclose(plain, default, **TOL)
    keep = np.asarray(keep)
    assert (keep == keep[:1, :1]).all()
    np.testing.assert_allclose(out, manual, **TOL)
    with pytest.raises(dm.MissingKeyError, match="needs a PRNG key"):
        dm.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=False)
    with pytest.raises(dm.RateError, match="dropout_rate must be in"):
        dm.dot_product_attention(q, k, v, dropout_rate=1.5, key=key, deterministic=False)
    with pytest.raises(ValueError, match="not both"):
        dm.dot_product_attention(q, k, v, key=key, dropout_rng=key)


def test_plugs_into_linen_multi_head_attention():
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    valid = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    mask = jax.jit(nn.make_attention_mask)(valid, valid)  # Flax's float32 0/1 mask
    cfg = {"num_heads": 4, "qkv_features": 16, "dropout_rate": 0.3}
    flax_layer = nn.MultiHeadDotProductAttention(**cfg)
    ours_layer = nn.MultiHeadDotProductAttention(
        **cfg, attention_fn=functools.partial(dm.dot_product_attention, impl="flax")
    )
    params = jax.jit(functools.partial(flax_layer.init, deterministic=True))(
        jax.random.key(1), x, mask=mask
    )
    rngs = {"dropout": jax.random.key(2)}
    for det in (True, False):
        apply = functools.partial(jax.jit, static_argnames="deterministic")
        want = apply(flax_layer.apply)(params, x, mask=mask, deterministic=det, rngs=rngs)
        got = apply(ours_layer.apply)(params, x, mask=mask, deterministic=det, rngs=rngs)
        rows = np.asarray(valid)  # padded queries: Flax averages, we give zeros then project
        np.testing.assert_allclose(np.asarray(got)[rows], np.asarray(want)[rows], **TOL)
    sow = jax.jit(
        functools.partial(ours_layer.apply, deterministic=True, sow_weights=True),
        static_argnames="mutable",
    )
    _, state = sow(params, x, mask=mask, mutable=("intermediates",))
    (sown,) = state["intermediates"]["attention_weights"]
    assert sown.shape == (2, 4, 5, 5)
    np.testing.assert_array_equal(np.asarray(sown)[1, :, 3:], 0.0)


@nnx.jit(static_argnames="is_causal")
def _nnx_call(layer, x, mask, is_causal=False):
    return layer(x, mask=mask, is_causal=is_causal)


def test_plugs_into_nnx_multi_head_attention():
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    cfg = {"num_heads": 4, "in_features": 16, "qkv_features": 16, "decode": False}
    flax_layer = nnx.MultiHeadAttention(**cfg, rngs=nnx.Rngs(0))
    ours_layer = nnx.MultiHeadAttention(
        **cfg, attention_fn=dm.dot_product_attention, rngs=nnx.Rngs(0)
    )
    mask = jax.jit(dm.attention_mask)(jnp.ones((2, 5), bool), jnp.array([True] * 4 + [False]))
    np.testing.assert_allclose(
        _nnx_call(ours_layer, x, mask), _nnx_call(flax_layer, x, mask), **TOL
    )
    causal = _nnx_call(flax_layer, x, None, is_causal=True)
    np.testing.assert_allclose(_nnx_call(ours_layer, x, None, is_causal=True), causal, **TOL)
    grouped = {**cfg, "num_kv_heads": 2}
    flax_gqa = nnx.MultiHeadAttention(**grouped, rngs=nnx.Rngs(1))
    ours_gqa = nnx.MultiHeadAttention(
        **grouped, attention_fn=dm.dot_product_attention, rngs=nnx.Rngs(1)
    )
    np.testing.assert_allclose(
        _nnx_call(ours_gqa, x, None, is_causal=True),
        _nnx_call(flax_gqa, x, None, is_causal=True),
        **TOL,
    )
    # Decoding builds a float mask with nnx.combine_masks, one token at a time.
    dec = nnx.MultiHeadAttention(
        **{**cfg, "decode": True}, attention_fn=dm.dot_product_attention, rngs=nnx.Rngs(0)
    )
    dec.init_cache((2, 5, 16))
    steps = [_nnx_call(dec, x[:, t : t + 1], None) for t in range(5)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), causal, rtol=1e-5, atol=1e-5)


@jax.jit
def _variants(q, k, v, mask):
    half = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
    einsums = {"qk_attn_weights_einsum": jnp.einsum, "attn_weights_value_einsum": jnp.einsum}
    return {
        "full": dm.dot_product_attention(q, k, v, mask=mask),
        "half": dm.dot_product_attention(*half, mask=mask),
        "dtype": dm.dot_product_attention(q, k, v, dtype=jnp.bfloat16),
        "einsums": dm.dot_product_attention(q, k, v, mask=mask, **einsums),
        "vmap": jax.vmap(lambda a, b, c, m: dm.dot_product_attention(a, b, c, mask=m))(
            q, k, v, mask
        ),
    }


def test_bf16_custom_einsums_and_vmap():
    q, k, v, rng = _qkv(4, 2, 3, 2, 4, 8)
    mask = rng.random((2, 1, 3, 4)) < 0.6
    mask[..., 0] = True
    out = _variants(q, k, v, mask)
    assert out["half"].dtype == out["dtype"].dtype == jnp.bfloat16
    np.testing.assert_allclose(out["half"].astype(jnp.float32), out["full"], rtol=5e-2, atol=5e-2)
    np.testing.assert_allclose(out["einsums"], out["full"], **TOL)
    np.testing.assert_allclose(out["vmap"], out["full"], **TOL)


@jax.jit
def _packed_and_alone(x, segment_ids, padded, lengths):
    mask = dm.combine_masks(dm.segment_mask(segment_ids), dm.causal_mask(5))
    out = dm.dot_product_attention(x, x, x, mask=mask)
    # Reference: the same sequences one per row, padded, through Flax's attention.
    valid = dm.sequence_mask(lengths, padded.shape[1])
    flax_mask = nn.combine_masks(nn.make_attention_mask(valid, valid), nn.make_causal_mask(valid))
    return out, nn.dot_product_attention(padded, padded, padded, mask=flax_mask)


def test_packed_rows_attend_like_separate_sequences():
    rng = np.random.default_rng(5)
    seqs = [rng.normal(size=(n, 1, 4)).astype(np.float32) for n in (3, 2, 4)]
    packed = dm.pack_sequences(seqs, max_len=5)
    x = jnp.asarray(packed.values)
    padded, lengths = dm.pad_sequences(seqs)
    out, alone = _packed_and_alone(x, packed.segment_ids, padded, lengths)
    alone = np.asarray(alone)
    pieces = dm.unpack_sequences(np.asarray(out), packed)
    for i, (piece, n) in enumerate(zip(pieces, lengths, strict=True)):
        np.testing.assert_allclose(piece, alone[i, :n], **TOL)
    assert (np.asarray(out)[packed.segment_ids == 0] == 0).all()


def test_errors():
    q = jnp.ones((1, 3, 2, 4))
    with pytest.raises(ValueError, match="same rank >= 3"):
        dm.dot_product_attention(q, q[0], q[0])
    with pytest.raises(ValueError, match="batch dims must match"):
        dm.dot_product_attention(q, jnp.ones((2, 3, 2, 4)), jnp.ones((2, 3, 2, 4)))
    with pytest.raises(ValueError, match="same length and heads"):
        dm.dot_product_attention(q, q, jnp.ones((1, 4, 2, 4)))
    with pytest.raises(ValueError, match="depths must match"):
        dm.dot_product_attention(q, jnp.ones((1, 3, 2, 5)), jnp.ones((1, 3, 2, 5)))
    with pytest.raises(ValueError, match=r"query heads \(2\) must be a multiple"):
        dm.dot_product_attention(q, jnp.ones((1, 3, 3, 4)), jnp.ones((1, 3, 3, 4)))
    with pytest.raises(
        dm.MaskShapeError,
        match=r"mask of shape \(3, 3, 3\) does not broadcast to shape \(1, 2, 3, 3\)",
    ):
        dm.dot_product_attention(q, q, q, mask=jnp.ones((3, 3, 3), bool))
    with pytest.raises(
        dm.MaskShapeError, match="bias of shape.*build masks with dropmask.attention_mask"
    ):
        dm.dot_product_attention(q, q, q, bias=jnp.ones((3, 4)))
    with pytest.raises(dm.DtypeError, match="floating-point"):
        dm.dot_product_attention(*(jnp.ones((1, 3, 2, 4), jnp.int32),) * 3)
    with pytest.raises(dm.DtypeError, match="mask must be boolean or numeric"):
        dm.dot_product_attention(q, q, q, mask=jax.random.split(jax.random.key(0), 3))
    with pytest.raises(ValueError, match="must be given together"):
        dm.dot_product_attention(q, q, q, qk_attn_weights_einsum=jnp.einsum)
    with pytest.raises(ValueError, match="mutually exclusive"):
        dm.dot_product_attention(
            q,
            q,
            q,
            precision="highest",
            qk_attn_weights_einsum=jnp.einsum,
            attn_weights_value_einsum=jnp.einsum,
        )
    with pytest.raises(ValueError, match="impl must be one of"):
        dm.dot_product_attention(q, q, q, impl="mine")


# --------------------------------------------------------------- non-finite inputs

_L = 6
_SEGMENTS = np.array([[1, 1, 1, 2, 2, 0]])
_VALID = np.array([[True] * 4 + [False] * 2])
_CAUSAL = np.tril(np.ones((_L, _L), bool))


def _leak_case(name):
    """``(kwargs for dot_product_attention, allowed bool[q, k])`` for one mask kind."""
    causal_bias = jnp.where(dm.causal_mask(_L), 0.0, -jnp.inf)
    key = jax.random.key(7)
    drop = {"dropout_rate": 0.3, "key": key, "deterministic": False}
    pad = dm.attention_mask(jnp.asarray(_VALID), jnp.asarray(_VALID))
    seg = dm.segment_mask(jnp.asarray(_SEGMENTS))
    both = _VALID[0][:, None] & _VALID[0][None, :]
    same = (_SEGMENTS[0][:, None] == _SEGMENTS[0][None, :]) & (_SEGMENTS[0][:, None] > 0)
    return {
        "causal": ({"is_causal": True}, _CAUSAL),
        "neg_inf_bias": ({"bias": causal_bias}, _CAUSAL),
        "segments": ({"mask": seg}, same),
        "segments_causal": ({"mask": dm.combine_masks(seg, dm.causal_mask(_L))}, same & _CAUSAL),
        "padding": ({"mask": pad}, both),
        "key_padding": (
            {"mask": jnp.asarray(_VALID)[:, None, None, :]},
            np.broadcast_to(_VALID, (_L, _L)),
        ),
        "causal_dropout": ({"is_causal": True, **drop}, _CAUSAL),
    }[name]


@functools.partial(jax.jit, static_argnames="name")
def _allowed(name):
    """``_leak_case(name)``'s ``allowed``, its masks built in one program per name."""
    return _leak_case(name)[1]


@functools.partial(jax.jit, static_argnames=("name", "kv_heads"))
def _attend_and_grads(q, k, v, weight, name, kv_heads):
    kwargs, _ = _leak_case(name)
    k, v = k[:, :, :kv_heads], v[:, :, :kv_heads]

    def loss(q, k, v):
        out = dm.dot_product_attention(q, k, v, **kwargs)
        return jnp.sum(jnp.where(weight != 0, out * weight, 0.0))

    return dm.dot_product_attention(q, k, v, **kwargs), jax.grad(loss, (0, 1, 2))(q, k, v)


@pytest.mark.parametrize(
    "name",
    [
        "causal",
        "neg_inf_bias",
        "segments",
        "segments_causal",
        "padding",
        "key_padding",
        "causal_dropout",
    ],
)
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_non_finite_input_reaches_only_queries_that_may_see_it(name, which, bad, kv_heads):
    # [batch=1, len=6, heads=2, depth=4]; one bad entry at position 3 (or 4, padding).
    q, k, v, rng = _qkv(11, 1, _L, 2, _L, 4)
    allowed = np.asarray(_allowed(name))
    pos = 4 if "padding" in name else 3
    arrays = {"q": q, "k": k, "v": v}
    dirty = {n: a.copy() for n, a in arrays.items()}
    clean = {n: a.copy() for n, a in arrays.items()}
    dirty[which][0, pos, 0, 1] = bad
    clean[which][0, pos, 0, 1] = 0.7
    # Query rows (per head) that may see the bad entry: [len, heads].
    tainted = np.zeros((_L, 2), bool)
    if which == "q":
        tainted[pos, 0] = allowed[pos].any()
    else:
        heads = [0, 1] if kv_heads == 1 else [0]  # one key/value head serves both
        tainted[:, heads] = allowed[:, pos][:, None]
    weight = np.where(tainted, 0.0, rng.normal(size=(_L, 2)))[None, :, :, None]
    weight = np.broadcast_to(weight, (1, _L, 2, 4)).astype(np.float32)
    out, grads = _attend_and_grads(*dirty.values(), weight, name, kv_heads)
    ref_out, ref_grads = _attend_and_grads(*clean.values(), weight, name, kv_heads)
    out, ref_out = np.asarray(out), np.asarray(ref_out)
    ok = ~tainted[None, :, :, None].repeat(4, axis=-1)
    tol = {"rtol": 1e-6, "atol": 1e-6}
    np.testing.assert_allclose(out[ok], ref_out[ok], **tol)
    assert np.isnan(out[~ok]).all()  # a query that may see it is NaN, not a wrong number
    dq, dk, dv = (np.asarray(g) for g in grads)
    np.testing.assert_allclose(dq[ok], np.asarray(ref_grads[0])[ok], **tol)
    bad_entry = np.zeros(dk.shape, bool)
    if which != "q":
        bad_entry[0, pos, 0, 1] = True
    for got, want in ((dk, ref_grads[1]), (dv, ref_grads[2])):
        want = np.where(bad_entry, 0.0, np.asarray(want))  # no gradient to the bad entry
        np.testing.assert_allclose(got, want, **tol)


def test_non_finite_value_in_the_loss_gives_a_nan_gradient():
    # A tainted query that the loss uses makes the loss NaN; its gradient is NaN too,
    # so checks such as optax.apply_if_finite skip the step.
    q, k, v, _ = _qkv(12, 1, 4, 1, 4, 4)
    v[0, 2, 0, 0] = np.nan

    def loss(q, k, v):
        return jnp.sum(dm.dot_product_attention(q, k, v, is_causal=True))

    value, (dq, dk, dv) = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v)
    assert np.isnan(value)
    assert np.isnan(np.asarray(dq)[0, 2:]).any() and np.isfinite(np.asarray(dq)[0, :2]).all()


def test_non_finite_bias_or_overflowing_scores_stay_in_their_row():
    q, k, v, _ = _qkv(13, 1, 4, 1, 4, 4)

    @jax.jit
    def attend_and_grads(q, k, v, bias):
        def loss(q, k, v):
            out = dm.dot_product_attention(q, k, v, bias=bias, is_causal=True)
            return jnp.sum(out[:, :2]) + jnp.sum(out[:, 3:])

        out = dm.dot_product_attention(q, k, v, bias=bias, is_causal=True)
        return out, jax.grad(loss, (0, 1, 2))(q, k, v)

    for bias_value in (np.nan, np.inf):
        bias = np.zeros((1, 1, 4, 4), np.float32)
        bias[0, 0, 2, 1] = bias_value
        out, (dq, dk, dv) = attend_and_grads(q, k, v, bias)
        out = np.asarray(out)
        assert np.isnan(out[0, 2]).all() and np.isfinite(np.delete(out, 2, axis=1)).all()
        assert np.isfinite(np.delete(np.asarray(dq), 2, axis=1)).all()
        assert np.isfinite(dk).all() and np.isfinite(dv).all()
    # Finite inputs whose scores overflow float32: only that query is affected.
    # (float16 inputs' scores accumulate in float32: 300 * 300 no longer overflows.)
    q16, k16, v16 = (a.astype(np.float32) for a in (q, k, v))
    q16[0, 1] = 1e20
    k16[0, 0] = 1e20

    @jax.jit
    def attend_and_grads16(q, k, v):
        def loss16(q, k, v):
            out = dm.dot_product_attention(q, k, v, is_causal=True).astype(jnp.float32)
            return jnp.sum(out[:, 2:])

        out = dm.dot_product_attention(q, k, v, is_causal=True)
        return out, jax.grad(loss16, (0, 1, 2))(q, k, v)

    out, grads = attend_and_grads16(q16, k16, v16)
    out = np.asarray(out, np.float32)
    assert np.isnan(out[0, 1]).all() and np.isfinite(np.delete(out, 1, axis=1)).all()
    dq, dk, dv = (np.asarray(g, np.float32) for g in grads)
    assert np.isfinite(np.delete(dq, 1, axis=1)).all()
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


def test_user_errors_are_dropmask_errors_with_the_fix():
    q = jnp.ones((1, 3, 2, 4))
    with pytest.raises(dm.DropmaskValueError, match="depths must match"):
        dm.dot_product_attention(q, jnp.ones((1, 3, 2, 5)), jnp.ones((1, 3, 2, 5)))
    with pytest.raises(dm.DtypeError, match=r"q, k and v must be real.*x\.imag"):
        dm.dot_product_attention(q.astype(jnp.complex64), q, q)
    with pytest.raises(dm.DtypeError, match="boolean array as mask="):
        dm.dot_product_attention(q, q, q, bias=jnp.ones((3, 3), bool))


def test_forward_mode_through_a_custom_vjp_path_says_what_to_pass_in_one_line():
    short, long = jnp.ones((1, 4, 2, 8)), jnp.ones((1, 512, 1, 8), jnp.bfloat16)
    drop = {"dropout_rate": 0.1, "key": jax.random.key(0), "deterministic": False}

    def message(transform, q, **kw):
        with pytest.raises(dm.DropmaskTypeError) as err:
            transform(lambda q: dm.dot_product_attention(q, q, q, **kw), q)
        assert len(str(err.value).splitlines()) == 1
        return str(err.value)

    def jvp(f, q):
        return jax.jvp(f, (q,), (q,))

    def jit_jacfwd(f, q):  # jacfwd's batching raises while tracing, inside the call
        return jax.jit(jax.jacfwd(f))(q)

    dense = message(jvp, short, **drop)
    assert dense == (
        "dot_product_attention: impl must be 'flax' for forward-mode autodiff (jax.jvp, "
        "jax.jacfwd) through dropout on the attention weights, got 'fast'. Pass "
        "impl='flax', or differentiate in reverse mode (jax.grad, jax.vjp)."
    )
    assert message(jit_jacfwd, short, **drop) == dense
    blockwise = message(jvp, short, algorithm="blockwise")
    assert "algorithm must be 'dense' for forward-mode" in blockwise
    assert "got 'blockwise'. Pass algorithm='dense', or differentiate" in blockwise
    auto = message(jvp, long, **drop)  # 512 bf16 tokens: "auto" takes the blockwise path
    chose = "got 'auto', which chose 'blockwise' for these lengths. Pass algorithm='dense' and "
    assert chose + "impl='flax', or differentiate" in auto
    # What is no custom_vjp differentiates forward: no dropout, or Flax's generator.
    jvp(lambda q: dm.dot_product_attention(q, q, q), short)
    jvp(lambda q: dm.dot_product_attention(q, q, q, **drop, impl="flax"), short)


def test_padding_junk_passes_no_nan_through_any_op_eagerly():
    # Eager `jax_debug_nans` checks every op: garbage held behind the mask must not be
    # passed along by any of them, in the forward or the backward pass.
    q, k, v, mask, _ = _padded_case()
    q, k, v = (jnp.asarray(a) for a in (q, k, v))
    with jax.debug_nans(True):
        out = dm.dot_product_attention(q, k, v, mask=mask)
        grads = jax.grad(
            lambda q, k, v: dm.dot_product_attention(q, k, v, mask=mask).sum(), (0, 1, 2)
        )(q, k, v)
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)
    # int inputs cast to float16 that overflow are non-finite inputs too.
    big = jnp.full((1, 2, 1, 2), 70000, jnp.int32)
    out = dm.dot_product_attention(big, big, big, dtype=jnp.float16, is_causal=True)
    assert np.isnan(np.asarray(out, np.float32)).all()


def test_kv_lengths_errors_name_kv_lengths():
    q = jnp.ones((2, 3, 1, 4))
    with pytest.raises(dm.DropmaskValueError, match=r"kv_lengths must be in \[0, 3\]"):
        dm.dot_product_attention(q, q, q, kv_lengths=jnp.array([1, 5]))
    with pytest.raises(dm.DtypeError, match="kv_lengths must be integers"):
        dm.dot_product_attention(q, q, q, kv_lengths=jnp.array([1.0, 2.0]))
