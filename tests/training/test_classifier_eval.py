"""ClassifierEval: a classifier example's evaluate and predict hooks from its model call."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dropmask import DropmaskValueError, MissingKeyError
from dropmask import linen as dl
from dropmask.training import ClassifierEval, TrainState


class _Model(nn.Module):
    """Two inputs, the mode as a keyword: ``x: [b, 4]``, ``scale: [b]`` -> logits ``[b, 3]``."""

    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, scale, *, training: bool):
        x = dl.Dropout(0.5, deterministic=not training)(x * scale[:, None])
        return nn.Dense(3, dtype=self.dtype, param_dtype=self.dtype)(x)


_DATA = {
    "eval": {
        "x": np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4),
        "scale": np.full(8, 2.0, np.float32),
        "y": np.arange(8, dtype=np.int32) % 3,
    },
    "train_eval": {
        "x": np.ones((4, 4), np.float32),
        "scale": np.ones(4, np.float32),
        "y": np.zeros(4, np.int32),
    },
}
_HOOKS = ClassifierEval(
    split_batch=lambda config, data, split: data[split],
    model_inputs=lambda batch: (batch["x"], batch["scale"]),
    label="y",
)


def _state(dtype=jnp.float32):
    model = _Model(dtype)
    batch = _DATA["eval"]
    params = model.init(jax.random.key(0), batch["x"], batch["scale"], training=False)["params"]
    return TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(0.1), key=jax.random.key(1)
    )


def test_evaluate_is_the_deterministic_loss_and_accuracy_of_each_split():
    state = _state()
    for split, batch in _DATA.items():
        logits = state.apply_fn(
            {"params": state.params}, batch["x"], batch["scale"], training=False
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        accuracy = np.mean(np.argmax(logits, -1) == batch["y"])
        got = _HOOKS.evaluate(state, None, _DATA, split)
        assert set(got) == {"loss", "accuracy"}
        assert got["loss"] == pytest.approx(float(loss), rel=1e-6)
        assert got["accuracy"] == pytest.approx(float(accuracy), abs=1e-7)
    # Dropout is off: the state's key plays no part.
    other = _HOOKS.evaluate(state.replace(key=jax.random.key(9)), None, _DATA, "eval")
    assert other == _HOOKS.evaluate(state, None, _DATA, "eval")


@pytest.mark.parametrize(("dtype", "tol"), [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_predict_gives_deterministic_logits_and_samples_keyed_by_fold_in(dtype, tol):
    state, batch = _state(dtype), _DATA["eval"]
    variables = {"params": state.params}
    logits, labels = _HOOKS.predict(state, None, _DATA, "eval", None, 0)
    assert logits.shape == (8, 3) and logits.dtype == dtype
    np.testing.assert_array_equal(labels, batch["y"])
    expected = state.apply_fn(variables, batch["x"], batch["scale"], training=False)
    np.testing.assert_allclose(
        np.asarray(logits, np.float32), np.asarray(expected, np.float32), rtol=tol, atol=tol
    )
    key = jax.random.key(3)
    samples, _ = _HOOKS.predict(state, None, _DATA, "eval", key, 3)
    assert samples.shape == (3, 8, 3) and samples.dtype == dtype
    for i in range(3):
        draw = state.apply_fn(
            variables,
            batch["x"],
            batch["scale"],
            training=True,
            rngs={"dropout": jax.random.fold_in(key, i)},
        )
        np.testing.assert_allclose(
            np.asarray(samples[i], np.float32), np.asarray(draw, np.float32), rtol=tol, atol=tol
        )
    assert not np.allclose(np.asarray(samples[0], np.float32), np.asarray(samples[1], np.float32))


def test_logits_work_on_any_inputs_and_under_grad_and_vmap():
    state = _state()
    x, scale = jnp.ones((2, 4)), jnp.ones(2)

    def total(params):
        return _HOOKS.logits(state.replace(params=params), (x, scale), None, 0).sum()

    grads = jax.grad(total)(state.params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    keys = jax.random.split(jax.random.key(4), 2)
    per_key = jax.vmap(lambda k: _HOOKS.logits(state, (x, scale), k, 2))(keys)
    assert per_key.shape == (2, 2, 2, 3)


def test_samples_without_a_key_or_a_negative_count_are_refused():
    state, inputs = _state(), (jnp.ones((2, 4)), jnp.ones(2))
    with pytest.raises(MissingKeyError, match=r"ClassifierEval\.logits .*key=None"):
        _HOOKS.logits(state, inputs, None, 2)
    with pytest.raises(DropmaskValueError, match=r"ClassifierEval\.logits: num_samples must be"):
        _HOOKS.logits(state, inputs, None, -1)
    with pytest.raises(MissingKeyError, match=r"ClassifierEval\.predict .*key=None"):
        _HOOKS.predict(state, None, _DATA, "eval", None, 3)


class _Wide(nn.Module):
    """A hidden layer wide enough that K samples' activations dominate the memory."""

    @nn.compact
    def __call__(self, x, *, training: bool):
        x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(3)(dl.Dropout(0.5, deterministic=not training)(x))


def _temp_bytes(hooks: ClassifierEval, state, x, num_samples: int) -> int:
    program = jax.jit(lambda s, x, key: hooks.logits(s, (x,), key, num_samples))
    compiled = program.lower(state, x, jax.random.key(0)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_monte_carlo_samples_are_chunked_so_memory_does_not_grow_with_k():
    model = _Wide()
    x = jnp.ones((128, 16))
    params = model.init(jax.random.key(0), x, training=False)["params"]
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(0.1), key=jax.random.key(1)
    )
    hooks = ClassifierEval(split_batch=None, model_inputs=lambda b: (b["x"],), label="y")
    assert hooks.chunk_size == 4
    one_activation = 128 * 512 * 4  # bytes of one sample's hidden layer
    small, large = _temp_bytes(hooks, state, x, 8), _temp_bytes(hooks, state, x, 100)
    # 100 samples in one vmap would hold 100 hidden layers (25.6 MB); chunks of 4 hold 4.
    assert large < small + 2 * one_activation, (small, large)
    assert large < 12 * one_activation, large
    # The samples are the same whatever the chunk.
    key = jax.random.key(3)
    whole = ClassifierEval(None, lambda b: (b["x"],), label="y", chunk_size=100)
    np.testing.assert_allclose(
        hooks.logits(state, (x,), key, 10), whole.logits(state, (x,), key, 10), rtol=1e-6, atol=1e-6
    )


def test_chunk_size_must_be_a_positive_int():
    with pytest.raises(DropmaskValueError, match="chunk_size must be >= 1"):
        ClassifierEval(None, lambda b: (b["x"],), chunk_size=0)
