"""Trains the sentence classifier on the shared loop: ``dropmask train sst2``.

Only what is specific to sst2 lives here; ``dropmask.training`` does devices,
checkpoints, resume, logging and plots.
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


@jax.jit
def eval_step(state: TrainState, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Deterministic loss and accuracy (no dropout, no key)."""
    logits = state.apply_fn({"params": state.params}, batch["tokens"], batch["length"], False)
    return {
        "loss": optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(),
        "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"]),
    }


def _whole_split(data: input_pipeline.Data, split: str) -> dict[str, np.ndarray]:
    """The held-out split (``'eval'``) or the training split as one padded batch."""
    part = data.dev if split == "eval" else data.train
    longest = max(len(t) for t in part.tokens)
    buckets = tuple(b for b in data.buckets if b >= longest) or (longest,)
    return input_pipeline.pad(part, np.arange(len(part)), buckets[:1])


def evaluate(
    state: TrainState, config: ml_collections.ConfigDict, data: input_pipeline.Data, split: str
) -> dict[str, float]:
    """Loss and accuracy on the held-out split (``'eval'``) or the training split."""
    del config
    return {k: float(v) for k, v in eval_step(state, _whole_split(data, split)).items()}


@functools.partial(jax.jit, static_argnames="num_samples")
def predict_logits(
    state: TrainState, batch: dict[str, jax.Array], key: jax.Array | None, num_samples: int
) -> jax.Array:
    """Logits ``f32[n, 2]`` with dropout off (``num_samples=0``), else ``f32[K, n, 2]``
    with word and feature dropout on, sample ``i`` keyed by ``fold_in(key, i)``."""
    variables = {"params": state.params}
    args = (batch["tokens"], batch["length"])
    if num_samples == 0:
        return state.apply_fn(variables, *args, False)

    def one(args: tuple[jax.Array, jax.Array], k: jax.Array) -> jax.Array:
        return state.apply_fn(variables, *args, True, rngs={"dropout": k})

    return uncertainty.sample(one, args, key, num_samples)


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
    batch = _whole_split(data, split)
    return predict_logits(state, batch, key, num_samples), batch["label"]


example = Example(
    name="sst2",
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
    model_inputs=lambda batch: (jnp.asarray(batch["tokens"]), jnp.asarray(batch["length"])),
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "sst2", *sys.argv[1:]]))
