"""Linen layers of the structured variants: DropBlock, DropHead, LayerDrop.

Each resolves ``deterministic`` and fetches a key through ``_base.Stochastic`` and
calls the functional core in ``_structured``; ``dropmask.linen`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax

from .. import _layer_specs
from .._checks import concrete_value
from .._random import DEFAULT_RESIDUAL, Residual
from .._structured import check_returns_inputs, layer_drop_module
from ._base import Sharded, Stochastic

__all__ = ["DropBlock", "DropHead", "LayerDrop"]


class DropBlock(Sharded):
    """DropBlock on ``[batch, *spatial, channels]`` maps (see :func:`dropmask.drop_block`).

    Attributes:
      rate: the expected fraction of units dropped.
      block_size: the block's width, an int or one per spatial axis.
      per_channel: each channel draws its own blocks (default: shared).
      deterministic: as in :class:`Dropout`.
      rng_collection: the PRNG stream.
      shard_spec: inside ``shard_map``, the input's ``PartitionSpec`` (batch and
        channel axes only), as in :class:`Dropout`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer = dl.DropBlock(0.1, block_size=3, deterministic=False)
      >>> layer.apply({}, jnp.ones((2, 8, 8, 4)), rngs={"dropout": jax.random.key(0)}).shape
      (2, 8, 8, 4)
    """

    rate: float | jax.Array
    block_size: int | Sequence[int] = 7
    per_channel: bool = False
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    shard_spec: Any = None

    _spec = _layer_specs.DROP_BLOCK


class DropHead(Sharded):
    """Drops whole heads of ``[batch..., q_len, heads, depth]`` per example
    (see :func:`dropmask.drop_head`); put it between attention and the output projection.

    Attributes:
      rate: probability of dropping a head of an example.
      deterministic: as in :class:`Dropout`.
      rng_collection: the PRNG stream.
      shard_spec: inside ``shard_map``, the input's ``PartitionSpec``.
      residual: what the backward pass keeps, as in :class:`Dropout`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer = dl.DropHead(0.5, deterministic=False)
      >>> y = layer.apply({}, jnp.ones((2, 5, 4, 8)), rngs={"dropout": jax.random.key(0)})
      >>> bool((y == y[:, :1, :, :1]).all())  # one decision per example and head
      True
    """

    rate: float | jax.Array
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    shard_spec: Any = None
    residual: Residual = DEFAULT_RESIDUAL

    _spec = _layer_specs.DROP_HEAD


class LayerDrop(Stochastic):
    """Runs ``layer``, or skips it (returns its first input) with probability ``rate``.

    One decision per call for the whole batch (see :func:`dropmask.layer_drop`); a
    skipped layer is not computed (``nn.cond``). Inside ``nn.scan`` with
    ``split_rngs={"dropout": True}`` each layer draws its own decision. Every call
    argument goes to ``layer``; the wrapper's mode is its ``deterministic`` field.

    Attributes:
      layer: the residual block, mapping its first input to an output of the same
        structure, shape and dtype.
      rate: probability of skipping it.
      deterministic: if True, always run it (evaluation).
      rng_collection: the PRNG stream.
      pruned: if True, always skip it, in every mode: pruning at inference (pick the
        layers with :func:`dropmask.kept_layers`).

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from dropmask import linen as dl
      >>> class Block(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x):
      ...         return x + nn.Dense(x.shape[-1])(x)
      >>> layer = dl.LayerDrop(Block(), rate=0.5, deterministic=False)
      >>> x = jnp.ones((2, 4))
      >>> variables = layer.init(jax.random.key(0), x)
      >>> layer.apply(variables, x, rngs={"dropout": jax.random.key(1)}).shape
      (2, 4)
    """

    layer: nn.Module
    rate: float | jax.Array = 0.0
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    pruned: bool = False

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """``layer(inputs, *args, **kwargs)``, or ``inputs``."""
        if self.is_initializing():
            # The layer's parameters exist whatever this call would decide: nn.cond
            # cannot create them in one branch only, and a layer skipped at init (rate
            # 1, pruned) would have none to evaluate or restore with later.
            out = self.layer(inputs, *args, **kwargs)
            check_returns_inputs(inputs, out, caller=self._caller)
            skip = self.pruned or (
                not self._prepare(None, None)[0] and concrete_value(self.rate) == 1.0
            )
            return inputs if skip else out
        if self.pruned:
            return inputs
        det, key = self._prepare(None, None)
        return layer_drop_module(
            self.layer, inputs, args, kwargs, self.rate, key, det, nn.cond, caller=self._caller
        )
