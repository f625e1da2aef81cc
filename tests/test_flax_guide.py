"""The Flax dropout guide's examples, run with dropmask swapped in for Flax's layers.

Covers the guide's Linen workflow (three keys, ``init`` with ``training=False``,
``apply`` with ``rngs={'dropout': ...}``, a ``TrainState`` with ``fold_in`` per
step), the SST-2, WMT and Seq2Seq patterns it cites, the NNX equivalent, and the
drop-in claim: with ``impl="flax"`` dropmask matches Flax bit for bit.

Tests that use dropmask's default mask generator check semantics only (what is
zeroed, what is scaled, which key changes what), never particular mask bits.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state

import dropmask
from dropmask import linen as dl
from dropmask import nnx as dnnx
from dropmask.training import TrainState, stream_id

FLAX_EXACT_LINEN = functools.partial(dl.Dropout, impl="flax")


# Test data comes from NumPy: eager jax.random calls compile once per shape, which
# would dominate the run time of these small tests.
def _uniform(shape: tuple[int, ...], seed: int) -> jax.Array:
    """Values in [0.5, 1.5): nonzero, so dropped entries are visible."""
    return jnp.asarray(np.random.default_rng(seed).uniform(0.5, 1.5, shape), jnp.float32)


def _normal(shape: tuple[int, ...], seed: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _tokens(shape: tuple[int, ...], seed: int, low: int, high: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(low, high, shape), jnp.int32)


def _assert_dropped_or_scaled(y: jax.Array, x: jax.Array, rate: float) -> np.ndarray:
    """Checks ``y`` is ``x`` with some entries zeroed and the rest scaled by ~1/(1-rate).

    The scale is not pinned exactly: a mask generator may realise a keep probability
    slightly different from ``1 - rate`` and divide by that instead.

    Returns:
      The boolean keep-mask that was inferred.
    """
    y, x = np.asarray(y), np.asarray(x)
    assert np.all(x != 0), "use inputs without zeros so that drops are visible"
    kept = y != 0
    assert 0 < kept.mean() < 1
    scale = y[kept] / x[kept]
    np.testing.assert_allclose(scale, scale[0], rtol=1e-5)
    np.testing.assert_allclose(scale[0], 1 / (1 - rate), rtol=1e-2)
    return kept


# --- Section 2-5: keys, model, init, apply -------------------------------------------


class MyModel(nn.Module):
    """The guide's model: one Dense layer, then dropout at 50%."""

    num_neurons: int
    dropout: Callable[..., nn.Module] = dl.Dropout

    @nn.compact
    def __call__(self, x: jax.Array, training: bool) -> jax.Array:
        x = nn.Dense(self.num_neurons)(x)
        # deterministic=True turns dropout off.
        x = self.dropout(rate=0.5, deterministic=not training)(x)
        return x


@pytest.fixture
def keys() -> tuple[jax.Array, jax.Array, jax.Array]:
    root_key = jax.random.key(seed=0)
    main_key, params_key, dropout_key = jax.random.split(key=root_key, num=3)
    return main_key, params_key, dropout_key


@pytest.fixture
def x() -> jax.Array:
    # The guide uses jnp.empty((3, 4, 4)); nonzero values make dropped entries visible.
    return _uniform((3, 4, 4), seed=1)


def test_guide_linen_init_apply_eval(keys, x):
    _, params_key, dropout_key = keys
    my_model = MyModel(num_neurons=3)
    # training=False at init: the 'params' stream alone is enough.
    variables = my_model.init(params_key, x, training=False)
    params = variables["params"]
    y_train = my_model.apply({"params": params}, x, training=True, rngs={"dropout": dropout_key})
    y_eval = my_model.apply({"params": params}, x, training=False)
    dense = nn.Dense(3).apply({"params": params["Dense_0"]}, x)
    assert y_train.shape == y_eval.shape == (3, 4, 3)
    np.testing.assert_array_equal(y_eval, dense)
    _assert_dropped_or_scaled(y_train, dense, rate=0.5)
    again = my_model.apply({"params": params}, x, training=True, rngs={"dropout": dropout_key})
    np.testing.assert_array_equal(again, y_train)
    other = my_model.apply(
        {"params": params}, x, training=True, rngs={"dropout": jax.random.key(5)}
    )
    assert not np.array_equal(other, y_train)
    with pytest.raises(dropmask.MissingKeyError, match="rngs=\\{'dropout'"):
        my_model.apply({"params": params}, x, training=True)


