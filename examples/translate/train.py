"""Trains the Transformer translator on the shared loop: ``dropmask train translate``.

This module provides only what is specific to translation (model, loss, decoding,
BLEU); the loop in ``dropmask.training`` does devices, checkpoints, resume, logging
and plots. Training reads packed rows with label-smoothed cross-entropy over the
valid target tokens; evaluation decodes the held-out sources with beam search (or
greedily when ``beam_size`` is 1) and scores the detokenized outputs with sacrebleu
and exact match.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import sacrebleu

import dropmask
from dropmask.training import Example, TrainState

from . import configs, decode, input_pipeline
from .models import Transformer, TransformerConfig

# Training targets put 0.9 on the label and spread 0.1 over the vocabulary, as
# Flax's WMT example does; evaluation scores the plain cross-entropy.
LABEL_SMOOTHING = 0.1

# The config entries that are the model's shape, each a TransformerConfig field of the
# same name.
_SHAPE_ENTRIES = ("emb_dim", "num_heads", "num_layers", "qkv_dim", "mlp_dim", "max_len")


def model_config(config: ml_collections.ConfigDict, data: input_pipeline.Data) -> TransformerConfig:
    """The training model's config (``deterministic=False``) for ``config`` and ``data``."""
    return TransformerConfig(
        vocab_size=data.tokenizer.vocab_size,
        **{name: int(config[name]) for name in _SHAPE_ENTRIES},
        dropout_rate=float(config.rate),
        attention_dropout_rate=float(config.rate),
        attention_algorithm=str(config.attention_algorithm),
        layer_drop=float(config.layer_drop),
        pruned_encoder=_layers(config, "pruned_encoder"),
        pruned_decoder=_layers(config, "pruned_decoder"),
    )


def _layers(config: ml_collections.ConfigDict, name: str) -> tuple[int, ...]:
    """``config[name]``, indices of pruned layers, as ints; a stack keeps one layer at least."""
    entry: Any = config[name]
    indices = tuple(int(i) for i in entry)
    layers = int(config.num_layers)
    if not set(indices) <= set(range(layers)) or len(set(indices)) >= layers:
        raise dropmask.DropmaskValueError(
            f"translate: config.{name} must be indices in [0, {layers}) that leave at least "
            f"one layer, got {indices}. Pick them with dropmask.kept_layers."
        )
    return indices


def model_inputs(batch: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
    """The positional arguments of ``Transformer.__call__`` taken from a packed batch."""
    keys = ("inputs", "targets_in", "inputs_segmentation", "targets_segmentation")
    return tuple(batch[k] for k in (*keys, "inputs_position", "targets_position"))


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> TrainState:
    """Initialises the model on two packed rows (deterministic) with Adam."""
    model = Transformer(model_config(config, data))
    steps = config.decay_steps or config.steps
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        config.learning_rate,
        warmup_steps=min(config.warmup_steps, steps - 1),
        decay_steps=max(steps, 1),
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule, b2=0.98))
    rows = {k: v[:2] for k, v in data.train.items()}
    init = Transformer(model.config.replace(deterministic=True))
    variables = init.init(params_key, *model_inputs(rows))
    return TrainState.create(
        apply_fn=model.apply, params=variables["params"], tx=tx, key=dropout_key
    )


def _smoothed(targets: jax.Array, vocab: int, smoothing: float) -> jax.Array:
    """Target distributions ``[..., vocab]``: ``1 - smoothing`` on the label, the rest spread."""
    one_hot = jax.nn.one_hot(targets, vocab)
    return one_hot * (1.0 - smoothing) + smoothing / vocab


