"""Flax NNX modules over dropmask's functional core.

``dropmask.nnx.Dropout`` is a drop-in replacement for ``flax.nnx.Dropout``: the same
constructor and call arguments, the same key derivation (the stream is forked at
construction, as Flax does), and it follows ``model.train()`` / ``model.eval()`` and
``nnx.view(model, deterministic=...)``.

Inside ``shard_map`` each device holds a block of the global array. Give
:class:`Dropout` (or :class:`DropPath`, :class:`AlphaDropout`, :class:`WordDropout`)
the input's ``PartitionSpec`` as ``shard_spec`` (or pass ``global_shape=`` and
``offset=`` at call time) and each device draws its own block of one global mask, the
mask the unsharded layer draws for the same key::

    spec = PartitionSpec("data")
    layer = dnnx.Dropout(0.1, shard_spec=spec)
    step = jax.shard_map(
        lambda x, key: layer(x, rngs=key),
        mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec,
    )

Pass the same (replicated) key to every device: the device's position, not its key,
makes its block differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from .. import _layer_specs
from .._checks import as_dims
from .._random import DEFAULT_IMPL, DEFAULT_RESIDUAL, Impl, Residual
from ._base import DropoutLike as _DropoutLike
from ._base import Sharded as _Sharded
from ._base import Stochastic as _Stochastic
from ._recurrent import Bidirectional as Bidirectional
from ._recurrent import MaskedRNN as MaskedRNN
from ._structured_layers import DropBlock as DropBlock
from ._structured_layers import DropHead as DropHead
from ._structured_layers import LayerDrop as LayerDrop
from ._swap import Replaced as Replaced
from ._swap import swap_dropout as swap_dropout

__all__ = [
    "AlphaDropout",
    "Bidirectional",
    "DropBlock",
    "DropHead",
    "DropPath",
    "Dropout",
    "GaussianDropout",
    "LayerDrop",
    "MaskedRNN",
    "Replaced",
    "WordDropout",
    "swap_dropout",
]


class Dropout(_DropoutLike):
    """Drop-in replacement for ``flax.nnx.Dropout``.

    In training mode it masks ``inputs: [...]`` and rescales what it keeps by
    ``1/(1-rate)``.

    Args:
      rate: the dropout probability (not the keep rate).
      broadcast_dims: dimensions that share one mask value.
      deterministic: if True no mask is applied; a call-time value wins.
      rng_collection: the stream to draw keys from.
      rngs: an ``nnx.Rngs`` / ``RngStream`` (forked here), or None to pass at call time.
      impl: mask generator; ``"flax"`` gives outputs identical to Flax's.
      shard_spec: inside ``shard_map``, the input's ``PartitionSpec`` (one entry per
        leading axis: None, a mesh axis name, or a tuple of names). Each device then
        draws its block of the global mask, the mask the unsharded layer draws: global
        size = local size times the mesh axes' size, offset = ``lax.axis_index`` times
        the local size. None (default) treats the input as the whole array.
      residual: what the backward pass keeps, as in :func:`dropmask.dropout`:
        ``"mask"`` (default) or ``"none"`` (``docs/dropout_speed.md``).

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> layer = dnnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
      >>> layer(jnp.ones((2, 3))).shape
      (2, 3)
    """

    _spec = _layer_specs.DROPOUT


class WordDropout(_Stochastic):
    """Replaces token ids with ``unk_id`` at ``rate`` (see :func:`dropmask.word_dropout`).

    ``shard_spec`` (or call-time ``global_shape=`` / ``offset=``): inside
    ``shard_map``, as in :class:`Dropout`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> layer, tokens = dnnx.WordDropout(0.5, unk_id=1, rngs=nnx.Rngs(0)), jnp.arange(2, 8)
      >>> t = layer(tokens)
      >>> bool(((t == 1) | (t == tokens)).all())  # each token kept or replaced by unk_id
      True
    """

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        unk_id: int,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        impl: Impl = DEFAULT_IMPL,
        shard_spec: Any = None,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.unk_id = unk_id
        self.impl = impl
        self.shard_spec = shard_spec

    def __call__(
        self,
        tokens: jax.Array,
        *,
        deterministic: bool | None = None,
        rngs: Any = None,
        global_shape: Sequence[int] | None = None,
        offset: Sequence[Any] | None = None,
    ) -> jax.Array:
        """Applies word dropout to ``tokens: int[..., time]``."""
        return _layer_specs.apply(
            _layer_specs.WORD_DROPOUT, self, tokens, deterministic, rngs, global_shape, offset
        )


class DropPath(_Sharded):
    """Stochastic depth: drops a residual branch of ``inputs: [batch, ...]`` per example
    along ``batch_axis``.

    ``residual``: what the backward pass keeps, as in :class:`Dropout`.
    ``shard_spec`` (or call-time ``global_shape=`` / ``offset=``): inside
    ``shard_map``, as in :class:`Dropout`; devices that split a non-batch axis make
    the same decision for an example.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> y = dnnx.DropPath(0.5, rngs=nnx.Rngs(0))(jnp.ones((4, 3)))
      >>> bool((y == y[:, :1]).all())  # one decision per example
      True
    """

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        batch_axis: int = 0,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        impl: Impl = DEFAULT_IMPL,
        shard_spec: Any = None,
        residual: Residual = DEFAULT_RESIDUAL,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.batch_axis = batch_axis
        self.impl = impl
        self.shard_spec = shard_spec
        self.residual = residual

    _spec = _layer_specs.DROP_PATH


class GaussianDropout(_Stochastic):
    """Multiplicative ``N(1, rate/(1-rate))`` noise in training mode.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> y = dnnx.GaussianDropout(0.5, rngs=nnx.Rngs(0))(jnp.ones(10_000))
      >>> bool(abs(y.mean() - 1) < 0.05 and abs(y.var() - 1) < 0.1)  # N(1, 0.5 / 0.5)
      True
    """

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        broadcast_dims: int | Sequence[int] = (),
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.broadcast_dims = as_dims(broadcast_dims, caller=self._caller)

    def __call__(
        self, inputs: jax.Array, *, deterministic: bool | None = None, rngs: Any = None
    ) -> jax.Array:
        """Applies Gaussian dropout to ``inputs: [...]``."""
        return _layer_specs.apply(_layer_specs.GAUSSIAN_DROPOUT, self, inputs, deterministic, rngs)


class AlphaDropout(_DropoutLike):
    """Alpha dropout for self-normalising (SELU) networks.

    ``residual``: what the backward pass keeps, as in :class:`Dropout`.
    ``shard_spec`` (or call-time ``global_shape=`` / ``offset=``): inside
    ``shard_map``, as in :class:`Dropout`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> x = jax.random.normal(jax.random.key(0), (10_000,))  # standardised
      >>> y = dnnx.AlphaDropout(0.2, rngs=nnx.Rngs(1))(x)
      >>> bool(abs(y.mean()) < 0.05 and abs(y.std() - 1) < 0.05)  # still standardised
      True
    """

    _spec = _layer_specs.ALPHA_DROPOUT