def test_guide_deterministic_merges_constructor_and_call(keys, x):
    _, _, dropout_key = keys
    layer = dl.Dropout(rate=0.5)
    with pytest.raises(ValueError, match="deterministic"):
        layer.apply({}, x)
    np.testing.assert_array_equal(layer.apply({}, x, deterministic=True), x)
    y = layer.apply({}, x, deterministic=False, rngs={"dropout": dropout_key})
    _assert_dropped_or_scaled(y, x, rate=0.5)
    # The guide says the call-time value wins over the constructor's; in Linen,
    # merge_param instead rejects passing both, and dropmask does the same as Flax.
    for cls in (nn.Dropout, dl.Dropout):
        with pytest.raises(ValueError, match="passed to the constructor and at call time"):
            cls(rate=0.5, deterministic=True).apply(
                {}, x, deterministic=False, rngs={"dropout": dropout_key}
            )
    # In NNX the call-time value does take precedence.
    nnx_layer = dnnx.Dropout(0.5, deterministic=True, rngs=nnx.Rngs(dropout=0))
    _assert_dropped_or_scaled(nnx_layer(x, deterministic=False), x, rate=0.5)
    np.testing.assert_array_equal(
        dnnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))(x, deterministic=True), x
    )


# --- Section 6: TrainState with a key, fold_in per step ------------------------------


class GuideTrainState(train_state.TrainState):
    """The guide's hand-written subclass."""

    key: jax.Array


@jax.jit
def guide_train_step(
    state: GuideTrainState, batch: dict[str, jax.Array], dropout_key: jax.Array
) -> tuple[GuideTrainState, jax.Array]:
    """The guide's train_step, plus the loss as a second output."""
    dropout_train_key = jax.random.fold_in(key=dropout_key, data=state.step)

    def loss_fn(params):
        logits = state.apply_fn(
            {"params": params},
            x=batch["image"],
            training=True,
            rngs={"dropout": dropout_train_key},
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"])
        return loss.mean(), logits

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, _), grads = grad_fn(state.params)
    return state.apply_gradients(grads=grads), loss


def _guide_batch() -> dict[str, jax.Array]:
    image = _normal((8, 16), seed=2)
    return {"image": image, "label": jnp.arange(8) % 4}


def _run_guide_loop(dropout: Callable[..., nn.Module], state_cls: type, steps: int):
    root_key = jax.random.key(seed=0)
    _, params_key, dropout_key = jax.random.split(key=root_key, num=3)
    model = MyModel(num_neurons=4, dropout=dropout)
    batch = _guide_batch()
    params = model.init(params_key, batch["image"], training=False)["params"]
    state = state_cls.create(
        apply_fn=model.apply, params=params, key=dropout_key, tx=optax.adam(1e-2)
    )
    losses = []
    for _ in range(steps):
        state, loss = guide_train_step(state, batch, state.key)
        losses.append(float(loss))
    return state, losses


def test_guide_train_state_loop(keys):
    state, losses = _run_guide_loop(dl.Dropout, GuideTrainState, steps=30)
    _, _, dropout_key = keys
    assert int(state.step) == 30
    np.testing.assert_array_equal(jax.random.key_data(state.key), jax.random.key_data(dropout_key))
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    # dropmask.training.TrainState runs the same loop step for step (so the loop is
    # reproducible from the root key); its step_key() is the per-stream rule, the
    # guide's fold_in of the step applied to the 'dropout' stream's own key.
    ours, our_losses = _run_guide_loop(dl.Dropout, TrainState, steps=30)
    assert our_losses == losses
    jax.tree.map(np.testing.assert_array_equal, ours.params, state.params)
    stream_root = jax.random.fold_in(dropout_key, stream_id("dropout"))
    np.testing.assert_array_equal(
        jax.random.key_data(ours.step_key()),
        jax.random.key_data(jax.random.fold_in(stream_root, 30)),
    )


# --- Section 7.1: WMT MlpBlock, deterministic from the config ------------------------


@dataclasses.dataclass(frozen=True)
class WmtConfig:
    mlp_dim: int = 16
    dropout_rate: float = 0.3
    deterministic: bool = False


