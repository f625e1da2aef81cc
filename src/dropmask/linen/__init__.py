"""Flax Linen modules over dropmask's functional core.

``dropmask.linen.Dropout`` is a drop-in replacement for ``flax.linen.Dropout``: same
fields, same call signature, same ``merge_param`` rules, same PRNG stream.
Each module only resolves ``deterministic``, fetches a key, and calls the core.

Inside ``shard_map`` each device holds a block of the global array. Give
:class:`Dropout` (or :class:`DropPath`, :class:`AlphaDropout`, :class:`WordDropout`)
the input's ``PartitionSpec`` as ``shard_spec`` (or pass ``global_shape=`` and
``offset=`` at call time) and each device draws its own block of one global mask, the
mask the unsharded layer draws for the same key::

    spec = PartitionSpec("data")
    layer = dl.Dropout(0.1, deterministic=False, shard_spec=spec)
    step = jax.shard_map(
        lambda x, k: layer.apply({}, x, rngs={"dropout": k}),
        mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec,
    )

Pass the same (replicated) key to every device: the device's position, not its key,
makes its block differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax

from .. import _layer_specs
from .._random import DEFAULT_IMPL, DEFAULT_RESIDUAL, Impl, Residual
from ._base import MissingStreamError as MissingStreamError
from ._base import Sharded as _Sharded
from ._base import Stochastic as _Stochastic
from ._recurrent import Bidirectional as Bidirectional
from ._recurrent import MaskedRNN as MaskedRNN
from ._structured_layers import DropBlock as DropBlock
from ._structured_layers import DropHead as DropHead
from ._structured_layers import LayerDrop as LayerDrop
from ._swap import swap_dropout as swap_dropout
from ._swap import swapped as swapped

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
    "MissingStreamError",
    "WordDropout",
    "swap_dropout",
    "swapped",
]


class Dropout(_Sharded):
    """Drop-in replacement for ``flax.linen.Dropout``.

    In training mode it masks ``inputs: [...]`` and rescales what it keeps by
    ``1/(1-rate)``.

    Attributes:
      rate: the dropout probability (not the keep rate), a float or JAX scalar.
      broadcast_dims: dimensions that share one mask value (an int or ints).
      deterministic: if True, inputs are returned as is; may instead be passed at
        call time (exactly one of the two).
      rng_collection: the PRNG stream the mask key is drawn from.
      impl: mask generator; ``"flax"`` gives outputs identical to Flax's.
      shard_spec: inside ``shard_map``, the input's ``PartitionSpec`` (one entry per
        leading axis: None, a mesh axis name, or a tuple of names). Each device then
        draws its block of the global mask: global size = local size times the mesh
        axes' size, offset = ``lax.axis_index`` times the local size. None (default)
        treats the input as the whole array.
      residual: what the backward pass keeps, as in :func:`dropmask.dropout`:
        ``"mask"`` (default) or ``"none"`` (``docs/dropout_speed.md``).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer = dl.Dropout(0.5, deterministic=False)
      >>> y = layer.apply({}, jnp.ones((2, 3)), rngs={"dropout": jax.random.key(0)})
      >>> y.shape
      (2, 3)
    """

    rate: float | jax.Array
    broadcast_dims: int | Sequence[int] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL
    shard_spec: Any = None
    residual: Residual = DEFAULT_RESIDUAL

    _spec = _layer_specs.DROPOUT


class WordDropout(_Stochastic):
    """Replaces token ids with ``unk_id`` at ``rate`` (the SST-2 example's layer).

    The SST-2 example names these fields ``dropout_rate`` and ``unk_idx``; here they are
    ``rate`` and ``unk_id``, as in the rest of dropmask.

    Attributes:
      rate: probability of replacing a token.
      unk_id: the id of the unknown-word token.
      deterministic: as in :class:`Dropout`.
      rng_collection: PRNG stream name.
      impl: ``"flax"`` matches the SST-2 example's ``WordDropout`` bit for bit.
      shard_spec: inside ``shard_map``, the ``PartitionSpec`` of ``tokens`` (or pass
        call-time ``global_shape=`` / ``offset=``), as in :class:`Dropout`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer, tokens = dl.WordDropout(0.5, unk_id=1, deterministic=False), jnp.arange(2, 8)
      >>> t = layer.apply({}, tokens, rngs={"dropout": jax.random.key(0)})
      >>> bool(((t == 1) | (t == tokens)).all())  # each token kept or replaced by unk_id
      True
    """

    rate: float | jax.Array
    unk_id: int
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL
    shard_spec: Any = None

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        deterministic: bool | None = None,
        rng: Any = None,
        *,
        global_shape: Sequence[int] | None = None,
        offset: Sequence[Any] | None = None,
    ) -> jax.Array:
        """Applies word dropout to ``tokens: int[..., time]``."""
        return _layer_specs.apply(
            _layer_specs.WORD_DROPOUT, self, tokens, deterministic, rng, global_shape, offset
        )


class DropPath(_Sharded):
    """Stochastic depth: drops a residual branch of ``inputs: [batch, ...]`` per example
    (``batch_axis``).

    ``residual``: what the backward pass keeps, as in :class:`Dropout`.
    ``shard_spec`` (or call-time ``global_shape=`` / ``offset=``): inside
    ``shard_map``, as in :class:`Dropout`; devices that split a non-batch axis make
    the same decision for an example.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer = dl.DropPath(0.5, deterministic=False)
      >>> y = layer.apply({}, jnp.ones((4, 3)), rngs={"dropout": jax.random.key(0)})
      >>> bool((y == y[:, :1]).all())  # one decision per example
      True
    """

    rate: float | jax.Array
    batch_axis: int = 0
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL
    residual: Residual = DEFAULT_RESIDUAL
    shard_spec: Any = None

    _spec = _layer_specs.DROP_PATH


class GaussianDropout(_Stochastic):
    """Multiplicative ``N(1, rate/(1-rate))`` noise in training mode.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer = dl.GaussianDropout(0.5, deterministic=False)
      >>> y = layer.apply({}, jnp.ones(10_000), rngs={"dropout": jax.random.key(0)})
      >>> bool(abs(y.mean() - 1) < 0.05 and abs(y.var() - 1) < 0.1)  # N(1, 0.5 / 0.5)
      True
    """

    rate: float | jax.Array
    broadcast_dims: int | Sequence[int] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(
        self, inputs: jax.Array, deterministic: bool | None = None, rng: Any = None
    ) -> jax.Array:
        """Applies Gaussian dropout to ``inputs: [...]``."""
        return _layer_specs.apply(_layer_specs.GAUSSIAN_DROPOUT, self, inputs, deterministic, rng)


class AlphaDropout(_Sharded):
    """Alpha dropout for self-normalising (SELU) networks.

    ``residual``: what the backward pass keeps, as in :class:`Dropout`.
    ``shard_spec`` (or call-time ``global_shape=`` / ``offset=``): inside
    ``shard_map``, as in :class:`Dropout`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> x = jax.random.normal(jax.random.key(0), (10_000,))  # standardised
      >>> layer = dl.AlphaDropout(0.2, deterministic=False)
      >>> y = layer.apply({}, x, rngs={"dropout": jax.random.key(1)})
      >>> bool(abs(y.mean()) < 0.05 and abs(y.std() - 1) < 0.05)  # still standardised
      True
    """

    rate: float | jax.Array
    broadcast_dims: int | Sequence[int] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL
    residual: Residual = DEFAULT_RESIDUAL
    shard_spec: Any = None

    _spec = _layer_specs.ALPHA_DROPOUT
