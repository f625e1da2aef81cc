"""dropmask.linen: a drop-in for flax.linen.Dropout and the variant layers."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dropmask
from dropmask import linen as dl


class MLP(nn.Module):
    dropout_cls: type
    impl_kwargs: dict

    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Dense(16)(x)
        x = self.dropout_cls(0.3, deterministic=not training, **self.impl_kwargs)(x)
        x = nn.Dense(16)(nn.relu(x))
        x = self.dropout_cls(0.5, broadcast_dims=(0,), **self.impl_kwargs)(x, not training)
        return nn.Dense(3)(x)


# dl.Dropout(impl="flax") in Flax's place, outputs and gradients bit for bit, is
# test_linen_swap.py's test_impl_flax_is_bit_identical_to_not_swapping (plain-False).
@pytest.mark.slow
def test_swapping_flax_dropout_gives_identical_outputs_and_gradients():
    x = jax.random.normal(jax.random.key(0), (8, 5))
    theirs = MLP(nn.Dropout, {})
    ours = MLP(dl.Dropout, {"impl": "flax"})
    params = theirs.init(jax.random.key(1), x, training=False)
    rngs = {"dropout": jax.random.key(2)}

    def loss(model, p):
        return jnp.sum(model.apply(p, x, training=True, rngs=rngs) ** 2)

    np.testing.assert_array_equal(
        np.asarray(ours.apply(params, x, training=True, rngs=rngs)),
        np.asarray(theirs.apply(params, x, training=True, rngs=rngs)),
    )
    g_ours, g_theirs = (
        jax.grad(lambda p: loss(ours, p))(params),
        jax.grad(lambda p: loss(theirs, p))(params),
    )
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), g_ours, g_theirs
    )


def test_default_impl_trains_evaluates_and_is_reproducible():
    x = jnp.ones((4, 5))
    model = MLP(dl.Dropout, {})
    params = model.init(jax.random.key(1), x, training=False)
    a = model.apply(params, x, training=True, rngs={"dropout": jax.random.key(3)})
    b = model.apply(params, x, training=True, rngs={"dropout": jax.random.key(3)})
    c = model.apply(params, x, training=True, rngs={"dropout": jax.random.key(4)})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    evals = model.apply(params, x, training=False)
    np.testing.assert_array_equal(
        np.asarray(evals), np.asarray(model.apply(params, x, training=False))
    )


def test_merge_param_errors_like_flax():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="passed to the constructor and at call time"):
        dl.Dropout(0.5, deterministic=True).apply({}, x, deterministic=True)
    with pytest.raises(ValueError, match="must be passed to the constructor or at call time"):
        dl.Dropout(0.5).apply({}, x)


def test_missing_stream_names_it_and_shows_fix():
    with pytest.raises(dropmask.MissingKeyError, match=r"rngs=\{'noise': jax.random.key\(0\)\}"):
        dl.Dropout(0.5, rng_collection="noise").apply({}, jnp.ones(3), deterministic=False)


def test_init_in_training_mode_falls_back_to_params_stream_like_flax():
    x = jnp.ones((2, 3))
    ours = dl.Dropout(0.5, deterministic=False, impl="flax").init_with_output(jax.random.key(0), x)[
        0
    ]
    theirs = nn.Dropout(0.5, deterministic=False).init_with_output(jax.random.key(0), x)[0]
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_explicit_rng_argument_and_custom_collection():
    x, key = jnp.ones((6, 6)), jax.random.key(9)
    y = dl.Dropout(0.5, deterministic=False).apply({}, x, rng=key)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(dropmask.dropout(x, 0.5, key)))
    z = dl.Dropout(0.5, rng_collection="attn").apply({}, x, False, rngs={"attn": key})
    assert z.shape == x.shape


def test_traced_rate_field_for_schedules():
    x = jnp.ones((64, 64))

    @jax.jit
    def run(rate):
        return dl.Dropout(rate, deterministic=False).apply(
            {}, x, rngs={"dropout": jax.random.key(0)}
        )

    assert float(jnp.mean(run(jnp.float32(0.0)))) == 1.0
    assert float(jnp.mean(run(jnp.float32(1.0)))) == 0.0


@pytest.mark.parametrize("rate", [0.0, 1.0, jnp.float32(0.0), jnp.float32(1.0)])
def test_rate_zero_or_one_needs_no_rng_stream(rate):
    # Flax returns before make_rng when rate is 0 or 1 (a float or a concrete JAX
    # scalar), so no 'dropout' stream is needed; a layer that fetched a key would raise.
    x = jnp.ones((4, 4))
    ours = dl.Dropout(rate, deterministic=False).apply({}, x)
    theirs = nn.Dropout(rate, deterministic=False).apply({}, x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_variant_layers():
    rngs = {"dropout": jax.random.key(0)}
    tokens = jnp.arange(1, 101, dtype=jnp.int32).reshape(10, 10)
    out = dl.WordDropout(0.5, unk_id=0).apply({}, tokens, False, rngs=rngs)
    assert out.dtype == jnp.int32 and 0 < float(jnp.mean(out == 0)) < 1
    assert dl.WordDropout(0.5, unk_id=0, deterministic=True).apply({}, tokens) is tokens
    x = jnp.ones((16, 4))
    y = dl.DropPath(0.5).apply({}, x, False, rngs=rngs)
    assert all(len(set(row.tolist())) == 1 for row in np.asarray(y))
    assert dl.GaussianDropout(0.2).apply({}, x, False, rngs=rngs).shape == x.shape
    assert dl.AlphaDropout(0.2).apply({}, x, False, rngs=rngs).shape == x.shape
    for layer in (dl.GaussianDropout(0.2), dl.AlphaDropout(0.2), dl.DropPath(0.2)):
        assert layer.apply({}, x, True) is x


VARIANT_LAYERS = [
    lambda **kw: dl.Dropout(0.4, **kw),
    lambda **kw: dl.WordDropout(0.4, unk_id=0, **kw),
    lambda **kw: dl.DropPath(0.4, **kw),
    lambda **kw: dl.GaussianDropout(0.4, **kw),
    lambda **kw: dl.AlphaDropout(0.4, **kw),
]


@pytest.mark.parametrize("make", VARIANT_LAYERS)
def test_every_layer_shares_key_fetching_and_mode_resolution(make):
    x = jnp.arange(24).reshape(4, 6)
    x = x if isinstance(make(), dl.WordDropout) else x.astype(jnp.float32) / 7
    key = jax.random.key(1)
    # a key from the stream, an explicit rng, or (at init) the 'params' stream
    from_stream = make(deterministic=False).apply({}, x, rngs={"dropout": key})
    again = make().apply({}, x, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(np.asarray(from_stream), np.asarray(again))
    from_rng = make(deterministic=False).apply({}, x, rng=key)
    from_params = make(deterministic=False).init_with_output(key, x)[0]
    for out in (from_stream, from_rng, from_params):
        assert not np.array_equal(np.asarray(out), np.asarray(x))
    np.testing.assert_array_equal(
        np.asarray(make().apply({}, x, deterministic=True)), np.asarray(x)
    )
    with pytest.raises(dropmask.MissingKeyError, match=r"The rngs given are \['drop'\]"):
        make(deterministic=False).apply({}, x, rngs={"drop": key})


def test_int_broadcast_dims_as_in_the_functional_api():
    x, key = jax.random.normal(jax.random.key(0), (4, 40)), jax.random.key(2)
    ours = dl.Dropout(0.5, broadcast_dims=0, deterministic=False).apply({}, x, rng=key)
    np.testing.assert_array_equal(
        np.asarray(ours), np.asarray(dropmask.dropout(x, 0.5, key, broadcast_dims=(0,)))
    )


@pytest.mark.parametrize(
    ("layer", "fn"),
    [
        # residual is the last field, so Flax-style positional construction still works.
        (lambda mode: dl.Dropout(0.2, (), False, "dropout", "fast", None, mode), dropmask.dropout),
        (lambda mode: dl.DropPath(0.2, 0, False, "dropout", "fast", mode), dropmask.drop_path),
        (
            lambda mode: dl.AlphaDropout(0.2, (), False, "dropout", "fast", mode),
            dropmask.alpha_dropout,
        ),
    ],
)
def test_residual_field_reaches_the_core(layer, fn):
    x, key = jax.random.normal(jax.random.key(0), (64, 128)), jax.random.key(1)
    for mode, keeps_words in (("mask", True), ("none", False)):
        y, vjp_fn = jax.vjp(lambda x, m=mode: layer(m).apply({}, x, rng=key), x)
        want, want_vjp = jax.vjp(lambda x, m=mode: fn(x, 0.2, key, residual=m), x)
        leaves = [(leaf.shape, str(leaf.dtype)) for leaf in jax.tree.leaves(vjp_fn)]
        assert leaves == [(leaf.shape, str(leaf.dtype)) for leaf in jax.tree.leaves(want_vjp)]
        # A key's own data (2 or 4 words) is not a saved mask; the packed flags are
        # bytes, halves or words, by the rate's field width.
        packed = ("uint8", "uint16", "uint32")
        words = [s for s, dtype in leaves if dtype in packed and s not in ((2,), (4,))]
        assert bool(words) == keeps_words, (mode, leaves)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
        np.testing.assert_array_equal(np.asarray(vjp_fn(x)[0]), np.asarray(want_vjp(x)[0]))


def test_unknown_residual_field_names_the_layer():
    layer = dl.Dropout(0.2, deterministic=False, residual="bits")  # type: ignore[arg-type]
    with pytest.raises(dropmask.DropmaskValueError, match=r"dropmask.linen.Dropout: residual"):
        layer.apply({}, jnp.ones(4), rng=jax.random.key(0))


@pytest.mark.parametrize(
    ("layer", "bad_input", "error"),
    [
        (dl.Dropout(0.5), jnp.arange(4), dropmask.DtypeError),
        (dl.DropPath(0.5), jnp.arange(4), dropmask.DtypeError),
        (dl.AlphaDropout(0.5), jnp.arange(4), dropmask.DtypeError),
        (dl.GaussianDropout(0.5), jnp.arange(4), dropmask.DtypeError),
        (dl.WordDropout(0.5, unk_id=1), jnp.ones(4), dropmask.DtypeError),
        (dl.DropBlock(0.5, block_size=2), jnp.ones((2, 4)), dropmask.DropmaskValueError),
        (dl.DropHead(0.5), jnp.ones((2, 4)), dropmask.DropmaskValueError),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else None,
)
def test_an_error_of_the_function_a_layer_calls_names_the_layer(layer, bad_input, error):
    name = f"dropmask.linen.{type(layer).__name__}"
    with pytest.raises(error, match=rf"^{name}\b"):
        layer.apply({}, bad_input, deterministic=False, rng=jax.random.key(0))
    # The layer's name ends with its call: the function called alone names itself.
    with pytest.raises(dropmask.DtypeError, match=r"^dropout\b"):
        dropmask.dropout(jnp.arange(4), 0.5, jax.random.key(0))
