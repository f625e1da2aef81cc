"""What reverse-mode autodiff keeps for dropout's backward pass (``residual=``).

``"mask"`` keeps the packed keep-words (1 bit per element); ``"none"`` keeps the key
words and draws the mask again. Both must give the same masks, outputs and gradients
under every transformation, and a user's ``jax.checkpoint`` policy must decide over
the default.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec
from tests.covering import covering

import dropmask
from dropmask._random import _draw, _fast_mask

MODES = ("mask", "none")
SHAPE = (256, 512)
# The packed keep-flags at a rate of 0.1 (16-bit fields, or 32-bit for a traced rate):
# one byte per 8 elements along the last axis, one or two Threefry calls per byte.
PARTS = ((SHAPE[0], SHAPE[1] // 8), "uint8")
POLICIES = jax.checkpoint_policies


def _x(shape=SHAPE, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(42), shape, dtype=jnp.float32).astype(dtype)


def _residuals(f, *args):
    """The array leaves ``jax.vjp`` keeps for ``f``'s backward pass."""
    _, vjp_fn = jax.vjp(f, *args)
    return [leaf for leaf in jax.tree.leaves(vjp_fn) if hasattr(leaf, "nbytes")]


def _avals(leaves):
    return sorted((leaf.shape, str(leaf.dtype)) for leaf in leaves)


def _rates():
    return [0.1, jnp.float32(0.1)]


# --- residual bytes -------------------------------------------------------------


_FNS = (dropmask.dropout, dropmask.alpha_dropout)
_DTYPES = (jnp.float32, jnp.bfloat16)
_DEFAULT_CASES = [(fn, t, d) for fn in _FNS for t in (False, True) for d in _DTYPES]


# Fast: each function, rate and dtype once (dropout static in float32, alpha_dropout
# traced in bfloat16); the words are the same whatever the three.
@pytest.mark.parametrize(
    ("fn", "traced", "dtype"),
    covering(
        _DEFAULT_CASES,
        [(dropmask.dropout, False, jnp.float32), (dropmask.alpha_dropout, True, jnp.bfloat16)],
        unpack=True,
    ),
    ids=[f"{fn.__name__}-{t}-{jnp.dtype(d).name}" for fn, t, d in _DEFAULT_CASES],
)
def test_default_keeps_one_bit_per_element(dtype, traced, fn):
    x, key = _x(dtype=dtype), jax.random.key(0)
    rate = jnp.float32(0.1) if traced else 0.1
    leaves = _residuals(lambda x: fn(x, rate, key), x)
    per_element = sum(leaf.nbytes for leaf in leaves) / x.size
    assert per_element <= 0.13, _avals(leaves)
    assert PARTS in _avals(leaves), _avals(leaves)


# Fast: each function once, the dtypes in turn.
@pytest.mark.parametrize(
    ("fn", "dtype"),
    covering(
        [(fn, d) for fn in _FNS for d in _DTYPES],
        [(dropmask.dropout, jnp.float32), (dropmask.alpha_dropout, jnp.bfloat16)],
        unpack=True,
    ),
    ids=[f"{fn.__name__}-{jnp.dtype(d).name}" for fn in _FNS for d in _DTYPES],
)
def test_none_keeps_only_the_key_words(dtype, fn):
    x, key = _x(dtype=dtype), jax.random.key(0)
    leaves = _residuals(lambda x: fn(x, 0.1, key, residual="none"), x)
    assert _avals(leaves) == [((2,), "uint32")]  # the Threefry key's own words
    assert sum(leaf.nbytes for leaf in leaves) == 8
    rbg = jax.random.key(0, impl="rbg")  # another impl: its four key words
    assert _avals(_residuals(lambda x: fn(x, 0.1, rbg, residual="none"), x)) == [((4,), "uint32")]


def test_none_with_a_traced_rate_adds_only_scalars():
    x, key = _x(), jax.random.key(0)
    leaves = _residuals(lambda x: dropmask.dropout(x, jnp.float32(0.1), key, residual="none"), x)
    assert sum(leaf.nbytes for leaf in leaves) <= 16 + 8, _avals(leaves)


def test_drop_path_keeps_one_bit_per_example():
    x, key = _x((64, 8, 16)), jax.random.key(0)
    leaves = _residuals(lambda x: dropmask.drop_path(x, 0.2, key), x)
    # 64 decisions pack into 2 words; nothing per element of x.
    assert sum(leaf.nbytes for leaf in leaves) <= 16 + 2 * 4, _avals(leaves)
    none = _residuals(lambda x: dropmask.drop_path(x, 0.2, key, residual="none"), x)
    assert _avals(none) == [((2,), "uint32")]


def test_flax_impl_is_unaffected():
    x, key = _x((64, 32)), jax.random.key(0)
    for mode in MODES:
        leaves = _residuals(
            lambda x, m=mode: dropmask.dropout(x, 0.1, key, impl="flax", residual=m), x
        )
        assert ((64, 32), "bool") in _avals(leaves), (mode, _avals(leaves))


