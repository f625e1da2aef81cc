"""A user's own Flax NNX example outside dropmask: ``dropmask train path/to/user_example_nnx``.

The blobs of ``user_example``, an ``nnx.Module`` classifier in a
``dropmask.training.NnxTrainState``, the shared loop. ``dropmask audit`` runs it through
the NNX audit. Siblings are imported relatively, as the command imports a directory
as a package.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from dropmask.training import Example, NnxTrainState, base_config, epoch_batch, epoch_position

from .models import Classifier


def get_config() -> ml_collections.ConfigDict:
    config = base_config()
    config.update(steps=8, log_every=2, eval_every=4, checkpoint_every=4, rate=0.1)
    config.batch_size = 16
    config.learning_rate = 0.05
    return config


def load_data(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 96).astype(np.int32)
    centres = np.eye(3, 4, dtype=np.float32) * 3.0
    points = centres[labels] + rng.normal(size=(96, 4)).astype(np.float32)
    return {"x": points, "y": labels}


def create_state(config, data, params_key, dropout_key) -> NnxTrainState:
    model = Classifier(4, 16, 3, float(config.rate), rngs=nnx.Rngs(params_key, dropout=dropout_key))
    tx = optax.sgd(config.learning_rate)
    return NnxTrainState.create(model=model, tx=tx, key=dropout_key)


def train_batch(config, data, data_key, step) -> dict[str, np.ndarray]:
    index = epoch_batch(data_key, step, num_examples=len(data["y"]), batch_size=config.batch_size)
    return {"x": data["x"][index], "y": data["y"][index]}


@jax.jit
def train_step(state: NnxTrainState, batch):
    def loss_fn(params):
        logits = state.model(params)(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss}


def evaluate(state: NnxTrainState, config, data, split) -> dict[str, float]:
    logits = state.model(training=False)(data["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, data["y"]).mean()
    accuracy = jnp.mean(jnp.argmax(logits, -1) == data["y"])
    return {"loss": float(loss), "accuracy": float(accuracy)}


example = Example(
    name="blobs_nnx",
    get_config=get_config,
    load_data=load_data,
    create_state=create_state,
    train_batch=train_batch,
    train_step=train_step,
    evaluate=evaluate,
    best_metric="accuracy",
    best_mode="max",
    data_position=lambda config, data, step: epoch_position(
        step, num_examples=len(data["y"]), batch_size=config.batch_size
    ),
    model_inputs=lambda batch: (jnp.asarray(batch["x"]),),
    train_kwargs={},
    eval_kwargs={},
)
