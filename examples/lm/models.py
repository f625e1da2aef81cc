"""A decoder-only Transformer in Flax NNX with dropout on embeddings, residuals and attention.

Pre-norm blocks as in GPT-2 and Flax's NNX miniGPT tutorial: causal self-attention
and an MLP, each branch dropped out before it is added back. Attention is Flax's
``nnx.MultiHeadAttention`` with its ``attention_fn`` swapped for
``dropmask.dot_product_attention`` (``is_causal``: no ``[q, k]`` mask is built, and
the blockwise path skips the tiles above the diagonal), which drops attention weights
with the module's own ``'dropout'`` stream. ``attention='flax'`` keeps Flax's own
``nnx.dot_product_attention``: the same parameters and function, for the memory
comparison in the README.

Random layerwise token dropping (Random-LTD, Yao et al., 2022), ``config.token_drop``:
in training, each block but the ``token_drop_ends`` at either end of the stack works
on a random subset of each window's tokens, drawn afresh per block and step by
``dropmask.drop_tokens``; the other tokens pass that block unchanged. The kept tokens
stay in their original order, so causal attention on the subset (``is_causal`` on the
shorter sequence) is exactly "position ``i`` sees the kept positions ``<= i``", and the
blockwise path still skips the tiles above the diagonal. Evaluation and sampling see
every token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

import dropmask
from dropmask import nnx as dnnx


def attention_fn(config: ml_collections.ConfigDict) -> Callable[..., jax.Array]:
    """The attention function ``config.attention`` names."""
    if config.attention == "flax":
        return nnx.dot_product_attention
    if config.attention != "dropmask":
        raise ValueError(
            f"lm: config.attention must be 'dropmask' or 'flax', got {config.attention!r}."
        )
    block = config.attention_block or None
    return functools.partial(
        dropmask.dot_product_attention,
        algorithm=config.attention_algorithm,
        block_q=block,
        block_k=block,
    )


class Block(nnx.Module):
    """``x + drop(attention(norm(x)))``, then ``x + drop(mlp(norm(x)))``."""

    def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        width = config.width
        self.attention_norm = nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            config.heads,
            width,
            dropout_rate=config.rate,
            broadcast_dropout=False,
            deterministic=False,
            attention_fn=attention_fn(config),
            decode=False,
            rngs=rngs,
        )
        self.attention_dropout = dnnx.Dropout(config.rate, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(width, rngs=rngs)
        self.mlp_in = nnx.Linear(width, config.mlp_ratio * width, rngs=rngs)
        self.mlp_out = nnx.Linear(config.mlp_ratio * width, width, rngs=rngs)
        self.mlp_dropout = dnnx.Dropout(config.rate, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x: float32[batch, time, width]`` to the same shape."""
        y = self.attention(self.attention_norm(x), is_causal=True)
        x = x + self.attention_dropout(y)
        y = self.mlp_out(nnx.gelu(self.mlp_in(self.mlp_norm(x))))
        return x + self.mlp_dropout(y)


class RandomLTD(nnx.Module):
    """A block that sees a random ``1 - rate`` of each window's tokens in training.

    The kept tokens (``dropmask.drop_tokens``, in their original order) go through the
    block, and its outputs are written back to their positions; a dropped token leaves
    the block as it came in, as if the block were the identity for it. In evaluation
    (``deterministic=True``, set by ``model.eval()``) the block sees every token.

    Args:
      block: the wrapped ``Block``.
      rate: the fraction of tokens dropped, a Python float in ``(0, 1)``.
      rngs: ``nnx.Rngs`` with a ``'dropout'`` stream; the wrapper forks its own, so
        every wrapped block draws its own subset.
    """

    def __init__(self, block: Block, rate: float, *, rngs: nnx.Rngs):
        self.block = block
        self.rate = rate
        self.deterministic = False
        self.rngs = rngs.dropout.fork()

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x: float32[batch, time, width]`` to the same shape."""
        if self.deterministic:
            return self.block(x)
        # A training window has no padding: every one of the ``kept`` slots is a token.
        kept = dropmask.drop_tokens(x, self.rate, self.rngs())
        rows = jnp.arange(x.shape[0])[:, None]
        return x.at[rows, kept.positions].set(self.block(kept.tokens))


def token_drop_blocks(config: ml_collections.ConfigDict) -> range:
    """The blocks that drop tokens in training: none at ``token_drop = 0``, else all but
    ``token_drop_ends`` blocks at each end of the stack."""
    if not config.token_drop:
        return range(0)
    return range(config.token_drop_ends, config.depth - config.token_drop_ends)


class LanguageModel(nnx.Module):
    """Byte embeddings plus learned positions, ``depth`` blocks, a tied output layer.

    Args:
      config: the example's config (``width``, ``heads``, ``depth``, ``mlp_ratio``,
        ``context``, ``rate``, ``attention``, ``attention_algorithm``,
        ``attention_block``, ``token_drop``, ``token_drop_ends``).
      vocab_size: the number of token ids.
      rngs: ``nnx.Rngs`` with ``'params'`` and ``'dropout'`` streams; every dropout
        site (the embedding's, each block's residual branches and attention weights)
        forks its own ``'dropout'`` stream.
    """

    def __init__(self, config: ml_collections.ConfigDict, vocab_size: int, *, rngs: nnx.Rngs):
        self.context = config.context
        self.embed = nnx.Embed(vocab_size, config.width, rngs=rngs)
        self.positions = nnx.Embed(config.context, config.width, rngs=rngs)
        self.embed_dropout = dnnx.Dropout(config.rate, rngs=rngs)
        blocks: list[nnx.Module] = [Block(config, rngs=rngs) for _ in range(config.depth)]
        for i in token_drop_blocks(config):
            blocks[i] = RandomLTD(blocks[i], config.token_drop, rngs=rngs)
        self.blocks = nnx.List(blocks)
        self.norm = nnx.LayerNorm(config.width, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Next-token logits ``float32[batch, time, vocab]`` of ``tokens: int32[batch, time]``
        (``time <= context``); position ``t`` sees tokens ``0..t``."""
        x = self.embed(tokens) + self.positions(jnp.arange(tokens.shape[-1]))[None]
        x = self.embed_dropout(x)
        for block in self.blocks:
            x = block(x)
        return self.embed.attend(self.norm(x))


def count_params(model: Any) -> int:
    """The number of parameters of an NNX model."""
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