# --- same masks, outputs and gradients in both modes ------------------------------


def _loss(x, key, rate, mode, impl="fast"):
    return jnp.sum(jnp.sin(dropmask.dropout(x, rate, key, impl=impl, residual=mode)) ** 2)


def _all_transforms(x, key, rate, mode, impl):
    loss = functools.partial(_loss, rate=rate, mode=mode, impl=impl)
    keys = jax.random.split(key, 3)

    def scanned(x):
        def body(total, k):
            return total + loss(x, k), None

        return jax.lax.scan(body, jnp.zeros((), x.dtype), keys)[0]

    tangent = jnp.cos(x)
    return {
        "forward": dropmask.dropout(x, rate, key, impl=impl, residual=mode),
        "grad": jax.grad(loss)(x, key),
        "vmap grad": jax.vmap(jax.grad(loss), in_axes=(None, 0))(x, keys),
        "checkpoint grad": jax.grad(jax.checkpoint(loss))(x, key),
        "scan grad": jax.jit(jax.grad(scanned))(x),
        "jvp": jax.jvp(lambda x: loss(x, key), (x,), (tangent,))[1],
        "vjp": jax.vjp(lambda x: dropmask.dropout(x, rate, key, impl=impl, residual=mode), x)[1](
            tangent
        )[0],
    }


# Each pair of values of two of (impl, rate, dtype) meets once: the generator, how the
# threshold is computed and the dtype the mask scales each reach the saved and the
# redrawn mask apart from the others. Fast: every value of each once (the default
# generator with both rates and both dtypes); the slow suite adds the flax generator's
# traced rate in float32, completing the pairs.
@pytest.mark.parametrize(
    ("impl", "rate", "dtype"),
    [
        pytest.param("fast", 0.1, jnp.float32, id="fast-static-float32"),
        pytest.param("fast", jnp.float32(0.1), jnp.bfloat16, id="fast-traced-bfloat16"),
        pytest.param("flax", 0.1, jnp.bfloat16, id="flax-static-bfloat16"),
        pytest.param(
            "flax", jnp.float32(0.1), jnp.float32, id="flax-traced-float32", marks=pytest.mark.slow
        ),
    ],
)
def test_modes_agree_bit_for_bit(dtype, rate, impl):
    x, key = _x((64, 96), dtype), jax.random.key(5)

    def compiled(mode):
        # One program per mode holds every transformation (eager dispatch would
        # compile each primitive apart); the rate stays a run-time value when traced.
        if isinstance(rate, float):
            return jax.jit(lambda x, k: _all_transforms(x, k, rate, mode, impl))(x, key)
        return jax.jit(lambda x, k, r: _all_transforms(x, k, r, mode, impl))(x, key, rate)

    saved, drawn = compiled("mask"), compiled("none")
    for mode in MODES:  # and eagerly, as called outside any transformation
        eager = dropmask.dropout(x, rate, key, impl=impl, residual=mode)
        np.testing.assert_array_equal(np.asarray(eager), np.asarray(saved["forward"]), mode)
    for name in saved:
        assert saved[name].dtype == drawn[name].dtype, name
        np.testing.assert_array_equal(np.asarray(saved[name]), np.asarray(drawn[name]), name)


@pytest.mark.parametrize("rate", _rates(), ids=["static", "traced"])
def test_gradient_is_the_mask_over_the_keep_probability(rate):
    x, key = _x((64, 96)), jax.random.key(8)
    g = jax.grad(lambda x: dropmask.dropout(x, rate, key).sum())(x)
    keep = np.asarray(dropmask.keep_mask(key, x.shape, rate))
    keep_prob = 0.9 if isinstance(rate, float) else 1.0 - jnp.float32(rate)
    realised = float(_fast_mask.threshold(keep_prob).realised)
    want = np.where(keep, np.float32(1) / np.float32(realised), np.float32(0))
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=0)


def test_modes_agree_inside_shard_map():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    spec = PartitionSpec("d")
    x, key = _x((64, 96)), jax.random.key(2)

    def grads(mode):
        def local(x, key):
            offset = (jax.lax.axis_index("d") * x.shape[0], 0)
            y = dropmask.dropout(x, 0.3, key, global_shape=(64, 96), offset=offset, residual=mode)
            return jnp.sin(y)

        f = jax.shard_map(local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec)
        return jax.jit(jax.grad(lambda x: jnp.sum(f(x, key) ** 2)))(x)

    unsharded = jax.grad(lambda x: jnp.sum(jnp.sin(dropmask.dropout(x, 0.3, key)) ** 2))(x)
    for mode in MODES:
        np.testing.assert_array_equal(np.asarray(grads(mode)), np.asarray(unsharded), mode)


# --- a user's checkpoint policy decides -------------------------------------------


def _layer(mode):
    key = jax.random.key(3)
    return lambda x: jnp.sin(dropmask.dropout(x, 0.1, key, residual=mode))


