"""Greedy decoding and beam search with the decoder's key/value cache.

Both encode the source once, then feed the decoder one token per step with
``config.decode=True``; each self-attention layer appends that step's key and value
to its cache, so a step costs one position, not the whole prefix. Outputs have a
fixed shape, ``max_len`` tokens (for ``jit``); a row that has emitted ``<eos>``
continues with ``<pad>``. Decoding stops once every row (every hypothesis) has
emitted ``<eos>``: the steps left would only append ``<pad>``, so the outputs are
those of all ``max_len`` steps, and a batch of short sentences costs its longest
output, not ``max_len``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from .input_pipeline import BOS, EOS, PAD
from .models import Transformer, TransformerConfig

Params = dict
Cache = dict


def _decoder(config: TransformerConfig) -> Transformer:
    return Transformer(config.replace(deterministic=True, decode=True))


def _encode(
    config: TransformerConfig, params: Params, inputs: jax.Array, segmentation: jax.Array
) -> jax.Array:
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    model = Transformer(config.replace(deterministic=True))
    return model.apply(
        {"params": params}, inputs, positions, segmentation, method=Transformer.encode
    )


def _empty_cache(
    config: TransformerConfig, params: Params, encoded: jax.Array, segmentation: jax.Array
) -> Cache:
    """A zero cache for ``encoded.shape[0]`` rows and ``config.max_len`` steps."""
    rows = encoded.shape[0]
    tokens = jnp.zeros((rows, config.max_len), jnp.int32)
    _, variables = _decoder(config).apply(
        {"params": params},
        encoded,
        segmentation,
        tokens,
        tokens,
        jnp.ones_like(tokens),
        method=Transformer.decode,
        mutable=["cache"],
    )
    return jax.tree.map(jnp.zeros_like, variables["cache"])


def _next_logits(
    config: TransformerConfig,
    params: Params,
    cache: Cache,
    encoded: jax.Array,
    segmentation: jax.Array,
    token: jax.Array,
    step: jax.Array,
) -> tuple[jax.Array, Cache]:
    """Logits ``[rows, vocab]`` after ``token`` ``int32[rows]`` at position ``step``."""
    token = token[:, None]
    logits, variables = _decoder(config).apply(
        {"params": params, "cache": cache},
        encoded,
        segmentation,
        token,
        jnp.full_like(token, step),
        jnp.ones_like(token),
        method=Transformer.decode,
        mutable=["cache"],
    )
    return logits[:, 0].astype(jnp.float32), variables["cache"]


def _running(max_len: int) -> Callable[[tuple], jax.Array]:
    """The decoding loops' condition on their carry ``(step, ..., done)``: steps
    remain and some row has not emitted ``<eos>``."""

    def cond(carry: tuple) -> jax.Array:
        step, done = carry[0], carry[-1]
        return (step < max_len) & ~jnp.all(done)

    return cond


@functools.partial(jax.jit, static_argnames="config")
def greedy(
    params: Params, inputs: jax.Array, segmentation: jax.Array, config: TransformerConfig
) -> jax.Array:
    """The most likely token at each step.

    Args:
      params: the model's parameters.
      inputs: ``int32[batch, src_len]`` source tokens, padded with ``<pad>``.
      segmentation: ``int32[batch, src_len]``: 1 on tokens, 0 on padding.
      config: the model's config (``deterministic`` and ``decode`` are set here).

    Returns:
      ``int32[batch, max_len]``: the tokens, ``<eos>`` then ``<pad>`` after the end.
    """
    encoded = _encode(config, params, inputs, segmentation)
    cache = _empty_cache(config, params, encoded, segmentation)
    batch = inputs.shape[0]

    def body(carry):
        step, cache, token, out, done = carry
        logits, cache = _next_logits(config, params, cache, encoded, segmentation, token, step)
        token = jnp.where(done, PAD, jnp.argmax(logits, axis=-1).astype(jnp.int32))
        return step + 1, cache, token, out.at[:, step].set(token), done | (token == EOS)

    init = (
        jnp.zeros((), jnp.int32),
        cache,
        jnp.full((batch,), BOS, jnp.int32),
        jnp.zeros((batch, config.max_len), jnp.int32),
        jnp.zeros((batch,), bool),
    )
    return jax.lax.while_loop(_running(config.max_len), body, init)[3]


def _gather_beams(tree: Cache, beams: jax.Array) -> Cache:
    """Rows ``[batch * beam, ...]`` reordered so that beam ``k`` continues ``beams[:, k]``."""
    batch, size = beams.shape

    def gather(x: jax.Array) -> jax.Array:
        if x.ndim == 0:  # the cache position, shared by all rows
            return x
        x = x.reshape(batch, size, *x.shape[1:])
        index = beams.reshape(batch, size, *([1] * (x.ndim - 2)))
        return jnp.take_along_axis(x, index, axis=1).reshape(batch * size, *x.shape[2:])

    return jax.tree.map(gather, tree)


@functools.partial(jax.jit, static_argnames=("config", "beam_size"))
def beam_search(
    params: Params,
    inputs: jax.Array,
    segmentation: jax.Array,
    config: TransformerConfig,
    beam_size: int,
    alpha: float = 0.6,
) -> jax.Array:
    """The best of ``beam_size`` hypotheses kept at each step, by length-normalised score.

    Each step extends every live hypothesis by every token and keeps the
    ``beam_size`` best sums of log-probabilities; a finished hypothesis (one that
    emitted ``<eos>``) stays in the beam with its score and grows only ``<pad>``. At
    the end hypotheses are ranked by ``score / ((5 + length) / 6) ** alpha`` (as in
    GNMT), which keeps short outputs from winning by having fewer terms. With
    ``beam_size=1`` this is :func:`greedy`.

    Args:
      params, inputs, segmentation, config: as in :func:`greedy`.
      beam_size: hypotheses kept per sentence.
      alpha: length-normalisation exponent; 0 ranks by the plain sum.

    Returns:
      ``int32[batch, max_len]``: the best hypothesis of each row.
    """
    batch, size = inputs.shape[0], beam_size
    encoded = jnp.repeat(_encode(config, params, inputs, segmentation), size, axis=0)
    segmentation = jnp.repeat(segmentation, size, axis=0)
    cache = _empty_cache(config, params, encoded, segmentation)
    pad_only = jnp.full((config.vocab_size,), -jnp.inf).at[PAD].set(0.0)

    # Once every hypothesis has finished, a step extends each by <pad> at no cost and
    # top_k keeps the beams' (sorted, stable) order, so stopping changes nothing.
    def body(carry):
        step, cache, token, tokens, scores, lengths, done = carry
        logits, cache = _next_logits(config, params, cache, encoded, segmentation, token, step)
        logp = jax.nn.log_softmax(logits).reshape(batch, size, -1)
        logp = jnp.where(done[..., None], pad_only[None, None], logp)
        flat = (scores[..., None] + logp).reshape(batch, -1)
        scores, index = jax.lax.top_k(flat, size)
        beams, token = index // config.vocab_size, (index % config.vocab_size).astype(jnp.int32)
        tokens = jnp.take_along_axis(tokens, beams[..., None], axis=1).at[:, :, step].set(token)
        done = jnp.take_along_axis(done, beams, axis=1) | (token == EOS)
        lengths = jnp.take_along_axis(lengths, beams, axis=1) + (token != PAD)
        cache = _gather_beams(cache, beams)
        return step + 1, cache, token.reshape(-1), tokens, scores, lengths, done

    # Only the first beam is live at the start, so that the beams do not all repeat it.
    scores = jnp.broadcast_to(jnp.where(jnp.arange(size) == 0, 0.0, -jnp.inf), (batch, size))
    init = (
        jnp.zeros((), jnp.int32),
        cache,
        jnp.full((batch * size,), BOS, jnp.int32),
        jnp.zeros((batch, size, config.max_len), jnp.int32),
        scores,
        jnp.zeros((batch, size), jnp.int32),
        jnp.zeros((batch, size), bool),
    )
    _, _, _, tokens, scores, lengths, _ = jax.lax.while_loop(_running(config.max_len), body, init)
    ranked = scores / ((5.0 + lengths) / 6.0) ** alpha
    best = jnp.argmax(ranked, axis=1)
    return jnp.take_along_axis(tokens, best[:, None, None], axis=1)[:, 0]
