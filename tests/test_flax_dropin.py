"""Flax's own Dropout tests, run against dropmask's modules.

These follow the Dropout tests of Flax (``tests/linen/linen_test.py::StochasticTest`` and
``tests/nnx/nn/stochastic_test.py::TestStochastic``): each test takes the layer class
from a fixture, so the same assertions run on Flax's layer (the reference), on
dropmask's with ``impl="fast"`` and on dropmask's with ``impl="flax"``, and on Flax's
layer swapped for dropmask's (``swap_dropout``, Linen's switch around the whole test,
NNX's replacement of the built layer) with either impl.
"""

import functools

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import random
from tests.covering import covering

from dropmask import linen as dl
from dropmask import nnx as dnnx

LINEN = {
    "flax": nn.Dropout,
    "dropmask-fast": functools.partial(dl.Dropout, impl="fast"),
    "dropmask-flax": functools.partial(dl.Dropout, impl="flax"),
}
NNX = {
    "flax": nnx.Dropout,
    "dropmask-fast": functools.partial(dnnx.Dropout, impl="fast"),
    "dropmask-flax": functools.partial(dnnx.Dropout, impl="flax"),
}


SWAPS = {"swapped-fast": "fast", "swapped-flax": "flax"}


class _Holder(nnx.Module):
    def __init__(self, layer: nnx.Module):
        self.layer = layer


def _nnx_swapped(impl, *args, **kwargs):
    """Flax's nnx.Dropout, built as given, then swapped in place for dropmask's."""
    holder = _Holder(nnx.Dropout(*args, **kwargs))
    (replaced,) = dnnx.swap_dropout(holder, impl=impl)
    assert replaced.path == "layer" and isinstance(holder.layer, dnnx.Dropout)
    return holder.layer


def _variants(layers: dict) -> list:
    """The fixture's params: Flax's own layer, the reference that shows a test as ported
    holds, with the slow tests (it tests Flax, not dropmask); every other in make test."""
    return [
        pytest.param(name, marks=pytest.mark.slow) if name == "flax" else name for name in layers
    ]


@pytest.fixture(params=[*_variants(LINEN), *SWAPS])
def Dropout(request):  # noqa: N802 - stands in for the class it names
    if request.param in SWAPS:
        with dl.swap_dropout(impl=SWAPS[request.param]):
            yield nn.Dropout
    else:
        yield LINEN[request.param]


@pytest.fixture(params=[*_variants(NNX), *SWAPS])
def NnxDropout(request):  # noqa: N802
    if request.param in SWAPS:
        return functools.partial(_nnx_swapped, SWAPS[request.param])
    return NNX[request.param]


# --- Linen ------------------------------------------------------------------------


def test_dropout(Dropout):  # noqa: N803
    key1, key2 = random.split(random.key(0))
    module = Dropout(rate=0.5)
    x = jnp.ones((20, 20))
    y1 = module.apply({}, x, deterministic=False, rngs={"dropout": key1})
    y2 = module.apply({}, x, deterministic=False, rngs={"dropout": key2})
    assert not np.all(y1 == y2)
    y1 = module.apply({}, x, deterministic=True, rngs={"dropout": key1})
    y2 = module.apply({}, x, deterministic=True, rngs={"dropout": key2})
    assert np.all(y1 == y2)


# Fast: each impl once, as dropmask's layer and swapped in, in turn (a swapped layer is
# dropmask's with the same draw); Flax's reference and the other two are slow.
@pytest.mark.parametrize(
    "Dropout",
    covering(["flax", "dropmask-fast", "dropmask-flax", *SWAPS], ["dropmask-flax", "swapped-fast"]),
    indirect=True,
)
def test_dropout_rate_stats(Dropout):  # noqa: N803
    rootkey = random.key(0)
    for rate in np.arange(0.1, 1.0, 0.1):
        rootkey, subkey = random.split(rootkey)
        module = Dropout(rate=rate)
        n_trials = 10
        nonzero = 0
        for key in random.split(subkey, n_trials):
            y = module.apply({}, jnp.ones((100, 100)), deterministic=False, rngs={"dropout": key})
            nonzero += np.sum(y > 0.0)
        total = 100 * 100 * n_trials
        keep = 1.0 - rate
        delta = 4 * np.sqrt(rate * keep) / np.sqrt(total)  # 4 sigma
        assert keep - delta < nonzero / total < keep + delta


