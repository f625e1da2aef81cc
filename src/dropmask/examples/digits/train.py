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
   training=False)`` to evaluate.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from dropmask import uncertainty
from dropmask.training import Example, TrainState

from . import configs, input_pipeline
from .models import MLP


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> TrainState:
    """Initialises the MLP on one training image and wraps it with Adam.

    ``init`` runs with ``training=False``: it only needs parameter shapes, so no
    dropout key is involved and ``params_key`` feeds the ``'params'`` stream alone.
    """
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

    Returns:
      ``(new_state, {'loss', 'accuracy'})``: the batch's mean cross-entropy and
      accuracy under this step's masks.
    """
    # The stored key never changes; state.rngs folds in the step, so each step has
    # its own masks and re-running a step from the same state reproduces them.
    rngs = state.rngs("dropout")

    def loss_fn(params: dict) -> tuple[jax.Array, jax.Array]:
        logits = state.apply_fn({"params": params}, batch["image"], training=True, rngs=rngs)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return state.apply_gradients(grads=grads), {"loss": loss, "accuracy": accuracy}


@jax.jit
def eval_step(state: TrainState, image: jax.Array, label: jax.Array) -> dict[str, jax.Array]:
    """Deterministic loss and accuracy on ``image: f32[n, 64]``, ``label: i32[n]``.

    ``training=False`` turns every dropout layer off, so no ``rngs`` are passed.
    """
    logits = state.apply_fn({"params": state.params}, image, training=False)
    return {
        "loss": optax.softmax_cross_entropy_with_integer_labels(logits, label).mean(),
        "accuracy": jnp.mean(jnp.argmax(logits, axis=-1) == label),
    }


def evaluate(
    state: TrainState, config: ml_collections.ConfigDict, data: input_pipeline.Data, split: str
) -> dict[str, float]:
    """Loss and accuracy on the whole test split (``'eval'``) or train split (``'train_eval'``)."""
    del config
    part = data.test if split == "eval" else data.train
    return {k: float(v) for k, v in eval_step(state, part.image, part.label).items()}


@functools.partial(jax.jit, static_argnames="num_samples")
def predict_logits(
    state: TrainState, image: jax.Array, key: jax.Array | None, num_samples: int
) -> jax.Array:
    """Logits ``f32[n, 10]`` with dropout off (``num_samples=0``), else ``f32[K, n, 10]``
    of ``K`` predictions with dropout on, sample ``i`` keyed by ``fold_in(key, i)``."""
    variables = {"params": state.params}
    if num_samples == 0:
        return state.apply_fn(variables, image, training=False)

    def one(x: jax.Array, k: jax.Array) -> jax.Array:
        return state.apply_fn(variables, x, training=True, rngs={"dropout": k})

    return uncertainty.sample(one, image, key, num_samples)


def predict(
    state: TrainState,
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    split: str,
    key: jax.Array | None,
    num_samples: int,
) -> tuple[jax.Array, np.ndarray]:
    """The logits and labels of a split, for the Monte Carlo evaluation (``--mc-samples``)."""
    del config
    part = data.test if split == "eval" else data.train
    return predict_logits(state, part.image, key, num_samples), part.label


example = Example(
    name="digits",
    get_config=configs.get_config,
    load_data=input_pipeline.load,
    create_state=create_state,
    train_batch=input_pipeline.train_batch,
    train_step=train_step,
    evaluate=evaluate,
    eval_splits=("train_eval", "eval"),
    best_metric="accuracy",
    best_mode="max",
    data_position=input_pipeline.position,
    predict=predict,
    get_tiny_config=configs.get_tiny_config,
    model_inputs=lambda batch: (jnp.asarray(batch["image"]),),
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "digits", *sys.argv[1:]]))
