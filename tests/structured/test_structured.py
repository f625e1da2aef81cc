"""The structured dropout family: DropBlock, LayerDrop, DropHead, token dropping, R-Drop."""

import functools
import math

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from tests.covering import covering

import dropmask

KEY = jax.random.key(0)


def _keys(n, seed=0):
    return jax.random.split(jax.random.key(seed), n)


def _within_4_sigma(samples, expected):
    """The mean of independent samples is within 4 standard errors of ``expected``."""
    samples = np.asarray(samples, np.float64)
    sigma = samples.std(ddof=1) / np.sqrt(samples.size)
    assert abs(samples.mean() - expected) < 4 * sigma + 1e-12, (samples.mean(), expected, sigma)


# --- DropBlock -------------------------------------------------------------------------


# Fast: a 1-D, a 2-D (7 x 7 blocks on 14 x 14, where blocks overlap the most) and a 3-D
# map; the slow suite adds a second 2-D map.
@pytest.mark.parametrize(
    ("shape", "block_size", "rate"),
    [
        ((512, 32, 1), 5, 0.1),
        ((256, 14, 14, 1), 7, 0.1),
        pytest.param((256, 16, 16, 1), 3, 0.3, marks=pytest.mark.slow),
        ((128, 6, 8, 7, 1), (2, 3, 2), 0.2),
    ],
)
def test_drop_block_drops_rate_of_units_in_expectation(shape, block_size, rate):
    y = dropmask.drop_block(jnp.ones(shape), rate, KEY, block_size=block_size)
    dropped = np.asarray(y == 0).reshape(shape[0], -1).mean(axis=1)  # one sample per example
    _within_4_sigma(dropped, rate)


def test_drop_block_paper_formula_would_drop_fewer_units():
    """The closed form counts overlapping blocks twice: at 7x7 on 14x14 it asks for a
    seed probability above the exact one, and the exact one drops the rate asked."""
    from dropmask._structured._dropblock import coverage, seed_probability

    rate, s, b = 0.1, 14, 7
    paper = rate / b**2 * s**2 / (s - b + 1) ** 2
    exact = seed_probability(rate, (s, s), (b, b))
    n, w = coverage((s, s), (b, b))
    assert float(np.sum(w * (1 - (1 - exact) ** n))) == pytest.approx(rate, abs=1e-12)
    assert float(np.sum(w * (1 - (1 - paper) ** n))) == pytest.approx(0.0929, abs=1e-4)


def test_drop_block_rescales_each_example_by_the_kept_fraction():
    x = jnp.ones((16, 12, 12, 3))
    y = dropmask.drop_block(x, 0.3, KEY, block_size=3, per_channel=True)
    np.testing.assert_allclose(np.asarray(y.mean(axis=(1, 2))), 1.0, rtol=1e-6)


def _reduce(x, op, init, sizes, padding):
    return jax.lax.reduce_window(x, init, op, (1, *sizes, 1), (1,) * x.ndim, padding)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_drop_block_drops_whole_blocks_inside_the_map(per_channel, seed):
    """The dropped set is a union of whole blocks that fit in the map: opening it (the
    blocks every dropped unit's block fits in, spread again) gives it back."""
    sizes = (3, 4)
    y = dropmask.drop_block(
        jnp.ones((4, 10, 11, 2)),
        0.25,
        jax.random.key(seed),
        block_size=sizes,
        per_channel=per_channel,
    )
    dropped = (y == 0).astype(jnp.uint8)
    assert int(dropped.sum()) > 0
    corners = _reduce(dropped, jax.lax.min, np.uint8(1), sizes, ((0, 0), (0, 2), (0, 3), (0, 0)))
    valid = np.zeros(dropped.shape, bool)
    valid[:, : 10 - 3 + 1, : 11 - 4 + 1] = True
    corners = corners * jnp.asarray(valid, jnp.uint8)
    opened = _reduce(corners, jax.lax.max, np.uint8(0), sizes, ((0, 0), (2, 0), (3, 0), (0, 0)))
    np.testing.assert_array_equal(np.asarray(opened), np.asarray(dropped))
    if not per_channel:
        np.testing.assert_array_equal(np.asarray(dropped[..., 0]), np.asarray(dropped[..., 1]))