class MlpBlock(nn.Module):
    config: WmtConfig
    out_dim: int | None = None
    dropout: Callable[..., nn.Module] = dl.Dropout

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        config = self.config
        actual_out_dim = inputs.shape[-1] if self.out_dim is None else self.out_dim
        x = nn.Dense(config.mlp_dim)(inputs)
        x = nn.relu(x)
        x = self.dropout(rate=config.dropout_rate)(x, deterministic=config.deterministic)
        output = nn.Dense(actual_out_dim)(x)
        output = self.dropout(rate=config.dropout_rate)(output, deterministic=config.deterministic)
        return output


def test_wmt_mlp_block_train_and_eval_configs():
    inputs = _normal((4, 8, 16), seed=3)
    train_block = MlpBlock(WmtConfig(deterministic=False))
    eval_block = MlpBlock(WmtConfig(deterministic=True))
    params = eval_block.init(jax.random.key(0), inputs)["params"]
    y_eval = eval_block.apply({"params": params}, inputs)
    hidden = nn.relu(nn.Dense(16).apply({"params": params["Dense_0"]}, inputs))
    np.testing.assert_array_equal(y_eval, nn.Dense(16).apply({"params": params["Dense_1"]}, hidden))
    with pytest.raises(dropmask.MissingKeyError):
        train_block.apply({"params": params}, inputs)
    y_train, inter = train_block.apply(
        {"params": params},
        inputs,
        rngs={"dropout": jax.random.key(1)},
        capture_intermediates=True,
        mutable=["intermediates"],
    )
    assert not np.array_equal(y_train, y_eval)
    # Each Dropout layer draws its own key from the one 'dropout' stream: compare the
    # two [4, 8, 16] keep-masks where both layers' inputs are nonzero (after the ReLU).
    captured = inter["intermediates"]
    active = np.asarray(captured["Dense_0"]["__call__"][0]) > 0
    kept = [np.asarray(captured[f"Dropout_{i}"]["__call__"][0])[active] != 0 for i in (0, 1)]
    assert 0.5 < kept[0].mean() < 0.9 and 0.5 < kept[1].mean() < 0.9  # keep prob 0.7
    assert not np.array_equal(*kept)


# --- Section 7.2: SST-2 WordDropout then Dropout, one deterministic flag -------------


class GuideWordDropout(nn.Module):
    """The SST-2 example's layer, verbatim from the guide."""

    dropout_rate: float
    unk_idx: int
    deterministic: bool | None = None

    @nn.compact
    def __call__(self, inputs: jax.Array, deterministic: bool | None = None) -> jax.Array:
        deterministic = nn.module.merge_param("deterministic", self.deterministic, deterministic)
        if deterministic or self.dropout_rate == 0.0:
            return inputs
        rng = self.make_rng("dropout")
        mask = jax.random.bernoulli(rng, p=self.dropout_rate, shape=inputs.shape)
        return jnp.where(mask, jnp.array([self.unk_idx]), inputs)


class Embedder(nn.Module):
    vocab_size: int = 20
    embedding_size: int = 6
    dropout_rate: float = 0.4
    word_dropout_rate: float = 0.3
    unk_idx: int = 1
    deterministic: bool | None = None
    # "dropmask" (default generator), "dropmask-flax-impl", or "flax" (the guide's layers).
    layers: str = "dropmask"

    def setup(self) -> None:
        self.embedding = self.param(
            "embedding",
            nn.initializers.uniform(1.0),
            (self.vocab_size, self.embedding_size),
        )
        if self.layers == "flax":
            self.dropout_layer = nn.Dropout(rate=self.dropout_rate)
            self.word_dropout_layer = GuideWordDropout(self.word_dropout_rate, self.unk_idx)
        else:
            impl = {"impl": "flax"} if self.layers == "dropmask-flax-impl" else {}
            self.dropout_layer = dl.Dropout(rate=self.dropout_rate, **impl)
            self.word_dropout_layer = dl.WordDropout(
                rate=self.word_dropout_rate, unk_id=self.unk_idx, **impl
            )

    def __call__(self, inputs: jax.Array, deterministic: bool | None = None) -> jax.Array:
        deterministic = nn.module.merge_param("deterministic", self.deterministic, deterministic)
        inputs = self.word_dropout_layer(inputs, deterministic=deterministic)
        embedded = self.embedding[inputs]
        return self.dropout_layer(embedded, deterministic=deterministic)


