"""Trains an MLP on digits with dropout, the Flax dropout guide's way, on the shared loop.

Run ``dropmask train digits`` (or ``python -m dropmask.examples.digits.train``, the
same command). This module provides only what is specific to digits; the loop in
``dropmask.training`` does devices, checkpoints, resume, logging and plots. The
workflow is the guide's, with ``dropmask.linen.Dropout`` in place of
``flax.linen.Dropout``:

1. the loop splits one root key into data (batch order), params and dropout keys;
2. ``init`` with ``training=False`` (no dropout key needed for shapes);
3. the dropout key lives in a ``TrainState``; inside the jitted ``train_step``
   ``state.rngs('dropout')`` folds in the step, so every step draws fresh masks;
4. ``apply(..., training=True, rngs=...)`` to train, plain ``apply(...,
   training=False)`` to evaluate (``dropmask.training.ClassifierEval``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from dropmask import DropmaskValueError
from dropmask.training import ClassifierEval, Example, TrainState

from . import configs, input_pipeline
from .models import MLP, ConvNet


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> TrainState:
    """Initialises the model (``config.model``) on one training image and wraps it with Adam.

    ``init`` runs with ``training=False``: it only needs parameter shapes, so no
    dropout key is involved and ``params_key`` feeds the ``'params'`` stream alone.

    Raises:
      DropmaskValueError: an entry the chosen model does not read set: ``block_size``
        with ``model="mlp"``, ``input_rate`` with ``model="conv"``.
    """
    unread = {"mlp": ("block_size", 0), "conv": ("input_rate", 0.0)}.get(config.model)
    if unread is not None and config[unread[0]] != unread[1]:
        raise DropmaskValueError(
            f"digits: config.{unread[0]} must be {unread[1]} with model={config.model!r} "
            f"(that model does not read it), got {config[unread[0]]!r}. Leave it out, or "
            f"set --config.model={'conv' if config.model == 'mlp' else 'mlp'}."
        )
    model: MLP | ConvNet
    if config.model == "conv":
        model = ConvNet(
            channels=tuple(config.hidden), rate=config.rate, block_size=config.block_size
        )
    else:
        model = MLP(hidden=tuple(config.hidden), rate=config.rate, input_rate=config.input_rate)
    tx = optax.adam(config.learning_rate)
    variables = model.init(params_key, jnp.asarray(data.train.image[:1]), training=False)
    return TrainState.create(
        apply_fn=model.apply, params=variables["params"], tx=tx, key=dropout_key
    )


@jax.jit
def train_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One Adam step on ``batch = {'image': f32[b, 64], 'label': i32[b]}``, dropout on.

    With ``config.rate_schedule`` other than ``"constant"`` the loop adds ``'rate'``,
    this step's hidden dropout rate (a run-time scalar: one compilation for the run).

    Returns:
      ``(new_state, {'loss', 'accuracy'})``: the batch's mean cross-entropy and
      accuracy under this step's masks.
    """
    # The stored key never changes; state.rngs folds in the step, so each step has
    # its own masks and re-running a step from the same state reproduces them.
    rngs = state.rngs("dropout")
    rate = {"rate": batch["rate"]} if "rate" in batch else {}

    def logits_fn(params: dict) -> jax.Array:
        return state.apply_fn({"params": params}, batch["image"], training=True, rngs=rngs, **rate)

    return cross_entropy_step(state, batch, logits_fn)


def cross_entropy_step(
    state: Any, batch: dict[str, jax.Array], logits_fn: Callable[[Any], jax.Array]
) -> tuple[Any, dict[str, jax.Array]]:
    """One optimizer step on the mean cross-entropy of ``logits_fn(params)`` against
    ``batch['label']``: the new state and ``{'loss', 'accuracy'}``.

    The Linen and the NNX train steps differ only in ``logits_fn``, how they call the
    model in training mode.
    """

    def loss_fn(params: Any) -> tuple[jax.Array, jax.Array]:
        logits = logits_fn(params)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return state.apply_gradients(grads=grads), {"loss": loss, "accuracy": accuracy}


def model_inputs(batch: dict[str, np.ndarray]) -> tuple[jax.Array]:
    """The MLP's one positional input, ``image: f32[b, 64]``."""
    return (jnp.asarray(batch["image"]),)


# Evaluation: the whole split with ``training=False`` (no dropout, no key): loss and
# accuracy; and for ``--mc-samples``, the logits with dropout off or K draws with it on.
classifier = ClassifierEval(split_batch=input_pipeline.split_batch, model_inputs=model_inputs)


example = Example(
    name="digits",
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

    sys.exit(main(["train", "digits", *sys.argv[1:]]))