def test_drop_block_jit_vmap_grad_and_traced_rate():
    x = jax.random.normal(KEY, (4, 9, 9, 3))
    f = functools.partial(dropmask.drop_block, block_size=3)
    eager = f(x, 0.2, KEY)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda x, k: f(x, 0.2, k))(x, KEY)), np.asarray(eager)
    )
    keys = _keys(3)
    batched = jax.vmap(lambda k: f(x, 0.2, k))(keys)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(batched[i]), np.asarray(f(x, 0.2, keys[i])))
    grad = jax.grad(lambda x: jnp.sum(f(x, 0.2, KEY)))(x)
    np.testing.assert_allclose(
        np.asarray(grad), np.asarray(eager / jnp.where(x == 0, 1, x)), rtol=1e-5
    )
    # A JAX scalar is a run-time rate: one program for every value, the same masks.
    g = jax.jit(lambda x, r, k: f(x, r, k))
    a = g(x, jnp.float32(0.2), KEY)
    g(x, jnp.float32(0.4), KEY)
    assert g._cache_size() == 1
    np.testing.assert_array_equal(np.asarray(a), np.asarray(f(x, jnp.float32(0.2), KEY)))
    assert bool(jnp.isnan(g(x, jnp.float32(1.5), KEY)).all())


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_drop_block_keeps_dtype(dtype):
    y = dropmask.drop_block(jnp.ones((2, 8, 8, 3), dtype), 0.2, KEY, block_size=3)
    assert y.dtype == dtype


def test_drop_block_rates_zero_and_one_and_deterministic():
    x = jnp.ones((2, 8, 3))
    assert dropmask.drop_block(x, 0.0, None, block_size=2) is x
    assert dropmask.drop_block(x, 0.5, None, block_size=2, deterministic=True) is x
    assert not dropmask.drop_block(x, 1.0, None, block_size=2).any()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(x=jnp.ones((4, 8))), dropmask.DropmaskValueError, "1 to 3 spatial axes"),
        (dict(x=jnp.ones((4, 8, 8), jnp.int32)), dropmask.DtypeError, "floating"),
        (dict(block_size=9), dropmask.DropmaskValueError, "block_size must be in"),
        (dict(block_size=(2, 2)), dropmask.DropmaskValueError, "one entry per spatial"),
        (dict(block_size=2.0), dropmask.DropmaskTypeError, "block_size must be an int"),
        (dict(rate=1.5), dropmask.RateError, "rate must be in"),
        (dict(key=None), dropmask.MissingKeyError, "needs a PRNG key"),
        (
            dict(global_shape=(8, 16, 3), offset=(0, 0, 0)),
            dropmask.DropmaskValueError,
            "splits a spatial axis",
        ),
    ],
)
def test_drop_block_bad_arguments(kwargs, error, match):
    args = dict(x=jnp.ones((4, 8, 3)), rate=0.2, key=KEY, block_size=3) | kwargs
    with pytest.raises(error, match=match) as info:
        dropmask.drop_block(args.pop("x"), args.pop("rate"), args.pop("key"), **args)
    assert str(info.value).startswith("drop_block")


# --- LayerDrop -------------------------------------------------------------------------


def test_layer_drop_skips_at_rate_and_computes_only_kept_layers():
    calls = []

    def layer(h):
        jax.debug.callback(lambda: calls.append(1))
        return h + 1.0

    f = jax.jit(lambda k: dropmask.layer_drop(layer, jnp.zeros(3), 0.3, k))
    outs = np.array([float(f(k)[0]) for k in _keys(400)])
    assert set(outs) <= {0.0, 1.0}
    _within_4_sigma(outs == 0.0, 0.3)
    assert len(calls) == int((outs == 1.0).sum())  # a skipped layer ran nothing


