"""dropmask.nnx: a drop-in for flax.nnx.Dropout and the variant layers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dropmask
from dropmask import nnx as dnnx


class MLP(nnx.Module):
    def __init__(self, dropout_cls, rngs: nnx.Rngs, **kwargs):
        self.linear = nnx.Linear(4, 8, rngs=rngs)
        self.dropout = dropout_cls(0.5, rngs=rngs, **kwargs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(self.linear(x)))


# dnnx.Dropout(impl="flax") in Flax's place over steps, outputs, gradients and streams bit
# for bit, is test_nnx_swap.py's test_impl_flax_is_bit_identical_and_the_state_is_unchanged.
@pytest.mark.slow
def test_swapping_nnx_dropout_gives_identical_outputs_and_gradients():
    x = jax.random.normal(jax.random.key(0), (16, 4))
    ours = MLP(dnnx.Dropout, nnx.Rngs(params=0, dropout=1), impl="flax")
    theirs = MLP(nnx.Dropout, nnx.Rngs(params=0, dropout=1))
    for _ in range(3):  # the forked stream advances identically
        np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(theirs(x)))

    def loss(model):
        return jnp.sum(model(x) ** 2)

    g_ours, g_theirs = nnx.grad(loss)(ours), nnx.grad(loss)(theirs)
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        nnx.state(g_ours, nnx.Param),
        nnx.state(g_theirs, nnx.Param),
    )


def test_train_eval_and_view():
    x = jnp.ones((8, 4))
    model = MLP(dnnx.Dropout, nnx.Rngs(params=0, dropout=1))
    model.eval()
    a, b = model(x), model(x)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    model.train()
    assert not np.array_equal(np.asarray(model(x)), np.asarray(model(x)))
    frozen = nnx.view(model, deterministic=True)
    np.testing.assert_array_equal(np.asarray(frozen(x)), np.asarray(a))


def test_call_time_arguments_take_precedence():
    x = jnp.ones((32,))
    layer = dnnx.Dropout(0.5, deterministic=True)
    assert layer(x) is x
    key = jax.random.key(3)
    y = layer(x, deterministic=False, rngs=key)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(dropmask.dropout(x, 0.5, key)))
    z = layer(x, deterministic=False, rngs=nnx.Rngs(dropout=3))
    assert z.shape == x.shape


def test_errors():
    layer = dnnx.Dropout(0.5)
    with pytest.raises(dropmask.MissingKeyError, match=r"rngs=nnx.Rngs\(dropout=0\)"):
        layer(jnp.ones(3))
    with pytest.raises(ValueError, match="No `deterministic`"):
        dnnx.Dropout(0.5, deterministic=None, rngs=nnx.Rngs(0))(jnp.ones(3))
    with pytest.raises(TypeError, match="rngs must be"):
        dnnx.Dropout(0.5, rngs=3)  # type: ignore[arg-type]


def test_jit_with_nnx_transforms():
    model = MLP(dnnx.Dropout, nnx.Rngs(params=0, dropout=1))

    @nnx.jit
    def step(model, x):
        return model(x)

    x = jnp.ones((4, 4))
    assert not np.array_equal(np.asarray(step(model, x)), np.asarray(step(model, x)))


def test_variant_layers():
    rngs = nnx.Rngs(dropout=0)
    tokens = jnp.arange(1, 101, dtype=jnp.int32)
    out = dnnx.WordDropout(0.5, unk_id=0, rngs=rngs)(tokens)
    assert out.dtype == jnp.int32 and 0 < float(jnp.mean(out == 0)) < 1
    x = jnp.ones((16, 4))
    y = dnnx.DropPath(0.5, rngs=rngs)(x)
    assert all(len(set(row.tolist())) == 1 for row in np.asarray(y))
    for layer in (
        dnnx.GaussianDropout(0.2, rngs=rngs),
        dnnx.AlphaDropout(0.2, rngs=rngs),
        dnnx.Dropout(0.2, broadcast_dims=(0,), rngs=rngs),
    ):
        assert layer(x).shape == x.shape
        assert layer(x, deterministic=True) is x


def test_layers_share_one_base_and_only_declare_what_they_use():
    rngs = nnx.Rngs(dropout=0)
    layers = [
        dnnx.Dropout(0.3, rngs=rngs),
        dnnx.WordDropout(0.3, unk_id=0, rngs=rngs),
        dnnx.DropPath(0.3, rngs=rngs),
        dnnx.GaussianDropout(0.3, rngs=rngs),
        dnnx.AlphaDropout(0.3, rngs=rngs),
    ]
    for layer in layers:
        assert layer.rng_collection == "dropout" and layer.deterministic is False
    assert not hasattr(layers[3], "impl")  # Gaussian noise has one generator
    assert all(hasattr(layer, "impl") for layer in layers if layer is not layers[3])


def test_int_broadcast_dims_and_complex_inputs():
    x, key = jax.random.normal(jax.random.key(0), (4, 40)), jax.random.key(2)
    ours = dnnx.Dropout(0.5, broadcast_dims=0)(x, rngs=key)
    np.testing.assert_array_equal(
        np.asarray(ours), np.asarray(dropmask.dropout(x, 0.5, key, broadcast_dims=(0,)))
    )
    z = dnnx.Dropout(0.5)(jax.lax.complex(x, -x), rngs=key)
    np.testing.assert_array_equal(np.asarray(z.imag), -np.asarray(z.real))
    with pytest.raises(dropmask.DropmaskTypeError, match=r"broadcast_dims=\(\) for none"):
        dnnx.Dropout(0.5, broadcast_dims=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "fn"),
    [
        (lambda mode: dnnx.Dropout(0.2, residual=mode), dropmask.dropout),
        (lambda mode: dnnx.DropPath(0.2, residual=mode), dropmask.drop_path),
        (lambda mode: dnnx.AlphaDropout(0.2, residual=mode), dropmask.alpha_dropout),
    ],
)
def test_residual_argument_reaches_the_core(make, fn):
    x, key = jax.random.normal(jax.random.key(0), (64, 128)), jax.random.key(1)
    for mode, keeps_words in (("mask", True), ("none", False)):
        layer = make(mode)
        assert layer.residual == mode
        y, vjp_fn = jax.vjp(lambda x, layer=layer: layer(x, rngs=key), x)
        want, want_vjp = jax.vjp(lambda x, m=mode: fn(x, 0.2, key, residual=m), x)
        leaves = [(leaf.shape, str(leaf.dtype)) for leaf in jax.tree.leaves(vjp_fn)]
        # A key's own data (2 or 4 words) is not a saved mask; the packed flags are
        # bytes, halves or words, by the rate's field width.
        packed = ("uint8", "uint16", "uint32")
        words = [s for s, dtype in leaves if dtype in packed and s not in ((2,), (4,))]
        assert bool(words) == keeps_words, (mode, leaves)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
        np.testing.assert_array_equal(np.asarray(vjp_fn(x)[0]), np.asarray(want_vjp(x)[0]))
    with pytest.raises(dropmask.DropmaskValueError, match=r"dropmask.nnx.Dropout: residual"):
        dnnx.Dropout(0.2, residual="bits")(jnp.ones(4), rngs=key)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "bad_input", "error"),
    [
        (lambda r: dnnx.Dropout(0.5, rngs=r), jnp.arange(4), dropmask.DtypeError),
        (lambda r: dnnx.DropPath(0.5, rngs=r), jnp.arange(4), dropmask.DtypeError),
        (lambda r: dnnx.AlphaDropout(0.5, rngs=r), jnp.arange(4), dropmask.DtypeError),
        (lambda r: dnnx.GaussianDropout(0.5, rngs=r), jnp.arange(4), dropmask.DtypeError),
        (lambda r: dnnx.WordDropout(0.5, unk_id=1, rngs=r), jnp.ones(4), dropmask.DtypeError),
        (
            lambda r: dnnx.DropBlock(0.5, block_size=2, rngs=r),
            jnp.ones((2, 4)),
            dropmask.DropmaskValueError,
        ),
        (lambda r: dnnx.DropHead(0.5, rngs=r), jnp.ones((2, 4)), dropmask.DropmaskValueError),
    ],
)
def test_an_error_of_the_function_a_layer_calls_names_the_layer(make, bad_input, error):
    layer = make(nnx.Rngs(dropout=0))
    with pytest.raises(error, match=rf"^dropmask\.nnx\.{type(layer).__name__}\b"):
        layer(bad_input)
    # The layer's name ends with its call: the function called alone names itself.
    with pytest.raises(dropmask.DtypeError, match=r"^dropout\b"):
        dropmask.dropout(jnp.arange(4), 0.5, jax.random.key(0))
