"""Flax NNX modules over dropmask's functional core.

``dropmask.nnx.Dropout`` is a drop-in replacement for ``flax.nnx.Dropout``: the same
constructor and call arguments, the same key derivation (the stream is forked at
construction, as Flax does), and it follows ``model.train()`` / ``model.eval()`` and
``nnx.view(model, deterministic=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from . import _dropout
from ._errors import MissingKeyError
from ._random import DEFAULT_IMPL, Impl

__all__ = ["AlphaDropout", "DropPath", "Dropout", "GaussianDropout", "WordDropout"]

_NO_DETERMINISTIC = (
    "No `deterministic` argument was provided to {name}. Pass it to the constructor "
    "({name}(..., deterministic=True/False)), at call time (layer(x, deterministic=...)), "
    "or set it for a whole model with model.train() / model.eval() or "
    "nnx.view(model, deterministic=...)."
)


class _Stochastic(nnx.Module):
    """Shared constructor and key/mode resolution for the stochastic layers."""

    impl: Impl

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
    ):
        self.rate = rate
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        if isinstance(rngs, nnx.Rngs):
            self.rngs = rngs[rng_collection].fork()
        elif isinstance(rngs, nnx.RngStream):
            self.rngs = rngs.fork()
        elif rngs is None:
            self.rngs = nnx.data(None)
        else:
            raise TypeError(
                f"rngs must be an nnx.Rngs, nnx.RngStream or None, got {type(rngs).__name__}."
            )

    def _mode(self, deterministic: bool | None) -> bool:
        """Call-time ``deterministic`` takes precedence over the constructor's."""
        value = deterministic if deterministic is not None else self.deterministic
        if value is None:
            raise ValueError(_NO_DETERMINISTIC.format(name=type(self).__name__))
        return bool(value)

    def _key(self, deterministic: bool, rngs: Any) -> jax.Array | None:
        if not _dropout.needs_key(self.rate, deterministic):
            return None
        source = rngs if rngs is not None else self.rngs
        if source is None:
            raise MissingKeyError(
                f"{type(self).__name__} is in training mode (deterministic=False) but has no "
                f"PRNG source for stream {self.rng_collection!r}. Construct it with "
                f"rngs=nnx.Rngs({self.rng_collection}=0), or call it with rngs=... "
                f"(an nnx.Rngs, RngStream or key), or switch to evaluation with model.eval()."
            )
        if isinstance(source, nnx.Rngs):
            return source[self.rng_collection]()
        if isinstance(source, nnx.RngStream):
            return source()
        if isinstance(source, jax.Array):
            return source
        raise TypeError(
            f"rngs must be an nnx.Rngs, nnx.RngStream or jax.Array key, got "
            f"{type(source).__name__}."
        )

    def set_view(self, deterministic: bool | None = None) -> None:
        """Used by ``nnx.view``: sets ``deterministic`` when given."""
        if deterministic is not None:
            self.deterministic = deterministic


class Dropout(_Stochastic):
    """Drop-in replacement for ``flax.nnx.Dropout``.

    Args:
      rate: the dropout probability (not the keep rate).
      broadcast_dims: dimensions that share one mask value.
      deterministic: if True no mask is applied; a call-time value wins.
      rng_collection: the stream to draw keys from.
      rngs: an ``nnx.Rngs`` / ``RngStream`` (forked here), or None to pass at call time.
      impl: mask generator; ``"flax"`` gives outputs identical to Flax's.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> layer = dnnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
      >>> layer(jnp.ones((2, 3))).shape
      (2, 3)
    """

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        broadcast_dims: Sequence[int] = (),
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        impl: Impl = DEFAULT_IMPL,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.broadcast_dims = tuple(broadcast_dims)
        self.impl = impl

    def __call__(
        self, inputs: jax.Array, *, deterministic: bool | None = None, rngs: Any = None
    ) -> jax.Array:
        """Masks ``inputs: [...]`` and rescales by ``1/(1-rate)`` in training mode."""
        det = self._mode(deterministic)
        key = self._key(det, rngs)
        return _dropout.dropout(
            inputs,
            self.rate,
            key,
            broadcast_dims=self.broadcast_dims,
            deterministic=det,
            impl=self.impl,
        )


class WordDropout(_Stochastic):
    """Replaces token ids with ``unk_id`` at ``rate`` (see :func:`dropmask.word_dropout`)."""

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        unk_id: int,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        impl: Impl = DEFAULT_IMPL,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.unk_id = unk_id
        self.impl = impl

    def __call__(
        self, tokens: jax.Array, *, deterministic: bool | None = None, rngs: Any = None
    ) -> jax.Array:
        """Applies word dropout to ``tokens: int[..., time]``."""
        det = self._mode(deterministic)
        key = self._key(det, rngs)
        return _dropout.word_dropout(
            tokens, self.rate, key, unk_id=self.unk_id, deterministic=det, impl=self.impl
        )


class DropPath(_Stochastic):
    """Stochastic depth: drops a residual branch per example along ``batch_axis``."""

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        batch_axis: int = 0,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        impl: Impl = DEFAULT_IMPL,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.batch_axis = batch_axis
        self.impl = impl

    def __call__(
        self, inputs: jax.Array, *, deterministic: bool | None = None, rngs: Any = None
    ) -> jax.Array:
        """Applies drop-path to ``inputs: [batch, ...]``."""
        det = self._mode(deterministic)
        key = self._key(det, rngs)
        return _dropout.drop_path(
            inputs, self.rate, key, batch_axis=self.batch_axis, deterministic=det, impl=self.impl
        )


class GaussianDropout(_Stochastic):
    """Multiplicative ``N(1, rate/(1-rate))`` noise in training mode."""

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        broadcast_dims: Sequence[int] = (),
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.broadcast_dims = tuple(broadcast_dims)

    def __call__(
        self, inputs: jax.Array, *, deterministic: bool | None = None, rngs: Any = None
    ) -> jax.Array:
        """Applies Gaussian dropout to ``inputs: [...]``."""
        det = self._mode(deterministic)
        key = self._key(det, rngs)
        return _dropout.gaussian_dropout(
            inputs, self.rate, key, broadcast_dims=self.broadcast_dims, deterministic=det
        )


class AlphaDropout(_Stochastic):
    """Alpha dropout for self-normalising (SELU) networks."""

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        broadcast_dims: Sequence[int] = (),
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        impl: Impl = DEFAULT_IMPL,
    ):
        super().__init__(
            rate, deterministic=deterministic, rng_collection=rng_collection, rngs=rngs
        )
        self.broadcast_dims = tuple(broadcast_dims)
        self.impl = impl

    def __call__(
        self, inputs: jax.Array, *, deterministic: bool | None = None, rngs: Any = None
    ) -> jax.Array:
        """Applies alpha dropout to ``inputs: [...]``."""
        det = self._mode(deterministic)
        key = self._key(det, rngs)
        return _dropout.alpha_dropout(
            inputs,
            self.rate,
            key,
            broadcast_dims=self.broadcast_dims,
            deterministic=det,
            impl=self.impl,
        )