def test_layer_drop_grad_vmap_and_traced_rate():
    w = jnp.float32(2.0)
    x = jnp.ones((2, 3))

    def f(w, k, rate=0.5):
        return jnp.sum(dropmask.layer_drop(lambda h: h * w, x, rate, k))

    keys = _keys(8)
    grads = [float(jax.grad(f)(w, k)) for k in keys]
    values = [float(f(w, k)) for k in keys]
    assert {g for g in grads} <= {0.0, 6.0} and len(set(grads)) == 2
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda k: f(w, k))(keys)), values)
    g = jax.jit(lambda r, k: f(w, k, r))
    for rate, k in zip([0.2, 0.7], keys, strict=False):
        g(jnp.float32(rate), k)
    assert g._cache_size() == 1
    assert float(f(w, KEY, 0.0)) == 12.0 and float(f(w, KEY, 1.0)) == 6.0


def test_layer_drop_bad_arguments():
    x = jnp.ones(3)
    with pytest.raises(dropmask.DropmaskTypeError, match="layer_drop: layer must be a callable"):
        dropmask.layer_drop("dense", x, 0.5, KEY)
    # At every rate and in evaluation: at 0 and 1 (the layer always or never run) it
    # was accepted, and failed the first time the rate changed.
    for rate, deterministic in [(0.5, False), (0.0, False), (1.0, False), (0.5, True)]:
        with pytest.raises(
            dropmask.DropmaskValueError, match="layer_drop: layer must return what it is given"
        ):
            dropmask.layer_drop(lambda h: h[:2], x, rate, KEY, deterministic=deterministic)
    with pytest.raises(dropmask.RateError, match="layer_drop: rate"):
        dropmask.layer_drop(lambda h: h, x, -0.1, KEY)
    with pytest.raises(dropmask.MissingKeyError):
        dropmask.layer_drop(lambda h: h, x, 0.5, None)


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.5, 0.51, 0.6, 0.75, 0.9, 0.999])
def test_kept_layers_keep_their_share_and_never_every_layer(rate):
    for num_layers in range(1, 17):
        kept = dropmask.kept_layers(num_layers, rate)
        assert kept and kept[0] == 0 and kept[-1] < num_layers, (num_layers, kept)
        assert list(kept) == sorted(set(kept))
        if rate > 0.5:  # about (1 - rate) of the layers, evenly spaced
            share = math.floor(num_layers * (1 - rate) + 0.5)
            assert len(kept) == max(1, share), (num_layers, kept)
            gaps = np.diff([*kept, num_layers])
            assert gaps.max() - gaps.min() <= 1, (num_layers, kept)


def test_kept_layers_follow_the_every_other_rule():
    assert dropmask.kept_layers(6, 0.5) == (0, 2, 4)
    assert dropmask.kept_layers(12, 0.25) == (0, 1, 2, 4, 5, 6, 8, 9, 10)
    with pytest.raises(dropmask.DropmaskValueError, match=r"kept_layers: rate must be"):
        dropmask.kept_layers(6, 0.0)
    with pytest.raises(dropmask.DropmaskValueError, match="num_layers must be >= 1"):
        dropmask.kept_layers(0, 0.5)


# --- DropHead --------------------------------------------------------------------------


def test_drop_head_one_decision_per_example_and_head_at_rate():
    x = jnp.ones((64, 5, 16, 8))
    y = dropmask.drop_head(x, 0.25, KEY)
    np.testing.assert_array_equal(
        np.asarray(y), np.asarray(jnp.broadcast_to(y[:, :1, :, :1], y.shape))
    )
    dropped = np.asarray(y[:, 0, :, 0] == 0)
    _within_4_sigma(dropped.ravel(), 0.25)
    np.testing.assert_allclose(np.asarray(y[y != 0]), 1 / 0.75, rtol=1e-3)