def test_dropout_rate_limits(Dropout):  # noqa: N803
    key1, key2, key3 = random.split(random.key(0), 3)
    inputs = jnp.ones((20, 20))
    y1 = Dropout(rate=0.0).apply({}, inputs, deterministic=False, rngs={"dropout": key1})
    np.testing.assert_array_equal(y1, inputs)
    d1 = Dropout(rate=1.0)
    y2 = d1.apply({}, inputs, deterministic=False, rngs={"dropout": key2})
    np.testing.assert_array_equal(y2, np.zeros_like(inputs))

    def fn(x, k):
        return d1.apply({}, x, rngs={"dropout": k}, deterministic=False)

    grad = jax.grad(lambda x, k: jnp.sum(fn(x, k)))(inputs, key3)
    assert not np.isnan(grad).any()


BROADCAST_CASES = [
    (2, (1,), lambda out, i: out[i, :], 2 * 10),
    (2, (0,), lambda out, i: out[:, i], 2 * 10),
    (3, (1, 2), lambda out, i: out[i, :, :], 2 * 10 * 10),
    (3, (1,), lambda out, i, j: out[i, :, j], 2 * 10),
    (4, (0, 2, 3), lambda out, i: out[:, i, :, :], 2 * 10 * 10 * 10),
    (4, (0, 1), lambda out, i, j: out[:, :, i, j], 2 * 10 * 10),
    (4, (3,), lambda out, i, j, k: out[i, j, k, :], 2 * 10),
]


@pytest.mark.parametrize(("num_dims", "broadcast_dims", "slice_fn", "total"), BROADCAST_CASES)
def test_dropout_broadcast(Dropout, num_dims, broadcast_dims, slice_fn, total):  # noqa: N803
    module = Dropout(rate=0.5, broadcast_dims=broadcast_dims, deterministic=False)
    out = module.apply({}, jnp.ones((10,) * num_dims), rngs={"dropout": random.key(0)})
    out = np.asarray(out)  # read slice by slice on the host, not an op dispatched per slice
    free = num_dims - len(broadcast_dims)
    for index in np.ndindex(*(10,) * free):
        assert slice_fn(out, *index).sum() in (0, total)


def test_dropout_manual_rng(Dropout):  # noqa: N803
    class Foo(nn.Module):
        @nn.compact
        def __call__(self, x):
            key = self.make_rng("dropout")
            x1 = Dropout(rate=0.5, deterministic=False)(x, rng=key)
            x2 = Dropout(rate=0.5, deterministic=False)(x, rng=jax.random.clone(key))
            return x1, x2

    x1, x2 = Foo().apply({}, jnp.ones((20, 20)), rngs={"dropout": random.key(0)})
    np.testing.assert_array_equal(x1, x2)


def test_default_params_rng_equivalence(Dropout):  # noqa: N803
    # from Flax's linen_module_test: init in training mode draws from 'params'
    class Model(nn.Module):
        @nn.compact
        def __call__(self, x, add_dropout=False):
            x = nn.Dense(16)(x)
            return Dropout(0.5)(x, deterministic=not add_dropout)

    key0, key1 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key0, (10, 8))
    Model().init(key1, x, add_dropout=True)  # no 'dropout' stream: must not raise
    v = Model().init({"params": key1}, x)
    v2 = Model().init(key1, x)
    jax.tree_util.tree_map(np.testing.assert_allclose, v, v2)


def test_missing_stream_raises_flax_error_type_and_wording(Dropout):  # noqa: N803
    with pytest.raises(flax.errors.InvalidRngError, match='needs PRNG for "dropout"'):
        Dropout(0.5, deterministic=False).apply({}, jnp.ones((2, 3)))


# --- NNX --------------------------------------------------------------------------


