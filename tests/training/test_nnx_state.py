"""dropmask.training.NnxTrainState: an NNX model split, its streams keyed by the stream rule."""

import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dropmask import DropmaskError
from dropmask import nnx as dnnx
from dropmask.training import Checkpointer, NnxTrainState, stream_key

LAYERS = 3


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(8, 8, rngs=rngs)
        self.dropout = dnnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(jnp.tanh(self.linear(x)) + 2)


class Model(nnx.Module):
    """A dropout layer, a BatchNorm and an ``nnx.vmap``-stacked block applied by ``nnx.scan``."""

    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 8, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)

        @nnx.split_rngs(splits=LAYERS)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs) -> Block:
            return Block(rngs)

        self.blocks = create(rngs)

    def __call__(self, x):
        x = self.norm(self.dropout(self.linear(x)))

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(x, block):
            return block(x)

        return forward(x, self.blocks)


X = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, (16, 4)), jnp.float32)


def _bits(key):
    return np.asarray(jax.random.key_data(key))


@pytest.fixture
def state() -> NnxTrainState:
    params_key, dropout_key = jax.random.split(jax.random.key(0))
    model = Model(nnx.Rngs(params=params_key, dropout=7))
    return NnxTrainState.create(model=model, tx=optax.adam(1e-2), key=dropout_key)


def _step(state, x):
    def loss_fn(params):
        model = state.model(params)
        return jnp.mean(model(x) ** 2), state.other_of(model)

    (loss, other), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads, other=other), loss


def test_every_stream_is_keyed_by_the_stream_rule_plus_its_path(state):
    state = state.replace(step=jnp.int32(5))
    model = state.model()
    root = stream_key(state.key, 5, "dropout")
    expect = jax.random.fold_in(root, zlib.crc32(b"dropout/rngs"))
    np.testing.assert_array_equal(_bits(model.dropout.rngs.key[...]), _bits(expect))
    assert int(model.dropout.rngs.count[...]) == 0
    stacked = _bits(model.blocks.dropout.rngs.key[...])
    block_root = jax.random.fold_in(root, zlib.crc32(b"blocks/dropout/rngs"))
    for i in range(LAYERS):
        np.testing.assert_array_equal(stacked[i], _bits(jax.random.fold_in(block_root, i)))
    assert len(np.unique(stacked, axis=0)) == LAYERS  # each layer of the stack its own key


def test_a_steps_masks_do_not_depend_on_the_calls_before_it(state):
    first = state.model()(X)
    extra = state.model()
    for _ in range(2):
        extra(X)  # draws that advance that model's counters only
    np.testing.assert_array_equal(state.model()(X), first)
    later = state.replace(step=state.step + 1).model()(X)
    assert not np.array_equal(later, first)


def test_jax_jit_and_nnx_jit_give_bit_identical_steps(state):
    a = b = state
    for _ in range(3):
        a, loss_a = jax.jit(_step)(a, X)
        b, loss_b = nnx.jit(_step)(b, X)
        assert float(loss_a) == float(loss_b)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)
    assert int(a.step) == 3
    np.testing.assert_array_equal(_bits(a.key), _bits(state.key))
    # BatchNorm statistics were carried; the stored streams never advance.
    assert not np.array_equal(a.other["norm"]["mean"][...], state.other["norm"]["mean"][...])
    np.testing.assert_array_equal(
        a.rng_state["dropout"]["rngs"]["count"][...],
        state.rng_state["dropout"]["rngs"]["count"][...],
    )


def test_training_flag_sets_the_mode_and_eval_needs_no_key(state):
    model = state.model(training=False)
    assert model.dropout.deterministic and model.norm.use_running_average
    np.testing.assert_array_equal(model(X), state.model(training=False)(X))
    assert not state.model(training=True).dropout.deterministic


def test_rngs_for_call_time_streams_follow_the_same_rule(state):
    state = state.replace(step=jnp.int32(2))
    rngs = state.rngs("dropout", "noise")
    np.testing.assert_array_equal(
        _bits(rngs["dropout"].key[...]), _bits(stream_key(state.key, 2, "dropout"))
    )
    np.testing.assert_array_equal(_bits(state.step_key("noise")), _bits(rngs["noise"].key[...]))
    layer = dnnx.Dropout(0.5)
    a = layer(jnp.ones((64,)), rngs=state.rngs())
    b = layer(jnp.ones((64,)), rngs=state.rngs())
    np.testing.assert_array_equal(a, b)


def test_a_checkpointed_state_resumes_bit_identical(state, tmp_path):
    step = jax.jit(_step)
    state, _ = step(state, X)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state, config={}, data_position={})
    fresh = NnxTrainState.create(
        model=Model(nnx.Rngs(params=1, dropout=2)), tx=optax.adam(1e-2), key=jax.random.key(9)
    )
    restored, _ = ckpt.restore(fresh, config={})
    ckpt.close()
    a, loss_a = step(state, X)
    b, loss_b = step(restored, X)
    assert float(loss_a) == float(loss_b)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)


def test_create_refuses_a_linen_module_and_an_int_key():
    with pytest.raises(DropmaskError, match=r"NnxTrainState.create: model must be an nnx.Module"):
        NnxTrainState.create(model=nn.Dense(3), tx=optax.sgd(0.1), key=jax.random.key(0))
    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    with pytest.raises(DropmaskError, match="NnxTrainState.create"):
        NnxTrainState.create(model=model, tx=optax.sgd(0.1), key=0)


@pytest.mark.parametrize("tx", [None, "adam", optax.adam], ids=["None", "str", "factory"])
def test_create_without_an_optax_transformation_names_tx(tx):
    from dropmask.training import TrainState

    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    with pytest.raises(DropmaskError, match=r"NnxTrainState.create: tx must be an optax"):
        NnxTrainState.create(model=model, tx=tx, key=jax.random.key(0))
    params = {"w": jnp.ones(2)}
    with pytest.raises(DropmaskError, match=r"TrainState.create: tx must be an optax"):
        TrainState.create(apply_fn=None, params=params, tx=tx, key=jax.random.key(0))


def _stacked(tree):
    return jax.tree.map(lambda g: g[None], tree)


def _bf16(tree):
    return jax.tree.map(lambda g: g.astype(jnp.bfloat16), tree)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        # A leading axis of 1 broadcast into the parameters: (16, 64) became (1, 16, 64).
        (_stacked, r"got float32\(1, 3, 8\) at \['blocks'\]\['linear'\]\['bias'\].value, where "),
        (_bf16, r"got bfloat16\(3, 8\) at .*, where params has float32\(3, 8\)"),
        # Another tree failed in JAX's tree_util, naming no argument.
        (lambda g: {"kernel": g["linear"]["kernel"]}, r"structure of params, got a tree that"),
    ],
)
def test_apply_gradients_refuses_grads_unlike_params(state, wrong, match):
    grads = jax.tree.map(jnp.ones_like, state.params)
    with pytest.raises(
        DropmaskError, match=r"NnxTrainState.apply_gradients: grads must .*" + match
    ):
        state.apply_gradients(grads=wrong(grads))
    with pytest.raises(DropmaskError, match=r"NnxTrainState.apply_gradients: grads must"):
        jax.jit(lambda s, g: s.apply_gradients(grads=g))(state, wrong(grads))