def test_drop_head_attention_is_drop_head_of_attention():
    q, k, v = (jax.random.normal(kk, (2, 6, 4, 8)) for kk in _keys(3, 1))
    got = dropmask.drop_head_attention(
        q, k, v, dropout_rate=0.5, dropout_rng=KEY, deterministic=False, is_causal=True
    )
    want = dropmask.drop_head(dropmask.dot_product_attention(q, k, v, is_causal=True), 0.5, KEY)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Weight dropout as well: two independent keys split from the one given.
    both = dropmask.drop_head_attention(
        q, k, v, dropout_rate=0.5, key=KEY, deterministic=False, weights_rate=0.1
    )
    hk, wk = jax.random.split(KEY)
    attn = dropmask.dot_product_attention(q, k, v, dropout_rate=0.1, key=wk, deterministic=False)
    np.testing.assert_array_equal(np.asarray(both), np.asarray(dropmask.drop_head(attn, 0.5, hk)))
    off = dropmask.drop_head_attention(q, k, v, dropout_rate=0.5, dropout_rng=KEY)
    np.testing.assert_array_equal(
        np.asarray(off), np.asarray(dropmask.dot_product_attention(q, k, v))
    )


def test_drop_head_attention_in_flax_attention_modules():
    import flax.linen as nn
    from flax import nnx

    x = jax.random.normal(KEY, (2, 5, 16))
    linen = nn.MultiHeadDotProductAttention(
        num_heads=4, dropout_rate=0.5, attention_fn=dropmask.drop_head_attention
    )
    params = linen.init(KEY, x, deterministic=True)
    y = linen.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
    y_eval = linen.apply(params, x, deterministic=True)
    assert y.shape == y_eval.shape and not np.allclose(np.asarray(y), np.asarray(y_eval))
    module = nnx.MultiHeadAttention(
        num_heads=4,
        in_features=16,
        dropout_rate=0.5,
        decode=False,
        attention_fn=dropmask.drop_head_attention,
        rngs=nnx.Rngs(0),
    )
    assert module(x, deterministic=False, rngs=nnx.Rngs(dropout=1)).shape == (2, 5, 16)


def test_drop_head_jit_vmap_grad_bf16_and_errors():
    x = jax.random.normal(KEY, (2, 3, 4, 5)).astype(jnp.bfloat16)
    y = dropmask.drop_head(x, 0.5, KEY)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda x: dropmask.drop_head(x, 0.5, KEY))(x)), np.asarray(y)
    )
    keys = _keys(2)
    v = jax.vmap(lambda k: dropmask.drop_head(x, 0.5, k))(keys)
    np.testing.assert_array_equal(np.asarray(v[1]), np.asarray(dropmask.drop_head(x, 0.5, keys[1])))
    g = jax.grad(lambda x: jnp.sum(dropmask.drop_head(x, 0.5, KEY)))(x.astype(jnp.float32))
    assert set(np.unique(np.asarray(g)).tolist()) <= {0.0, 2.0}
    with pytest.raises(dropmask.DropmaskValueError, match="drop_head: x must be an attention"):
        dropmask.drop_head(jnp.ones((4, 5)), 0.5, KEY)
    with pytest.raises(dropmask.DropmaskValueError, match="not both"):
        dropmask.drop_head_attention(x, x, x, key=KEY, dropout_rng=KEY)


# --- token dropping --------------------------------------------------------------------


