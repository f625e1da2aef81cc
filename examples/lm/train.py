"""Trains a byte-level Transformer LM in Flax NNX on Python's documentation, on the shared loop.

Run ``dropmask train lm`` (or ``python -m examples.lm.train``, the same command) from a
source checkout. This module provides only what is specific to the language model;
``dropmask.training`` does devices, checkpoints, exact resume, logging, plots and
``--compare-rates``:

1. the loop splits one root key into data (window positions), params and dropout keys;
2. the model is built with ``nnx.Rngs(params=params_key, dropout=dropout_key)``; every
   dropout site forks its own ``'dropout'`` stream, and a
   :class:`dropmask.training.NnxTrainState` holds the split model with AdamW;
3. inside the jitted ``train_step``, ``state.model(params)`` rebuilds the model in
   training mode with each stream keyed by ``(key, step, stream, path)``;
4. evaluation rebuilds it with ``training=False`` and scores every held-out byte:
   ``loss`` in nats per byte and ``bpc``, bits per character. ``--mc-samples K``
   also scores the mean of ``K`` dropout samples' next-byte distributions.
"""

from __future__ import annotations

import functools
import math
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from dropmask import masked_cross_entropy, uncertainty
from dropmask.training import Example, NnxTrainState

from . import configs, input_pipeline, sample
from .models import LanguageModel


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> NnxTrainState:
    """The model from ``params_key``, and AdamW: a linear warmup from a tenth of the
    peak step size, then a cosine decay that ends at ``config.steps`` (a run extended
    with a larger ``--steps`` continues on the longer schedule)."""
    del data
    model = LanguageModel(
        config,
        input_pipeline.VOCAB_SIZE,
        rngs=nnx.Rngs(params=params_key, dropout=dropout_key),
    )
    warmup = min(config.warmup_steps, config.steps - 1)
    schedule = optax.warmup_cosine_decay_schedule(
        config.learning_rate / 10,
        config.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(config.steps, warmup + 1),
        end_value=config.learning_rate / 10,
    )
    tx = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=config.weight_decay)
    )
    return NnxTrainState.create(model=model, tx=tx, key=dropout_key)


def _loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean next-byte cross-entropy in nats over the labels that are not ``-1``."""
    return masked_cross_entropy(logits, labels, labels >= 0)


@jax.jit
def train_step(
    state: NnxTrainState, batch: dict[str, jax.Array]
) -> tuple[NnxTrainState, dict[str, jax.Array]]:
    """One AdamW step on ``batch = {'tokens': int32[b, context + 1]}``, dropout on.

    Returns:
      ``(new_state, {'loss'})``: the mean next-byte cross-entropy in nats.
    """
    tokens = batch["tokens"]

    def loss_fn(params: nnx.State) -> jax.Array:
        return _loss(state.model(params)(tokens[:, :-1]), tokens[:, 1:])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss}


@jax.jit
def _window_nats(state: NnxTrainState, windows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Summed nats and scored bytes of ``windows: int32[n, context + 1]``, dropout off."""
    logits = state.model(training=False)(jnp.maximum(windows[:, :-1], 0))
    labels = windows[:, 1:]
    return masked_cross_entropy(logits, labels, labels >= 0, reduction="sum"), jnp.sum(labels >= 0)


def _chunks(windows: np.ndarray, size: int) -> list[np.ndarray]:
    return [windows[i : i + size] for i in range(0, len(windows), size)]


def evaluate(
    state: NnxTrainState, config: ml_collections.ConfigDict, data: input_pipeline.Data, split: str
) -> dict[str, float]:
    """``loss`` (nats per byte) and ``bpc`` (bits per character) of a split's windows.

    ``bpc`` is bits per byte times bytes per character of the held-out text (ASCII
    but for a few characters, so the two differ by well under 1%).
    """
    nats, count = 0.0, 0
    for chunk in _chunks(input_pipeline.split_windows(config, data, split), config.batch_size):
        total, scored = _window_nats(state, jnp.asarray(chunk))
        nats += float(total)
        count += int(scored)
    loss = nats / count
    return {"loss": loss, "bpc": loss / math.log(2) / data.eval_chars_per_byte}


@functools.partial(jax.jit, static_argnames=("num_samples",))
def _window_logits(
    state: NnxTrainState, windows: jax.Array, key: jax.Array | None, num_samples: int
) -> jax.Array:
    inputs = jnp.maximum(windows[:, :-1], 0)
    if num_samples == 0:
        return state.model(training=False)(inputs)
    model = state.model(training=None)
    return uncertainty.sample_nnx(model, inputs, key=key, num_samples=num_samples)


def predict(
    state: NnxTrainState,
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    split: str,
    key: jax.Array | None,
    num_samples: int,
) -> tuple[jax.Array, np.ndarray]:
    """Next-byte logits of every scored byte of a split: ``(float[n, 256], int[n])``, or
    ``float[K, n, 256]`` for ``K`` samples with only the dropout layers on.

    Chunk ``c`` of windows is sampled with ``fold_in(key, c)``.
    """
    logits, labels = [], []
    for c, chunk in enumerate(
        _chunks(input_pipeline.split_windows(config, data, split), config.batch_size)
    ):
        chunk_key = None if key is None else jax.random.fold_in(key, c)
        out = _window_logits(state, jnp.asarray(chunk), chunk_key, num_samples)
        scored = chunk[:, 1:] >= 0
        logits.append(out[..., scored, :])
        labels.append(chunk[:, 1:][scored])
    return jnp.concatenate(logits, axis=-2), np.concatenate(labels)


def model_inputs(batch: dict[str, np.ndarray]) -> tuple[jax.Array]:
    """The model's one positional input: the windows without their last byte."""
    return (jnp.asarray(batch["tokens"][:, :-1]),)


example = Example(
    name="lm",
    get_config=configs.get_config,
    load_data=input_pipeline.load,
    create_state=create_state,
    train_batch=input_pipeline.train_batch,
    train_step=train_step,
    evaluate=evaluate,
    eval_splits=("train_eval", "eval"),
    best_metric="bpc",
    best_mode="min",
    data_position=input_pipeline.position,
    predict=predict,
    get_tiny_config=configs.get_tiny_config,
    configs=configs.CONFIGS,
    model_inputs=model_inputs,
    train_kwargs={},
    eval_kwargs={},
    sample=sample.sample_hook,
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "lm", *sys.argv[1:]]))