@jax.jit
def train_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One Adam step on packed rows under this step's dropout masks.

    Returns:
      ``(new_state, {'loss', 'token_accuracy'})``: the label-smoothed cross-entropy
      and the teacher-forced accuracy over valid target tokens.
    """
    rngs = state.rngs("dropout")
    valid = batch["targets_segmentation"] > 0

    def loss_fn(params: dict) -> tuple[jax.Array, jax.Array]:
        logits = state.apply_fn({"params": params}, *model_inputs(batch), rngs=rngs)
        labels = _smoothed(batch["targets"], logits.shape[-1], LABEL_SMOOTHING)
        return dropmask.masked_cross_entropy(logits, labels, valid), logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    right = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
    metrics = {"loss": loss, "token_accuracy": dropmask.masked_mean(right, valid)}
    return state.apply_gradients(grads=grads), metrics


@functools.partial(jax.jit, static_argnames="config")
def _teacher_forced(
    params: dict, batch: dict[str, jax.Array], config: TransformerConfig
) -> dict[str, jax.Array]:
    """Sums of the plain cross-entropy and of right tokens, and the token count."""
    logits = Transformer(config.replace(deterministic=True)).apply(
        {"params": params}, *model_inputs(batch)
    )
    valid = batch["targets_segmentation"] > 0
    loss = dropmask.masked_cross_entropy(logits, batch["targets"], valid, reduction="sum")
    right = (jnp.argmax(logits, -1) == batch["targets"]) & valid
    return {"loss": loss, "right": jnp.sum(right), "tokens": jnp.sum(valid)}


def translate_batch(
    params: dict,
    batch: dict[str, np.ndarray],
    config: TransformerConfig,
    beam_size: int,
    alpha: float,
) -> np.ndarray:
    """Output tokens ``int32[batch, max_len]`` for the sources of an unpacked batch."""
    args = (params, batch["inputs"], batch["inputs_segmentation"], config)
    if beam_size == 1:
        return np.asarray(decode.greedy(*args))
    return np.asarray(decode.beam_search(*args, beam_size, alpha))


def evaluate(
    state: TrainState, config: ml_collections.ConfigDict, data: input_pipeline.Data, split: str
) -> dict[str, float]:
    """Loss, token accuracy, BLEU and exact match on held-out (``'eval'``) or training pairs.

    Loss and accuracy are teacher-forced and without label smoothing; BLEU (sacrebleu,
    corpus level, 0-100) and ``exact_match`` (the fraction of outputs equal to the
    reference) score decoded, detokenized outputs. All without dropout.
    """
    pairs = data.eval if split == "eval" else data.train_eval
    model = model_config(config, data)
    sums = {"loss": 0.0, "right": 0.0, "tokens": 0.0}
    outputs = []
    for batch in pairs.batches(int(config.eval_batch_size)):
        for k, v in _teacher_forced(state.params, batch, model).items():
            sums[k] += float(v)
        tokens = translate_batch(
            state.params, batch, model, int(config.beam_size), float(config.beam_alpha)
        )
        outputs += data.tokenizer.decode(tokens)
    hypotheses = outputs[: pairs.size]
    references = list(pairs.references)
    exact = np.mean([h == r for h, r in zip(hypotheses, references, strict=True)])
    return {
        "loss": sums["loss"] / max(sums["tokens"], 1.0),
        "token_accuracy": sums["right"] / max(sums["tokens"], 1.0),
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score),
        "exact_match": float(exact),
    }


def translate(
    state: TrainState,
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    sentences: list[str],
) -> list[str]:
    """Translations of ``sentences`` with the config's beam size."""
    pairs = [(s, "") for s in sentences]
    where = [f"sentence {i}" for i in range(len(sentences))]
    split = input_pipeline.make_split(data.tokenizer, pairs, where, int(config.max_len), len(pairs))
    model = model_config(config, data)
    tokens = translate_batch(
        state.params, split.batch, model, int(config.beam_size), float(config.beam_alpha)
    )
    return data.tokenizer.decode(tokens)


example = Example(
    name="translate",
    get_config=configs.get_config,
    load_data=input_pipeline.load,
    create_state=create_state,
    train_batch=input_pipeline.train_batch,
    train_step=train_step,
    evaluate=evaluate,
    eval_splits=("train_eval", "eval"),
    best_metric="exact_match",
    best_mode="max",
    data_position=input_pipeline.position,
    get_tiny_config=configs.get_tiny_config,
    model_inputs=model_inputs,
    # The Transformer selects its mode by a frozen config field, as Flax's WMT example
    # does: evaluation is the same module built with deterministic=True.
    train_kwargs={},
    eval_kwargs={},
    eval_model=lambda model: Transformer(model.config.replace(deterministic=True)),
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "translate", *sys.argv[1:]]))