def test_drop_tokens_keeps_a_uniform_subset_of_valid_tokens_only():
    lengths = jnp.array([10, 7, 3, 0])
    mask = dropmask.sequence_mask(lengths, 10)
    x = jnp.arange(40).reshape(4, 10) + 1
    f = jax.jit(lambda k: dropmask.drop_tokens(x, 0.4, k, mask=mask))
    counts = np.zeros((4, 10))
    n = 300
    for k in _keys(n):
        kept = f(k)
        assert kept.tokens.shape == (4, 6)
        np.testing.assert_array_equal(np.asarray(kept.mask.sum(1)), [6, 5, 2, 0])
        pos = np.asarray(kept.positions)
        m = np.asarray(kept.mask)
        for b in range(4):
            p = pos[b][m[b]]
            assert (np.diff(p) > 0).all() and (p < int(lengths[b])).all()
            np.testing.assert_array_equal(np.asarray(kept.tokens[b])[m[b]], np.asarray(x[b])[p])
            counts[b, p] += 1
        assert not np.asarray(kept.tokens)[~m].any()
    for b, (length, keep) in enumerate([(10, 6), (7, 5), (3, 2)]):
        # Each valid position is kept in keep / length of the draws (binomial, 4 sigma).
        assert counts[b, :length].sum() == n * keep and counts[b, length:].sum() == 0
        p = keep / length
        sigma = np.sqrt(n * p * (1 - p))
        assert np.all(np.abs(counts[b, :length] - n * p) < 4 * sigma + 1e-9), counts[b]


def test_drop_tokens_composes_with_packed_sequences():
    packed = dropmask.pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], max_len=6)
    segment_ids = jnp.asarray(packed.segment_ids)
    kept = dropmask.drop_tokens(jnp.asarray(packed.values), 0.5, KEY, mask=segment_ids > 0)
    segments = jnp.take_along_axis(segment_ids, kept.positions, axis=1)
    assert bool(jnp.where(kept.mask, segments > 0, True).all())
    valid = np.asarray((segment_ids > 0).sum(1))
    np.testing.assert_array_equal(np.asarray(kept.mask.sum(1)), np.ceil(valid * 0.5))


def test_drop_tokens_vmap_grad_bf16_and_deterministic():
    x = jax.random.normal(KEY, (3, 8, 4)).astype(jnp.bfloat16)
    kept = dropmask.drop_tokens(x, 0.5, KEY)
    assert kept.tokens.dtype == jnp.bfloat16 and kept.tokens.shape == (3, 4, 4)
    keys = _keys(2)
    v = jax.vmap(lambda k: dropmask.drop_tokens(x, 0.5, k).positions)(keys)
    np.testing.assert_array_equal(
        np.asarray(v[1]), np.asarray(dropmask.drop_tokens(x, 0.5, keys[1]).positions)
    )
    g = jax.grad(lambda x: jnp.sum(dropmask.drop_tokens(x, 0.5, KEY).tokens))(x.astype(jnp.float32))
    per_token = np.asarray(g[..., 0])
    assert per_token.sum() == 12 and set(np.unique(per_token).tolist()) == {0.0, 1.0}
    full = dropmask.drop_tokens(x, 0.5, None, deterministic=True)
    np.testing.assert_array_equal(np.asarray(full.tokens), np.asarray(x))


@pytest.mark.parametrize(("rate", "deterministic"), [(0.0, False), (0.5, True), (0.4, False)])
def test_drop_tokens_has_one_layout_at_every_rate(rate, deterministic):
    # Padding in the middle and in front (a mask with holes): at rate 0 and in evaluation
    # the tokens kept their places while at any positive rate they moved to the front.
    mask = jnp.array([[0, 1, 1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 0]])
    x = (jnp.arange(8) + 10)[None, :, None] * jnp.ones((3, 1, 2), jnp.int32)
    kept = dropmask.drop_tokens(x, rate, KEY, mask=mask > 0, deterministic=deterministic)
    counts = np.asarray(kept.mask.sum(axis=1))
    if rate == 0.0 or deterministic:
        np.testing.assert_array_equal(counts, [5, 8, 2])
    for b in range(3):
        m, p = np.asarray(kept.mask[b]), np.asarray(kept.positions[b])
        assert m[: counts[b]].all() and not m[counts[b] :].any()  # kept first, then padding
        assert (np.diff(p[m]) > 0).all() and np.asarray(mask[b])[p[m]].all()  # in order, valid
        np.testing.assert_array_equal(np.asarray(kept.tokens[b])[m], np.asarray(x[b])[p[m]])
        assert not np.asarray(kept.tokens[b])[~m].any() and not p[~m].any()


