"""Trains the sentence classifier on the shared loop: ``dropmask train sst2``.

Only what is specific to sst2 lives here; ``dropmask.training`` does devices,
checkpoints, resume, logging and plots.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from dropmask.training import ClassifierEval, Example, TrainState

from . import configs, input_pipeline
from .models import TextClassifier


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> TrainState:
    """Initialises the classifier on two padded training sentences (``training=False``)."""
    model = TextClassifier(
        len(data.vocab), config.embed_dim, config.hidden, config.rate, config.word_rate
    )
    tx = optax.adam(config.learning_rate)
    batch = input_pipeline.pad(data.train, np.arange(2), data.buckets)
    variables = model.init(params_key, batch["tokens"], batch["length"], False)
    return TrainState.create(
        apply_fn=model.apply, params=variables["params"], tx=tx, key=dropout_key
    )


@jax.jit
def train_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One Adam step on ``{'tokens', 'length', 'label'}`` with word and feature dropout."""
    rngs = state.rngs("dropout")

    def loss_fn(params: dict) -> tuple[jax.Array, jax.Array]:
        logits = state.apply_fn(
            {"params": params}, batch["tokens"], batch["length"], True, rngs=rngs
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return state.apply_gradients(grads=grads), {"loss": loss, "accuracy": accuracy}


def model_inputs(batch: dict[str, np.ndarray]) -> tuple[jax.Array, jax.Array]:
    """The classifier's positional inputs: ``tokens: int32[b, t]``, ``length: int32[b]``."""
    return jnp.asarray(batch["tokens"]), jnp.asarray(batch["length"])


# Evaluation: the whole split padded to one bucket, word and feature dropout off; and
# for ``--mc-samples``, K draws with both on.
classifier = ClassifierEval(split_batch=input_pipeline.split_batch, model_inputs=model_inputs)


example = Example(
    name="sst2",
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
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "sst2", *sys.argv[1:]]))
