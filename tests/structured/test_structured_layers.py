"""Linen and NNX layers of the structured family: the core's results, modes, scans."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dropmask
from dropmask import linen as dl
from dropmask import nnx as dnnx

KEY = jax.random.key(0)


def test_linen_drop_block_and_drop_head_equal_the_core():
    x = jax.random.normal(KEY, (2, 8, 8, 3))
    k = jax.random.key(1)
    got = dl.DropBlock(0.2, block_size=3, deterministic=False).apply({}, x, rng=k)
    want = dropmask.drop_block(x, 0.2, k, block_size=3)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    h = jax.random.normal(KEY, (2, 5, 4, 8))
    got = dl.DropHead(0.5).apply({}, h, deterministic=False, rng=k)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(dropmask.drop_head(h, 0.5, k)))
    assert dl.DropHead(0.5).apply({}, h, deterministic=True) is h
    with pytest.raises(dropmask.DropmaskValueError, match="dropmask.linen.DropBlock: block_size"):
        dl.DropBlock(0.2, block_size=9, deterministic=False).apply({}, x, rng=k)


def test_nnx_drop_block_and_drop_head_equal_the_core_and_follow_eval():
    x = jax.random.normal(KEY, (2, 8, 8, 3))
    k = jax.random.key(1)
    layer = dnnx.DropBlock(0.2, block_size=3)
    want = dropmask.drop_block(x, 0.2, k, block_size=3)
    np.testing.assert_array_equal(np.asarray(layer(x, rngs=k)), np.asarray(want))
    head = dnnx.DropHead(0.5, rngs=nnx.Rngs(dropout=0))
    h = jnp.ones((2, 5, 4, 8))
    assert not np.array_equal(np.asarray(head(h)), np.asarray(h))
    head.eval()
    assert head(h) is h


class _Add(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + self.param("w", nn.initializers.ones, ())


class _Body(nn.Module):
    rate: float = 0.5
    pruned: bool = False

    @nn.compact
    def __call__(self, x, _):
        layer = dl.LayerDrop(_Add(), self.rate, deterministic=False, pruned=self.pruned)
        return layer(x), None


def _linen_stack(**body):
    return nn.scan(
        _Body,
        variable_axes={"params": 0},
        split_rngs={"params": True, "dropout": True},
        length=8,
    )(**body)


def test_linen_layer_drop_in_scan_draws_each_layer_apart():
    stack = _linen_stack()
    variables = stack.init(KEY, jnp.zeros(2), None)
    # Parameter paths are those of the wrapped layer alone, so a checkpoint loads either way.
    assert jax.tree.map(jnp.shape, variables) == {"params": {"_Add_0": {"w": (8,)}}}
    run = jax.jit(lambda k: stack.apply(variables, jnp.zeros(2), None, rngs={"dropout": k})[0])
    kept = np.array([float(run(k)[0]) for k in jax.random.split(KEY, 50)])
    # Layers decide apart: counts between 0 and 8 and not all-or-nothing.
    assert set(kept) - {0.0, 8.0} and abs(kept.mean() - 4.0) < 4 * np.sqrt(2.0 / 50)
    pruned = _linen_stack(pruned=True).apply(variables, jnp.zeros(2), None)[0]
    assert float(pruned[0]) == 0.0


def test_linen_layer_drop_modes_and_gradients():
    layer = dl.LayerDrop(_Add(), 0.5, deterministic=True)
    x = jnp.zeros(3)
    variables = layer.init(KEY, x)
    assert float(layer.apply(variables, x)[0]) == 1.0
    train = dl.LayerDrop(_Add(), 0.5, deterministic=False)

    def loss(v, k):
        return jnp.sum(train.apply(v, x, rngs={"dropout": k}))

    grads = [
        float(jax.grad(loss)(variables, k)["params"]["layer"]["w"])
        for k in jax.random.split(KEY, 6)
    ]
    assert set(grads) == {0.0, 3.0}
    with pytest.raises(dropmask.MissingKeyError, match='needs PRNG for "dropout"'):
        train.apply(variables, x)


def test_nnx_layer_drop_in_scan_draws_each_layer_apart():
    class Add(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(()))

        def __call__(self, x):
            return x + self.w

    @nnx.split_rngs(splits=8)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
        return dnnx.LayerDrop(Add(), 0.5, rngs=rngs)

    stack = create(nnx.Rngs(dropout=0))

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, layer):
        return layer(x)

    kept = np.array([float(run(jnp.zeros(1), stack)[0]) for _ in range(40)])
    assert set(kept) - {0.0, 8.0} and abs(kept.mean() - 4.0) < 4 * np.sqrt(2.0 / 40)
    stack.eval()
    assert float(run(jnp.zeros(1), stack)[0]) == 8.0


def test_nnx_layer_drop_skips_for_the_batch_and_prunes():
    rngs = nnx.Rngs(params=0, dropout=1)
    layer = dnnx.LayerDrop(nnx.Linear(4, 4, rngs=rngs), 0.5, rngs=rngs)
    x = jnp.ones((3, 4))
    outs = [layer(x) for _ in range(20)]
    skipped = [bool((o == x).all()) for o in outs]
    assert any(skipped) and not all(skipped)
    assert dnnx.LayerDrop(layer.layer, 0.5, pruned=True)(x) is x


class _Widen(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(x.shape[-1] + 1)(x)


@pytest.mark.parametrize("rate", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("deterministic", [True, False])
def test_linen_layer_drop_around_a_shape_changing_layer_is_refused_at_init(deterministic, rate):
    layer = dl.LayerDrop(_Widen(), rate, deterministic=deterministic)
    with pytest.raises(
        dropmask.DropmaskValueError, match="dropmask.linen.LayerDrop: layer must return what"
    ):
        layer.init(KEY, jnp.ones((2, 3)))


# At rate 1 the layer is never run: it was accepted there (and in layer_drop at rates 0
# and 1), and failed the first time the rate changed.
@pytest.mark.parametrize("rate", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("deterministic", [True, False])
def test_nnx_layer_drop_around_a_shape_changing_layer_is_refused_at_its_first_call(
    deterministic, rate
):
    rngs = nnx.Rngs(params=0, dropout=1)
    layer = dnnx.LayerDrop(
        nnx.Linear(3, 4, rngs=rngs), rate, deterministic=deterministic, rngs=rngs
    )
    with pytest.raises(
        dropmask.DropmaskValueError, match="dropmask.nnx.LayerDrop: layer must return what"
    ):
        layer(jnp.ones((2, 3)))


@pytest.mark.parametrize("pruned", [False, True])
def test_linen_layer_drop_skipped_at_init_still_creates_the_parameters(pruned):
    # At rate 1 (or pruned) init skips the layer's computation, not its parameters:
    # evaluation and a restored checkpoint need them.
    x = jnp.zeros(3)
    variables = dl.LayerDrop(_Add(), 1.0, deterministic=False, pruned=pruned).init(KEY, x)
    assert jax.tree.map(jnp.shape, variables) == {"params": {"layer": {"w": ()}}}
    np.testing.assert_array_equal(
        np.asarray(dl.LayerDrop(_Add(), 1.0, deterministic=True).apply(variables, x)), 1.0
    )
    skipped = dl.LayerDrop(_Add(), 1.0, deterministic=False, pruned=pruned)
    out, _ = skipped.init_with_output(KEY, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


@pytest.mark.parametrize("rate", [1.5, -0.5, float("nan")])
def test_traced_layer_drop_rate_outside_0_1_gives_nan_as_dropout_and_checkify_reports_it(rate):
    # As the README's table says: never clipped, NaN in every floating output, as dropout
    # gives (the layer was skipped, returning finite inputs); integer leaves as they are.
    from jax.experimental import checkify

    x = {"h": jnp.zeros(3), "ids": jnp.arange(3)}
    f = jax.jit(lambda r: dropmask.layer_drop(lambda t: {**t, "h": t["h"] + 1.0}, x, r, KEY))
    out = f(jnp.float32(rate))
    assert np.isnan(np.asarray(out["h"])).all()
    np.testing.assert_array_equal(np.asarray(out["ids"]), [0, 1, 2])
    dropout = jax.jit(lambda r: dropmask.dropout(jnp.ones(3), r, KEY))
    assert np.isnan(np.asarray(dropout(jnp.float32(rate)))).all()
    err, _ = checkify.checkify(f, errors=checkify.user_checks)(jnp.float32(rate))
    assert err.get() is not None and "rate must be in [0, 1]" in err.get()
    linen = jax.jit(
        lambda r: dl.LayerDrop(_Add(), r, deterministic=False).apply(
            {"params": {"layer": {"w": jnp.float32(1.0)}}}, x["h"], rngs={"dropout": KEY}
        )
    )
    assert np.isnan(np.asarray(linen(jnp.float32(rate)))).all()


def test_a_layer_inside_layer_drop_names_itself_in_its_errors():
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return dl.Dropout(0.5, deterministic=False)(jnp.arange(4))  # the user's mistake

    with pytest.raises(dropmask.DtypeError, match=r"^dropmask\.linen\.Dropout\b"):
        dl.LayerDrop(Block(), 0.5, deterministic=False).init(
            {"params": jax.random.key(0), "dropout": jax.random.key(1)}, jnp.ones(4)
        )