def test_drop_tokens_bad_arguments():
    x = jnp.ones((2, 8))
    with pytest.raises(dropmask.DropmaskTypeError, match="drop_tokens: rate must be a Python"):
        jax.jit(lambda r: dropmask.drop_tokens(x, r, KEY).tokens)(0.5)
    with pytest.raises(dropmask.RateError, match=r"\[0, 1\)"):
        dropmask.drop_tokens(x, 1.0, KEY)
    with pytest.raises(dropmask.MaskShapeError, match="mask must be"):
        dropmask.drop_tokens(x, 0.5, KEY, mask=jnp.ones((8,), bool))
    with pytest.raises(dropmask.DtypeError):
        dropmask.drop_tokens(x, 0.5, KEY, mask=jnp.ones((2, 8)))
    with pytest.raises(dropmask.DropmaskValueError, match="at least 2-d"):
        dropmask.drop_tokens(jnp.ones(8), 0.5, KEY)
    with pytest.raises(dropmask.MissingKeyError):
        dropmask.drop_tokens(x, 0.5, None)


# --- R-Drop ----------------------------------------------------------------------------


def test_symmetric_kl_of_a_class_absent_from_both_passes_is_that_without_it():
    # A masked vocabulary entry: logit -inf in both passes, probability 0 in both.
    a, b = (jax.random.normal(k, (4, 6)) for k in _keys(2, 5))
    absent = jnp.array([False, True, False, False, True, False])
    a_inf, b_inf = jnp.where(absent, -jnp.inf, a), jnp.where(absent, -jnp.inf, b)
    # Jitted: one program per shape, where each call eagerly compiles each of its ops
    # (the next test calls it eagerly).
    kl = jax.jit(dropmask.symmetric_kl)
    grad = jax.jit(jax.grad(dropmask.symmetric_kl, (0, 1)))
    got = kl(a_inf, b_inf)
    want = kl(a[:, ~absent], b[:, ~absent])
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    ga, gb = grad(a_inf, b_inf)
    wa, wb = grad(a[:, ~absent], b[:, ~absent])
    np.testing.assert_allclose(np.asarray(ga[:, ~absent]), np.asarray(wa), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(gb[:, ~absent]), np.asarray(wb), rtol=1e-5, atol=1e-7)
    assert not np.asarray(ga[:, absent]).any() and not np.asarray(gb[:, absent]).any()
    # In one pass only, the divergence is infinite, as the KL is.
    assert float(kl(a_inf, b)) == np.inf


def test_symmetric_kl_matches_its_definition_and_ignores_padding():
    a, b = (jax.random.normal(k, (3, 5, 7)) for k in _keys(2, 4))
    mask = dropmask.sequence_mask(jnp.array([5, 2, 0]), 5)
    pa, pb = jax.nn.softmax(a), jax.nn.softmax(b)
    kl = 0.5 * (
        jnp.sum(pa * (jnp.log(pa) - jnp.log(pb)), -1)
        + jnp.sum(pb * (jnp.log(pb) - jnp.log(pa)), -1)
    )
    want = float(jnp.sum(jnp.where(mask, kl, 0)) / mask.sum())
    got = dropmask.symmetric_kl(a, b, mask=mask)
    assert float(got) == pytest.approx(want, rel=1e-5)
    # NaN and inf in padding change neither the value nor the (finite) gradients.
    pad = ~mask[..., None]
    a_bad = jnp.where(pad, jnp.nan, a)
    b_bad = jnp.where(pad, jnp.inf, b)
    assert float(dropmask.symmetric_kl(a_bad, b_bad, mask=mask)) == pytest.approx(want, rel=1e-5)
    ga, gb = jax.jit(jax.grad(lambda a, b: dropmask.symmetric_kl(a, b, mask=mask), (0, 1)))(
        a_bad, b_bad
    )
    assert np.isfinite(np.asarray(ga)).all() and np.isfinite(np.asarray(gb)).all()
    assert not np.asarray(ga)[np.asarray(jnp.broadcast_to(pad, a.shape))].any()
    assert float(dropmask.symmetric_kl(a, a)) == pytest.approx(0.0, abs=1e-7)
    assert float(dropmask.symmetric_kl(a, b, mask=jnp.zeros((3, 5), bool))) == 0.0
    assert (
        dropmask.symmetric_kl(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)).dtype == jnp.float32
    )
    jax.test_util.check_grads(  # jit: the numerical check evaluates the function many times
        jax.jit(lambda a: dropmask.symmetric_kl(a, b, mask=mask)),
        (a,),
        order=1,
        modes=["rev"],
        atol=1e-2,
        rtol=1e-2,
    )


