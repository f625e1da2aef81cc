"""Flax Linen modules over dropmask's functional core.

``dropmask.linen.Dropout`` is a drop-in replacement for ``flax.linen.Dropout``: same
fields, same call signature, same ``merge_param`` rules, same PRNG stream.
Each module only resolves ``deterministic``, fetches a key, and calls the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax

from . import _dropout
from ._errors import check_key
from ._random import DEFAULT_IMPL, Impl

__all__ = ["AlphaDropout", "DropPath", "Dropout", "GaussianDropout", "WordDropout"]


def _resolve(module: Any, deterministic: bool | None) -> bool:
    """Merges constructor and call ``deterministic`` exactly as Flax does."""
    return bool(nn.merge_param("deterministic", module.deterministic, deterministic))


def _key(module: nn.Module, collection: str, rng: Any) -> jax.Array:
    """The key for this call: ``rng`` if given, else the next key of ``collection``.

    Like Flax's ``make_rng``, a missing stream falls back to ``'params'`` (so that
    ``init`` in training mode works); only when neither exists do we raise.
    """
    if rng is not None:
        return rng
    if not (module.has_rng(collection) or module.has_rng("params")):
        check_key(
            None, fn=f"{type(module).__name__} {module.name or ''}".strip(), stream=collection
        )
    return module.make_rng(collection)


class Dropout(nn.Module):
    """Drop-in replacement for ``flax.linen.Dropout``.

    Attributes:
      rate: the dropout probability (not the keep rate), a float or JAX scalar.
      broadcast_dims: dimensions that share one mask value.
      deterministic: if True, inputs are returned as is; may instead be passed at
        call time (exactly one of the two).
      rng_collection: the PRNG stream the mask key is drawn from.
      impl: mask generator; ``"flax"`` gives outputs identical to Flax's.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer = dl.Dropout(0.5, deterministic=False)
      >>> y = layer.apply({}, jnp.ones((2, 3)), rngs={"dropout": jax.random.key(0)})
      >>> y.shape
      (2, 3)
    """

    rate: float | jax.Array
    broadcast_dims: Sequence[int] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL

    @nn.compact
    def __call__(
        self, inputs: jax.Array, deterministic: bool | None = None, rng: Any = None
    ) -> jax.Array:
        """Masks ``inputs: [...]`` and rescales by ``1/(1-rate)`` in training mode."""
        det = _resolve(self, deterministic)
        key = _key(self, self.rng_collection, rng) if _dropout.needs_key(self.rate, det) else None
        return _dropout.dropout(
            inputs,
            self.rate,
            key,
            broadcast_dims=self.broadcast_dims,
            deterministic=det,
            impl=self.impl,
        )


class WordDropout(nn.Module):
    """Replaces token ids with ``unk_id`` at ``rate`` (the SST-2 example's layer).

    The SST-2 example names these fields ``dropout_rate`` and ``unk_idx``; here they are
    ``rate`` and ``unk_id``, as in the rest of dropmask.

    Attributes:
      rate: probability of replacing a token.
      unk_id: the id of the unknown-word token.
      deterministic: as in :class:`Dropout`.
      rng_collection: PRNG stream name.
      impl: ``"flax"`` matches the SST-2 example's ``WordDropout`` bit for bit.
    """

    rate: float | jax.Array
    unk_id: int
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL

    @nn.compact
    def __call__(
        self, tokens: jax.Array, deterministic: bool | None = None, rng: Any = None
    ) -> jax.Array:
        """Applies word dropout to ``tokens: int[..., time]``."""
        det = _resolve(self, deterministic)
        key = _key(self, self.rng_collection, rng) if _dropout.needs_key(self.rate, det) else None
        return _dropout.word_dropout(
            tokens, self.rate, key, unk_id=self.unk_id, deterministic=det, impl=self.impl
        )


class DropPath(nn.Module):
    """Stochastic depth: drops a residual branch per example (``batch_axis``)."""

    rate: float | jax.Array
    batch_axis: int = 0
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL

    @nn.compact
    def __call__(
        self, inputs: jax.Array, deterministic: bool | None = None, rng: Any = None
    ) -> jax.Array:
        """Applies drop-path to ``inputs: [batch, ...]``."""
        det = _resolve(self, deterministic)
        key = _key(self, self.rng_collection, rng) if _dropout.needs_key(self.rate, det) else None
        return _dropout.drop_path(
            inputs, self.rate, key, batch_axis=self.batch_axis, deterministic=det, impl=self.impl
        )


class GaussianDropout(nn.Module):
    """Multiplicative ``N(1, rate/(1-rate))`` noise in training mode."""

    rate: float | jax.Array
    broadcast_dims: Sequence[int] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(
        self, inputs: jax.Array, deterministic: bool | None = None, rng: Any = None
    ) -> jax.Array:
        """Applies Gaussian dropout to ``inputs: [...]``."""
        det = _resolve(self, deterministic)
        key = _key(self, self.rng_collection, rng) if _dropout.needs_key(self.rate, det) else None
        return _dropout.gaussian_dropout(
            inputs, self.rate, key, broadcast_dims=self.broadcast_dims, deterministic=det
        )


class AlphaDropout(nn.Module):
    """Alpha dropout for self-normalising (SELU) networks."""

    rate: float | jax.Array
    broadcast_dims: Sequence[int] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    impl: Impl = DEFAULT_IMPL

    @nn.compact
    def __call__(
        self, inputs: jax.Array, deterministic: bool | None = None, rng: Any = None
    ) -> jax.Array:
        """Applies alpha dropout to ``inputs: [...]``."""
        det = _resolve(self, deterministic)
        key = _key(self, self.rng_collection, rng) if _dropout.needs_key(self.rate, det) else None
        return _dropout.alpha_dropout(
            inputs,
            self.rate,
            key,
            broadcast_dims=self.broadcast_dims,
            deterministic=det,
            impl=self.impl,
        )
