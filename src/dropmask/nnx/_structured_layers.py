"""NNX layers of the structured variants: DropBlock, DropHead, LayerDrop.

Each resolves ``deterministic`` and fetches a key through ``_base.Stochastic`` and
calls the functional core in ``_structured``; ``dropmask.nnx`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from .. import _layer_specs
from .._random import DEFAULT_RESIDUAL, Residual
from .._structured import layer_drop_module
from ._base import Sharded, Stochastic

__all__ = ["DropBlock", "DropHead", "LayerDrop"]


class DropBlock(Sharded):
    """DropBlock on ``[batch, *spatial, channels]`` maps (see :func:`dropmask.drop_block`).

    Args:
      rate: the expected fraction of units dropped.
      block_size: the block's width, an int or one per spatial axis.
      per_channel: each channel draws its own blocks (default: shared).
      deterministic: if True no block is dropped; a call-time value wins.
      rng_collection: the stream to draw keys from.
      rngs: an ``nnx.Rngs`` / ``RngStream`` (forked here), or None to pass at call time.
      shard_spec: inside ``shard_map``, the input's ``PartitionSpec`` (batch and
        channel axes only), as in :class:`Dropout`.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> layer = dnnx.DropBlock(0.1, block_size=3, rngs=nnx.Rngs(dropout=0))
      >>> layer(jnp.ones((2, 8, 8, 4))).shape
      (2, 8, 8, 4)
    """

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        block_size: int | Sequence[int] = 7,
        per_channel: bool = False,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        shard_spec: Any = None,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.block_size = block_size
        self.per_channel = per_channel
        self.shard_spec = shard_spec

    _spec = _layer_specs.DROP_BLOCK


class DropHead(Sharded):
    """Drops whole heads of ``[batch..., q_len, heads, depth]`` per example
    (see :func:`dropmask.drop_head`); put it between attention and the output projection.

    ``shard_spec`` and ``residual`` as in :class:`Dropout`.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> y = dnnx.DropHead(0.5, rngs=nnx.Rngs(0))(jnp.ones((2, 5, 4, 8)))
      >>> bool((y == y[:, :1, :, :1]).all())  # one decision per example and head
      True
    """

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        shard_spec: Any = None,
        residual: Residual = DEFAULT_RESIDUAL,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.shard_spec = shard_spec
        self.residual = residual

    _spec = _layer_specs.DROP_HEAD


class LayerDrop(Stochastic):
    """Runs ``layer``, or skips it (returns its first input) with probability ``rate``.

    One decision per call for the whole batch (see :func:`dropmask.layer_drop`); a
    skipped layer is not computed (``nnx.cond``). Layers built under ``nnx.vmap`` and
    run by ``nnx.scan`` each fork their own stream, so each draws its own decision.
    Every call argument goes to ``layer``; the wrapper's mode is its
    ``deterministic`` attribute (``model.train()`` / ``model.eval()`` set it).

    Args:
      layer: the residual block, mapping its first input to an output of the same
        structure, shape and dtype.
      rate: probability of skipping it.
      deterministic: if True, always run it.
      rng_collection: the stream to draw keys from.
      rngs: an ``nnx.Rngs`` / ``RngStream`` (forked here).
      pruned: if True, always skip it, in every mode (pruning at inference; pick the
        layers with :func:`dropmask.kept_layers`).

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> rngs = nnx.Rngs(params=0, dropout=1)
      >>> layer = dnnx.LayerDrop(nnx.Linear(4, 4, rngs=rngs), 0.5, rngs=rngs)
      >>> layer(jnp.ones((2, 4))).shape
      (2, 4)
    """

    def __init__(
        self,
        layer: Any,
        rate: float | jax.Array,
        *,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        pruned: bool = False,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.layer = layer
        self.pruned = pruned

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """``layer(inputs, *args, **kwargs)``, or ``inputs``."""
        if self.pruned:
            return inputs
        det, key = self._prepare(None, None)
        return layer_drop_module(
            self.layer,
            inputs,
            args,
            kwargs,
            self.rate,
            key,
            det,
            nnx.cond,
            caller=self._caller,
            eval_shape=nnx.eval_shape,
        )