def test_r_drop_passes_are_two_independent_dropout_passes():
    x = jnp.ones((4, 16))

    def apply(k):
        return dropmask.dropout(x, 0.5, k)

    a, b = jax.jit(lambda k: dropmask.r_drop_passes(apply, k))(KEY)
    ka, kb = jax.random.split(KEY)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(apply(ka)))
    np.testing.assert_array_equal(np.asarray(b), np.asarray(apply(kb)))
    assert bool((a != b).any())


def test_r_drop_bad_arguments():
    a = jnp.ones((2, 3))
    with pytest.raises(dropmask.MaskShapeError, match="symmetric_kl: logits_a and logits_b"):
        dropmask.symmetric_kl(a, jnp.ones((2, 4)))
    with pytest.raises(dropmask.MaskShapeError, match="one flag per position"):
        dropmask.symmetric_kl(a, a, mask=jnp.ones((3,), bool))
    with pytest.raises(dropmask.DtypeError):
        dropmask.symmetric_kl(jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), jnp.int32))
    with pytest.raises(dropmask.DropmaskTypeError, match="r_drop_passes: apply"):
        dropmask.r_drop_passes(None, KEY)
    with pytest.raises(dropmask.DropmaskTypeError, match="r_drop_passes: key"):
        dropmask.r_drop_passes(lambda k: k, 0)


# --- one precision: a static rate and the same rate as a JAX scalar ---------------------

STRUCTURED_CALLS = {
    "drop_block": lambda r, k: dropmask.drop_block(jnp.ones((8, 14, 14, 3)), r, k, block_size=3),
    "drop_head": lambda r, k: dropmask.drop_head(jnp.ones((4, 10, 8, 16)), r, k),
    "layer_drop": lambda r, k: dropmask.layer_drop(lambda x: x + 1.0, jnp.zeros(3), r, k),
    "zoneout": lambda r, k: dropmask.zoneout(jnp.zeros((4, 64)), jnp.ones((4, 64)), r, k),
    "drop_path": lambda r, k: dropmask.drop_path(jnp.ones((64, 8)), r, k),
    "alpha_dropout": lambda r, k: dropmask.alpha_dropout(jnp.ones((4, 96)), r, k),
    "word_dropout": lambda r, k: dropmask.word_dropout(
        jnp.ones((4, 96), jnp.int32), r, k, unk_id=0
    ),
}


# Every rate for the functions with arithmetic of their own between the rate and the
# threshold (drop_block's seed probability, word_dropout's drop probability,
# alpha_dropout's constants); two for those whose keep probability is 1 - rate, as
# dropout's is, which test_random.py draws static and traced at eight rates.
_OWN_ARITHMETIC = ("alpha_dropout", "drop_block", "word_dropout")
_RATES = (0.05, 0.1, 0.2, 0.3, 0.5)


