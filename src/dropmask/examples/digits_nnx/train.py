"""Trains the digits MLP written in Flax NNX, on the same shared loop as the Linen one.

Run ``dropmask train digits_nnx``. Data, configs and everything the loop does
(devices, checkpoints, exact resume, logging, ``--compare-rates``, ``--mc-samples``)
are those of ``dropmask train digits``; only the model's API differs:

1. the loop splits one root key into data, params and dropout keys, as for Linen;
2. the model is built with ``nnx.Rngs(params=params_key, dropout=dropout_key)`` and
   kept in a :class:`dropmask.training.NnxTrainState` (``nnx.split``: graph
   definition, parameters, streams, other variables) with ``key=dropout_key``;
3. inside the jitted ``train_step``, ``state.model(params)`` rebuilds the model in
   training mode with each dropout stream keyed by the step, so every step draws
   fresh masks and a resumed step draws the same ones;
4. evaluation rebuilds it with ``training=False`` (``model.eval()``), as
   ``dropmask.training.ClassifierEval`` does for an ``NnxTrainState``.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from dropmask.training import ClassifierEval, Example, NnxTrainState

from ..digits import configs, input_pipeline
from .models import MLP


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> NnxTrainState:
    """Builds the MLP from ``params_key`` and wraps it with Adam and ``key=dropout_key``."""
    model = MLP(
        input_pipeline.NUM_PIXELS,
        tuple(config.hidden),
        input_pipeline.NUM_CLASSES,
        rate=config.rate,
        input_rate=config.input_rate,
        rngs=nnx.Rngs(params=params_key, dropout=dropout_key),
    )
    return NnxTrainState.create(model=model, tx=optax.adam(config.learning_rate), key=dropout_key)


@jax.jit
def train_step(
    state: NnxTrainState, batch: dict[str, jax.Array]
) -> tuple[NnxTrainState, dict[str, jax.Array]]:
    """One Adam step on ``batch = {'image': f32[b, 64], 'label': i32[b]}``, dropout on.

    Returns:
      ``(new_state, {'loss', 'accuracy'})`` under this step's masks.
    """

    def loss_fn(params: nnx.State) -> tuple[jax.Array, jax.Array]:
        logits = state.model(params)(batch["image"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return state.apply_gradients(grads=grads), {"loss": loss, "accuracy": accuracy}


def model_inputs(batch: dict[str, np.ndarray]) -> tuple[jax.Array]:
    """The MLP's one positional input, ``image: f32[b, 64]``."""
    return (jnp.asarray(batch["image"]),)


# NNX selects the mode with .train() / .eval(), not a call argument: no mode keywords.
classifier = ClassifierEval(
    split_batch=input_pipeline.split_batch,
    model_inputs=model_inputs,
    train_kwargs={},
    eval_kwargs={},
)


example = Example(
    name="digits_nnx",
    get_config=configs.get_config,
    load_data=input_pipeline.load,
    create_state=create_state,
    train_batch=input_pipeline.train_batch,
    train_step=train_step,
    evaluate=classifier.evaluate,
    eval_splits=("train_eval", "eval"),
    best_metric="accuracy",
    best_mode="max",
    data_position=input_pipeline.position,
    predict=classifier.predict,
    get_tiny_config=configs.get_tiny_config,
    model_inputs=model_inputs,
    train_kwargs={},
    eval_kwargs={},
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "digits_nnx", *sys.argv[1:]]))
