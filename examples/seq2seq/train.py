"""Trains the addition seq2seq model on the shared loop: ``dropmask train seq2seq``.

This module provides only what is specific to seq2seq (model, steps, metric); the
loop in ``dropmask.training`` does devices, checkpoints, resume, logging and plots.
Two random streams: ``'dropout'`` for the masks in training and ``'lstm'`` for
sampled decoding; each step's keys come from ``state.rngs``, one rule for every
stream, so the streams never change each other's keys.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import ml_collections
import optax

import dropmask
from dropmask.training import Example, TrainState

from . import configs, input_pipeline
from .models import Seq2seq


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> TrainState:
    """Initialises the model on two held-out problems (``training=False``) with Adam.

    The step size warms up over ``warmup_steps`` and decays to 0 on a cosine by
    ``decay_steps`` (0: by ``steps``); the late small steps settle the last, rare
    carries of long sums.
    """
    model = Seq2seq(
        len(input_pipeline.VOCAB),
        embed_dim=config.embed_dim,
        hidden=config.hidden,
        rate=config.rate,
        zoneout=(config.zoneout_cell, config.zoneout_hidden),
        weight_dropout=config.weight_dropout,
    )
    steps = config.decay_steps or config.steps
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        config.learning_rate,
        warmup_steps=min(config.warmup_steps, steps - 1),
        decay_steps=max(steps, 1),
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
    p = data.eval
    variables = model.init(
        params_key, p.query[:2], p.query_length[:2], p.answer[:2], p.answer_length[:2], False
    )
    return TrainState.create(
        apply_fn=model.apply, params=variables["params"], tx=tx, key=dropout_key
    )


def _loss(logits: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    valid = dropmask.sequence_mask(batch["answer_length"], batch["answer"].shape[1])
    return dropmask.masked_cross_entropy(logits, batch["answer"], valid)


def _exact(tokens: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """1 where every answer token, ``<eos>`` included, is right; ``float32[b]``."""
    valid = dropmask.sequence_mask(batch["answer_length"], batch["answer"].shape[1])
    return jnp.all((tokens == batch["answer"]) | ~valid, axis=-1).astype(jnp.float32)


@jax.jit
def train_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One teacher-forced Adam step on a batch of :class:`input_pipeline.Problems`.

    Returns:
      ``(new_state, {'loss', 'token_accuracy'})`` under this step's dropout masks.
    """
    rngs = state.rngs("dropout")

    def loss_fn(params: dict) -> tuple[jax.Array, jax.Array]:
        logits = state.apply_fn(
            {"params": params},
            batch["query"],
            batch["query_length"],
            batch["answer"],
            batch["answer_length"],
            True,
            rngs=rngs,
        )
        return _loss(logits, batch), logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    valid = dropmask.sequence_mask(batch["answer_length"], batch["answer"].shape[1])
    right = (jnp.argmax(logits, -1) == batch["answer"]).astype(jnp.float32)
    metrics = {"loss": loss, "token_accuracy": dropmask.masked_mean(right, valid)}
    return state.apply_gradients(grads=grads), metrics


@jax.jit
def eval_step(state: TrainState, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Teacher-forced loss, greedy and sampled exact match, all without dropout.

    Sampling draws from this step's ``'lstm'`` key, so evaluating one state twice
    gives the same numbers.
    """
    args = (batch["query"], batch["query_length"])
    steps = batch["answer"].shape[1]
    variables = {"params": state.params}
    logits = state.apply_fn(variables, *args, batch["answer"], batch["answer_length"], False)
    greedy = state.apply_fn(variables, *args, steps, method=Seq2seq.generate)
    sampled = state.apply_fn(
        variables, *args, steps, True, method=Seq2seq.generate, rngs=state.rngs("lstm")
    )
    return {
        "loss": _loss(logits, batch),
        "exact_match": jnp.mean(_exact(greedy, batch)),
        "sample_exact_match": jnp.mean(_exact(sampled, batch)),
    }


def evaluate(
    state: TrainState, config: ml_collections.ConfigDict, data: input_pipeline.Data, split: str
) -> dict[str, float]:
    """Metrics on the held-out problems (``'eval'``) or a training sample (``'train_eval'``)."""
    del config
    problems = data.eval if split == "eval" else data.train_eval
    return {k: float(v) for k, v in eval_step(state, problems.as_batch()).items()}


def predict(state: TrainState, data: input_pipeline.Data, queries: list[str]) -> list[str]:
    """Greedy answers to ``queries`` such as ``["12+345"]``."""
    pairs = [tuple(int(v) for v in q.split("+")) for q in queries]
    a, b = (jnp.array(v) for v in zip(*pairs, strict=True))
    problems = input_pipeline.encode(a, b, data.max_digits)
    steps = problems.answer.shape[1]
    tokens = state.apply_fn(
        {"params": state.params},
        problems.query,
        problems.query_length,
        steps,
        method=Seq2seq.generate,
    )
    return [input_pipeline.decode(t) for t in tokens]


def position(config: ml_collections.ConfigDict, data: input_pipeline.Data, step: int) -> dict:
    """Batches are fresh problems per step: the position is the step and the held-out set."""
    del config, step
    return {"max_digits": data.max_digits, "held_out": len(data.held_out_ids)}


example = Example(
    name="seq2seq",
    get_config=configs.get_config,
    load_data=input_pipeline.load,
    create_state=create_state,
    train_batch=input_pipeline.train_batch,
    train_step=train_step,
    evaluate=evaluate,
    eval_splits=("train_eval", "eval"),
    best_metric="exact_match",
    best_mode="max",
    data_position=position,
    get_tiny_config=configs.get_tiny_config,
    model_inputs=lambda batch: tuple(
        jnp.asarray(batch[k]) for k in ("query", "query_length", "answer", "answer_length")
    ),
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "seq2seq", *sys.argv[1:]]))
