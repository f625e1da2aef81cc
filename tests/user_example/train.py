"""A user's own example outside dropmask: ``dropmask train path/to/user_example``.

Three Gaussian blobs, a small classifier, the shared loop. ``dropmask audit`` runs
it too (``model_inputs`` says what the model takes). Siblings are imported
relatively, as the command imports a directory as a package.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from dropmask.training import Example, TrainState, base_config, epoch_batch, epoch_position

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


def create_state(config, data, params_key, dropout_key) -> TrainState:
    model = Classifier(rate=float(config.rate))
    params = model.init(params_key, jnp.asarray(data["x"][:1]), training=False)["params"]
    tx = optax.sgd(config.learning_rate)
    return TrainState.create(apply_fn=model.apply, params=params, tx=tx, key=dropout_key)


def train_batch(config, data, data_key, step) -> dict[str, np.ndarray]:
    index = epoch_batch(data_key, step, num_examples=len(data["y"]), batch_size=config.batch_size)
    return {"x": data["x"][index], "y": data["y"][index]}


@jax.jit
def train_step(state: TrainState, batch):
    rngs = state.rngs("dropout")

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["x"], training=True, rngs=rngs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss}


def evaluate(state: TrainState, config, data, split) -> dict[str, float]:
    logits = state.apply_fn({"params": state.params}, data["x"], training=False)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, data["y"]).mean()
    accuracy = jnp.mean(jnp.argmax(logits, -1) == data["y"])
    return {"loss": float(loss), "accuracy": float(accuracy)}


example = Example(
    name="blobs",
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
)