def test_nnx_dropout_internal_rngs(NnxDropout):  # noqa: N803
    n = 0
    m1 = NnxDropout(rate=0.5, deterministic=False, rngs=nnx.Rngs(dropout=0))
    m2 = NnxDropout(rate=0.5, deterministic=False)
    rngs2 = nnx.Rngs(dropout=0).fork()

    @nnx.jit
    def f(m, x, rngs=None):
        nonlocal n
        n += 1
        return m(x, rngs=rngs)

    x = jnp.ones((1, 10))
    assert m1.rngs is not None and m1.rngs.count[...] == 0
    y1 = f(m1, x)
    assert n == 1
    assert m1.rngs.count[...] == 1
    y2 = f(m2, x, rngs=rngs2)
    assert n == 2
    assert rngs2.dropout.count[...] == 1
    np.testing.assert_allclose(y1, y2)

    y1 = f(m1, x)
    assert m1.rngs.count[...] == 2
    y2 = f(m2, x, rngs=rngs2)
    assert rngs2.dropout.count[...] == 2
    np.testing.assert_allclose(y1, y2)
    assert n == 2


def test_nnx_dropout_rng_override(NnxDropout):  # noqa: N803
    m1 = NnxDropout(rate=0.5, deterministic=False, rngs=nnx.Rngs(dropout=0))
    m2 = NnxDropout(rate=0.5, deterministic=False, rngs=nnx.Rngs(dropout=1))
    x = jnp.ones((1, 10))
    y1, y2 = m1(x), m2(x)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(y1, y2)
    y2 = m2(x, rngs=nnx.Rngs(dropout=0).fork())
    np.testing.assert_allclose(y1, y2)


FLAX_NO_RNGS = "`deterministic` is False, but no `rngs` argument was provided to Dropout"


def test_nnx_dropout_arg_override(NnxDropout):  # noqa: N803
    m = NnxDropout(rate=0.5, deterministic=False)
    x = jnp.ones((1, 10))
    m(x, deterministic=True)  # call-time deterministic
    m.set_attributes(deterministic=True)  # constructor-level deterministic
    y = m(x)
    with pytest.raises(AssertionError):  # call-time value wins
        np.testing.assert_allclose(y, m(x, deterministic=False, rngs=nnx.Rngs(dropout=0)))
    m.set_attributes(deterministic=False)
    with pytest.raises(ValueError, match=FLAX_NO_RNGS):
        m(x)


def test_nnx_dropout_arg_override_view(NnxDropout):  # noqa: N803
    m = NnxDropout(rate=0.5, deterministic=False)
    x = jnp.ones((1, 10))
    m(x, deterministic=True)
    new_m = nnx.view(m, deterministic=True)
    y = new_m(x)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(y, new_m(x, deterministic=False, rngs=nnx.Rngs(dropout=0)))
    new_m = nnx.view(m, deterministic=False)
    with pytest.raises(ValueError, match=FLAX_NO_RNGS):
        new_m(x)


# --- inputs Flax accepts ----------------------------------------------------------


@pytest.mark.parametrize("which", ["linen", "nnx"])
def test_complex_inputs_and_list_broadcast_dims_as_in_flax(which):
    z = jax.lax.complex(jnp.ones((4, 10)), 2.0 * jnp.ones((4, 10)))
    key = jax.random.key(0)
    outs = {}
    for name in ("flax", "dropmask-flax", "dropmask-fast"):
        if which == "linen":
            layer = LINEN[name](rate=0.5, broadcast_dims=[0], deterministic=False)
            outs[name] = np.asarray(layer.apply({}, z, rng=key))
        else:
            outs[name] = np.asarray(NNX[name](rate=0.5, broadcast_dims=[0])(z, rngs=key))
    np.testing.assert_array_equal(outs["dropmask-flax"], outs["flax"])
    fast = outs["dropmask-fast"]
    assert fast.dtype == np.complex64
    np.testing.assert_array_equal(fast.imag, 2.0 * fast.real)  # one mask for both parts
    assert (fast[0] == fast).all()  # shared along the broadcast axis
