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
from flax import struct

import dropmask
from dropmask.training import ClassifierEval, Example, TrainState

from . import configs, input_pipeline
from .models import TextClassifier


class State(TrainState):
    """``TrainState`` plus ``config.r_drop``, a static field (it fixes the train step)."""

    r_drop: float = struct.field(pytree_node=False, default=0.0)


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> State:
    """Initialises the classifier on two padded training sentences (``training=False``)."""
    model = TextClassifier(
        len(data.vocab), config.embed_dim, config.hidden, config.rate, config.word_rate
    )
    tx = optax.adam(config.learning_rate)
    batch = input_pipeline.pad(data.train, np.arange(2), data.buckets)
    variables = model.init(params_key, batch["tokens"], batch["length"], False)
    return State.create(
        apply_fn=model.apply,
        params=variables["params"],
        tx=tx,
        key=dropout_key,
        r_drop=float(config.r_drop),
    )


@jax.jit
def train_step(state: State, batch: dict[str, jax.Array]) -> tuple[State, dict[str, jax.Array]]:
    """One Adam step on ``{'tokens', 'length', 'label'}`` with word and feature dropout.

    With ``r_drop > 0`` (R-Drop, Liang et al., 2021) the model runs twice with
    different masks (``dropmask.r_drop_passes``) and the loss is ``(CE_a + CE_b +
    r_drop * KL_sym(a, b)) / 2``: the paper's loss over two, so that ``r_drop`` is its
    alpha and the cross-entropy keeps the scale of one pass.
    """
    rngs = state.rngs("dropout")
    labels = batch["label"]

    def forward(params: dict, key: jax.Array) -> jax.Array:
        tokens, length = batch["tokens"], batch["length"]
        return state.apply_fn({"params": params}, tokens, length, True, rngs={"dropout": key})

    def loss_fn(params: dict) -> tuple[jax.Array, jax.Array]:
        if not state.r_drop:
            logits = forward(params, rngs["dropout"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, logits
        a, b = dropmask.r_drop_passes(lambda k: forward(params, k), rngs["dropout"])
        ce = optax.softmax_cross_entropy_with_integer_labels
        loss = 0.5 * (ce(a, labels).mean() + ce(b, labels).mean())
        return loss + 0.5 * state.r_drop * dropmask.symmetric_kl(a, b), a

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
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