@pytest.mark.parametrize(
    "policy",
    [POLICIES.nothing_saveable, POLICIES.save_anything_except_these_names("dropout_mask")],
    ids=["nothing_saveable", "save_anything_except"],
)
def test_a_policy_that_drops_the_name_draws_again(policy):
    x = _x()
    saved = _residuals(jax.checkpoint(_layer("mask"), policy=policy), x)
    drawn = _residuals(jax.checkpoint(_layer("none"), policy=policy), x)
    assert PARTS not in _avals(saved), _avals(saved)
    assert _avals(saved) == _avals(drawn)
    g_saved = jax.grad(lambda x: jax.checkpoint(_layer("mask"), policy=policy)(x).sum())(x)
    g_plain = jax.grad(lambda x: _layer("none")(x).sum())(x)
    np.testing.assert_array_equal(np.asarray(g_saved), np.asarray(g_plain))


def test_nothing_saveable_around_the_layer_keeps_no_per_element_mask():
    x = _x()
    leaves = _residuals(jax.checkpoint(_layer("mask"), policy=POLICIES.nothing_saveable), x)
    # The layer's input (which sin needs) and the key, nothing else.
    assert _avals(leaves) == [((), "key<fry>"), (SHAPE, "float32")]


def test_a_policy_that_saves_the_name_keeps_the_words_even_with_none():
    x = _x()
    policy = POLICIES.save_only_these_names("dropout_mask")
    leaves = _residuals(jax.checkpoint(_layer("none"), policy=policy), x)
    assert PARTS in _avals(leaves), _avals(leaves)


# --- paths and backends -------------------------------------------------------------


@pytest.mark.parametrize("path", _fast_mask.PATHS)
def test_only_the_packed_paths_name_their_words(path):
    shape, thr = (64, 128), _fast_mask.threshold(0.9)
    words = _fast_mask.key_words(jax.random.key(1))

    def apply(x, w):
        return jnp.where(_fast_mask.keep_from_words(w, shape, thr, path=path), x, 0.0)

    f = jax.checkpoint(apply, policy=POLICIES.save_only_these_names(_fast_mask.MASK_NAME))
    x = _x(shape)
    leaves = _residuals(lambda x: f(x, words), x)
    packed = ((64, 128 // 8), "uint8") in _avals(leaves)
    assert packed == (path != "per_element"), _avals(leaves)
    assert sum(leaf.nbytes for leaf in leaves) <= 64 * 4 * 4 + 16, _avals(leaves)
    g = jax.grad(lambda x: f(x, words).sum())(x)
    want = _fast_mask.keep_from_words(words, shape, thr, path="per_element")
    np.testing.assert_array_equal(np.asarray(g), np.asarray(want, np.float32))


def test_backends_without_packed_words_keep_only_the_key(monkeypatch):
    monkeypatch.setattr(_draw, "_packs_words", lambda: False)
    x, key = _x(), jax.random.key(0)
    leaves = _residuals(lambda x: dropmask.dropout(x, 0.1, key), x)
    assert _avals(leaves) == [((2,), "uint32")]


# Fast: the words with a static rate, the key with a run-time one.
@pytest.mark.parametrize(
    ("rate", "packs"),
    [
        pytest.param(0.3, True, id="static-words"),
        pytest.param(0.3, False, id="static-key", marks=pytest.mark.slow),
        pytest.param(jnp.float32(0.3), True, id="run_time-words", marks=pytest.mark.slow),
        pytest.param(jnp.float32(0.3), False, id="run_time-key"),
    ],
)
def test_a_kept_mask_gives_the_flags_draw_gives(monkeypatch, packs, rate):
    # A caller with its own backward pass keeps the mask as `Kept` (the packed words,
    # or the key where the backend packs none) and rebuilds the same flags from it.
    monkeypatch.setattr(_draw, "_packs_words", lambda: packs)
    key, shape = jax.random.key(7), (3, 40, 70)
    p = 1.0 - rate

    def both(key):
        kept = _draw.draw(key, shape, p, "fast", _draw.kept, caller="test")
        flags = _draw.draw(key, shape, p, "fast", _draw.flags_only, caller="test")
        return kept, kept.flags(), flags

    kept, rebuilt, flags = jax.jit(both)(key)
    np.testing.assert_array_equal(rebuilt, flags)
    assert (kept.words is not None) == packs
    if packs:  # one bit per flag, nothing of the flags' size
        assert kept.words.nbytes * 8 <= math.prod(shape) * 1.1
    np.testing.assert_allclose(kept.realised, 0.7, atol=2.0**-16)


# --- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: dropmask.dropout(jnp.ones(4), 0.1, jax.random.key(0), residual="bits"),
        lambda: dropmask.drop_path(jnp.ones(4), 0.1, jax.random.key(0), residual=None),
        lambda: dropmask.alpha_dropout(jnp.ones(4), 0.1, jax.random.key(0), residual="Mask"),
    ],
)
def test_unknown_residual_is_rejected_before_any_work(call):
    with pytest.raises(dropmask.DropmaskError, match=r"residual must be one of \('mask', 'none'\)"):
        call()