def test_sst2_embedder_shares_one_deterministic_flag():
    tokens = _tokens((8, 12), seed=4, low=2, high=20)
    embedder = Embedder()
    params = embedder.init(jax.random.key(0), tokens, deterministic=True)["params"]
    table = np.asarray(params["embedding"]) + 0.5  # all entries nonzero
    variables = {"params": {"embedding": jnp.asarray(table)}}

    y_eval = embedder.apply(variables, tokens, deterministic=True)
    np.testing.assert_array_equal(y_eval, table[np.asarray(tokens)])

    y = np.asarray(
        embedder.apply(variables, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)})
    )
    # A position's features are either all those of its token or all those of unk
    # (word dropout), then individually zeroed or scaled (feature dropout).
    kept = y != 0
    own = table[np.asarray(tokens)]
    unk = np.broadcast_to(table[1], own.shape)
    expected_own = np.isclose(y, own / (1 - 0.4), rtol=1e-2) | ~kept
    expected_unk = np.isclose(y, unk / (1 - 0.4), rtol=1e-2) | ~kept
    per_position_own = expected_own.all(axis=-1)
    per_position_unk = expected_unk.all(axis=-1)
    assert np.all(per_position_own | per_position_unk)
    replaced = per_position_unk & ~per_position_own
    assert 0 < replaced.mean() < 0.6  # word dropout fired, at about its rate
    assert 0.4 < kept.mean() < 0.8  # feature dropout fired, at about 1 - 0.4


# --- Section 7.3: Seq2Seq decoder sampling from an 'lstm' stream ---------------------


class DecoderLSTMCell(nn.RNNCellBase):
    """The Seq2Seq example's decoder cell, with dropout on the LSTM output."""

    features: int
    teacher_force: bool
    vocab_size: int
    dropout_rate: float = 0.3
    deterministic: bool = False

    @nn.compact
    def __call__(self, carry, x):
        lstm_state, last_prediction = carry
        if not self.teacher_force:
            x = last_prediction
        # Orthogonal init (the default) compiles slowly on CPU and is irrelevant here.
        cell = nn.LSTMCell(self.features, recurrent_kernel_init=nn.initializers.lecun_normal())
        lstm_state, y = cell(lstm_state, x)
        y = dl.Dropout(self.dropout_rate, deterministic=self.deterministic)(y)
        logits = nn.Dense(features=self.vocab_size)(y)
        categorical_rng = self.make_rng("lstm")
        predicted_token = jax.random.categorical(categorical_rng, logits)
        prediction = jax.nn.one_hot(predicted_token, self.vocab_size, dtype=jnp.float32)
        return (lstm_state, prediction), (logits, prediction)

    @property
    def num_feature_axes(self) -> int:
        return 1