# Fast: every function at 0.1, and those with arithmetic of their own at either end of
# the rates too; the slow suite adds the rates between.
@pytest.mark.parametrize(
    ("rate", "name"),
    covering(
        [
            (rate, name)
            for rate in _RATES
            for name in sorted(STRUCTURED_CALLS)
            if name in _OWN_ARITHMETIC or rate in (0.1, 0.3)
        ],
        [
            (rate, name)
            for rate in _RATES
            for name in sorted(STRUCTURED_CALLS)
            if rate == 0.1 or (name in _OWN_ARITHMETIC and rate in (_RATES[0], _RATES[-1]))
        ],
        unpack=True,
    ),
)
def test_a_static_rate_and_a_jax_scalar_give_the_same_result(name, rate):
    """Every function that takes a run-time rate draws the static rate's mask for the
    same value as a float32 scalar, eagerly and under jit, over several keys."""
    call = STRUCTURED_CALLS[name]
    for key in _keys(3, seed=5):
        static = call(rate, key)
        for got in (call(jnp.float32(rate), key), jax.jit(call)(jnp.float32(rate), key)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(static), err_msg=name)


def test_drop_head_attention_errors_name_it_and_a_callback_names_its_own_calls():
    x = jnp.ones((2, 3, 4, 8))
    with pytest.raises(dropmask.RateError, match=r"^drop_head_attention: dropout_rate must be in"):
        dropmask.drop_head_attention(
            x, x, x, dropout_rate=1.5, dropout_rng=KEY, deterministic=False
        )

    def einsum(*args, **kwargs):
        dropmask.dropout(jnp.arange(3), 0.5, KEY)  # the user's own (bad) call
        return jnp.einsum(*args, **kwargs)

    # The user's callback runs inside drop_head_attention; its error names what it called.
    with pytest.raises(dropmask.DtypeError, match=r"^dropout\b"):
        dropmask.drop_head_attention(
            x, x, x, qk_attn_weights_einsum=einsum, attn_weights_value_einsum=jnp.einsum
        )


_Q = jnp.ones((1, 3, 2, 4))
# Bad calls of the attention drop_head_attention runs: (q, k, v, keywords).
_BAD_ATTENTION = {
    "q and k depths": (_Q, jnp.ones((1, 3, 2, 5)), jnp.ones((1, 3, 2, 5)), {}),
    "ranks": (_Q, _Q[0], _Q[0], {}),
    "heads": (_Q, jnp.ones((1, 3, 3, 4)), jnp.ones((1, 3, 3, 4)), {}),
    "mask shape": (_Q, _Q, _Q, {"mask": jnp.ones((3, 3, 3), bool)}),
    "mask dtype": (_Q, _Q, _Q, {"mask": jax.random.split(KEY, 3)}),
    "bias shape": (_Q, _Q, _Q, {"bias": jnp.ones((3, 4))}),
    "boolean bias": (_Q, _Q, _Q, {"bias": jnp.ones((3, 3), bool)}),
    "integer inputs": (*(jnp.ones((1, 3, 2, 4), jnp.int32),) * 3, {}),
    "kv_lengths": (_Q, _Q, _Q, {"kv_lengths": jnp.array([5])}),
    "window": (_Q, _Q, _Q, {"window": (-1, 0)}),
    "algorithm": (_Q, _Q, _Q, {"algorithm": "fastest"}),
    "one einsum": (_Q, _Q, _Q, {"qk_attn_weights_einsum": jnp.einsum}),
}


@pytest.mark.parametrize("case", sorted(_BAD_ATTENTION))
def test_drop_head_attention_reports_attentions_errors_under_its_own_name(case):
    """Every error of the attention it runs names drop_head_attention, the function
    called, with dot_product_attention's message otherwise."""
    q, k, v, kwargs = _BAD_ATTENTION[case]
    with pytest.raises(dropmask.DropmaskError) as direct:
        dropmask.dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(dropmask.DropmaskError) as wrapped:
        dropmask.drop_head_attention(q, k, v, **kwargs)
    message = str(direct.value)
    assert message.startswith("dot_product_attention"), message
    assert type(wrapped.value) is type(direct.value)
    assert str(wrapped.value) == "drop_head_attention" + message.removeprefix(
        "dot_product_attention"
    )