class Decoder(nn.Module):
    vocab_size: int = 7
    hidden_size: int = 16

    @nn.compact
    def __call__(self, decoder_inputs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``decoder_inputs: [batch, time, vocab]`` one-hot, teacher-forced."""
        batch = decoder_inputs.shape[0]
        decoder = nn.RNN(
            DecoderLSTMCell(self.hidden_size, teacher_force=True, vocab_size=self.vocab_size),
            split_rngs={"params": False, "lstm": True, "dropout": True},
            name="decoder",
        )
        zeros = jnp.zeros((batch, self.hidden_size))
        return decoder(decoder_inputs[:, :-1], initial_carry=((zeros, zeros), decoder_inputs[:, 0]))


def test_seq2seq_lstm_and_dropout_streams_are_independent():
    inputs = jnp.asarray(np.eye(7, dtype=np.float32)[np.asarray(_tokens((16, 9), 5, 0, 7))])
    decoder = Decoder()
    rngs = {"params": jax.random.key(0), "lstm": jax.random.key(1), "dropout": jax.random.key(2)}
    variables = jax.jit(decoder.init)(rngs, inputs)

    @jax.jit
    def apply(lstm: jax.Array, dropout: jax.Array) -> tuple[jax.Array, ...]:
        return decoder.apply(variables, inputs, rngs={"lstm": lstm, "dropout": dropout})

    def run(lstm: int, dropout: int) -> tuple[np.ndarray, np.ndarray]:
        logits, predictions = apply(jax.random.key(lstm), jax.random.key(dropout))
        return np.asarray(logits), np.asarray(predictions)

    logits, predictions = run(1, 2)
    assert logits.shape == (16, 8, 7) and predictions.shape == (16, 8, 7)
    # New 'lstm' key: same logits (teacher forcing), other samples.
    logits_l, predictions_l = run(11, 2)
    np.testing.assert_array_equal(logits_l, logits)
    assert not np.array_equal(predictions_l, predictions)
    # New 'dropout' key: other logits.
    logits_d, _ = run(1, 12)
    assert not np.array_equal(logits_d, logits)


class _DropCell(nn.Module):
    @nn.compact
    def __call__(self, carry: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return carry, dl.Dropout(0.5, deterministic=False)(x)


@pytest.mark.parametrize("split", [True, False])
def test_scan_split_rngs_controls_per_step_masks(split):
    scan = nn.scan(
        _DropCell,
        variable_broadcast="params",
        split_rngs={"params": False, "dropout": split},
        in_axes=0,
        out_axes=0,
    )
    xs = jnp.ones((6, 32))
    _, ys = scan().apply({}, jnp.zeros(()), xs, rngs={"dropout": jax.random.key(0)})
    masks = np.asarray(ys) != 0
    distinct = len({m.tobytes() for m in masks})
    # split_rngs={'dropout': True} gives every step its own mask; False repeats one.
    assert distinct == (6 if split else 1)


# --- NNX ----------------------------------------------------------------------------


class NnxModel(nnx.Module):
    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs, dropout: Callable[..., nnx.Module]):
        self.linear = nnx.Linear(din, dout, rngs=rngs)
        self.dropout = dropout(0.5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.dropout(self.linear(x))


def test_nnx_train_eval_and_view():
    model = NnxModel(4, 8, rngs=nnx.Rngs(params=0, dropout=1), dropout=dnnx.Dropout)
    x = _uniform((5, 4), seed=0)
    dense = model.linear(x)
    model.train()
    first, second = model(x), model(x)
    _assert_dropped_or_scaled(first, dense, rate=0.5)
    assert not np.array_equal(first, second)  # the stream advances per call
    model.eval()
    np.testing.assert_array_equal(model(x), dense)
    training_view = nnx.view(model, deterministic=False)
    _assert_dropped_or_scaled(training_view(x), dense, rate=0.5)
    assert model.dropout.deterministic is True  # the view did not change the model
    model.train()
    eval_view = nnx.view(model, deterministic=True)
    np.testing.assert_array_equal(eval_view(x), dense)
    # Same seeds, same sequence of masks.
    twin = NnxModel(4, 8, rngs=nnx.Rngs(params=0, dropout=1), dropout=dnnx.Dropout)
    twin.train()
    np.testing.assert_array_equal(twin(x), first)
    np.testing.assert_array_equal(twin(x), second)


def test_nnx_jitted_train_step_advances_the_dropout_stream():
    model = NnxModel(4, 3, rngs=nnx.Rngs(params=0, dropout=1), dropout=dnnx.Dropout)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = _normal((16, 4), seed=0)
    labels = jnp.arange(16) % 3

    @nnx.jit
    def train_step(model, optimizer, x, labels):
        def loss_fn(model):
            logits = model(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    model.train()
    count = int(model.dropout.rngs.count[...])
    losses = [float(train_step(model, optimizer, x, labels)) for _ in range(3)]
    assert int(model.dropout.rngs.count[...]) == count + 3
    assert all(np.isfinite(losses))
    model.eval()
    np.testing.assert_array_equal(model(x), model(x))


# --- Drop-in swap: Flax's layers vs dropmask's with impl="flax" -----------------------


@functools.partial(jax.jit, static_argnums=0)
def _train_output_and_grads(
    model: MyModel, params: Any, x: jax.Array, dropout_key: jax.Array
) -> tuple[jax.Array, Any]:
    """Training-mode output and the gradient of ``sum(sin(output))`` w.r.t. params."""

    def loss(params: Any) -> tuple[jax.Array, jax.Array]:
        y = model.apply({"params": params}, x, training=True, rngs={"dropout": dropout_key})
        return jnp.sum(jnp.sin(y)), y

    (_, y), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return y, grads


@pytest.mark.parametrize("seed", [0, 1])
def test_swap_linen_outputs_and_grads_bit_identical(seed, x):
    params_key, dropout_key = jax.random.split(jax.random.key(seed))
    theirs, ours = MyModel(3, dropout=nn.Dropout), MyModel(3, dropout=FLAX_EXACT_LINEN)
    params = theirs.init(params_key, x, training=False)["params"]
    assert jax.tree.structure(ours.init(params_key, x, training=False)) == jax.tree.structure(
        {"params": params}
    )
    y_theirs, g_theirs = _train_output_and_grads(theirs, params, x, dropout_key)
    y_ours, g_ours = _train_output_and_grads(ours, params, x, dropout_key)
    np.testing.assert_array_equal(y_ours, y_theirs)
    jax.tree.map(np.testing.assert_array_equal, g_ours, g_theirs)
    _assert_dropped_or_scaled(y_ours, theirs.apply({"params": params}, x, training=False), 0.5)


def test_swap_linen_guide_training_loop_bit_identical():
    theirs, their_losses = _run_guide_loop(nn.Dropout, TrainState, steps=5)
    ours, our_losses = _run_guide_loop(FLAX_EXACT_LINEN, TrainState, steps=5)
    assert our_losses == their_losses
    jax.tree.map(np.testing.assert_array_equal, ours.params, theirs.params)


def test_swap_linen_broadcast_dims_and_two_layers_bit_identical():
    inputs = _normal((4, 8, 16), seed=3)
    config = WmtConfig(mlp_dim=16)
    theirs = MlpBlock(config, dropout=functools.partial(nn.Dropout, broadcast_dims=(1,)))
    ours = MlpBlock(config, dropout=functools.partial(FLAX_EXACT_LINEN, broadcast_dims=(1,)))
    params = theirs.init(jax.random.key(0), inputs)["params"]
    rngs = {"dropout": jax.random.key(1)}
    np.testing.assert_array_equal(
        ours.apply({"params": params}, inputs, rngs=rngs),
        theirs.apply({"params": params}, inputs, rngs=rngs),
    )


def test_swap_sst2_word_dropout_bit_identical():
    tokens = _tokens((8, 12), seed=4, low=2, high=20)
    rngs = {"dropout": jax.random.key(1)}
    theirs = GuideWordDropout(dropout_rate=0.3, unk_idx=1).apply(
        {}, tokens, deterministic=False, rngs=rngs
    )
    ours = dl.WordDropout(rate=0.3, unk_id=1, impl="flax").apply(
        {}, tokens, deterministic=False, rngs=rngs
    )
    np.testing.assert_array_equal(ours, theirs)
    assert ours.dtype == theirs.dtype
    assert 0 < np.mean(np.asarray(ours) == 1) < 0.6
    # The whole Embedder: both layers draw from one 'dropout' stream in the same order.
    variables = Embedder().init(jax.random.key(0), tokens, deterministic=True)
    theirs, ours = (
        Embedder(layers=layers).apply(variables, tokens, deterministic=False, rngs=rngs)
        for layers in ("flax", "dropmask-flax-impl")
    )
    np.testing.assert_array_equal(ours, theirs)


# Fast: with a call-time key first, which leaves the stream as it is: the calls after it
# are the whole of the case without one (slow).
@pytest.mark.parametrize("call_time_key", [pytest.param(False, marks=pytest.mark.slow), True])
def test_swap_nnx_outputs_and_grads_bit_identical(call_time_key):
    x = _normal((5, 4), seed=0)
    their_model = NnxModel(4, 8, rngs=nnx.Rngs(params=0, dropout=1), dropout=nnx.Dropout)
    our_model = NnxModel(
        4,
        8,
        rngs=nnx.Rngs(params=0, dropout=1),
        dropout=functools.partial(dnnx.Dropout, impl="flax"),
    )
    if call_time_key:
        key = jax.random.key(7)
        np.testing.assert_array_equal(
            our_model.dropout(x, rngs=key), their_model.dropout(x, rngs=key)
        )
    # Three calls in a row: the forked streams advance identically.
    for _ in range(3):
        np.testing.assert_array_equal(our_model(x), their_model(x))

    def loss_fn(model: NnxModel) -> jax.Array:
        return jnp.sum(jnp.sin(model(x)))

    g_ours = nnx.grad(loss_fn)(our_model)
    g_theirs = nnx.grad(loss_fn)(their_model)
    jax.tree.map(
        np.testing.assert_array_equal, nnx.to_pure_dict(g_ours), nnx.to_pure_dict(g_theirs)
    )
