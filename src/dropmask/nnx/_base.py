"""What every NNX stochastic layer shares: constructor, mode resolution, key fetching.

Its own module, so that the layers of ``__init__.py`` and ``_structured_layers.py`` share
one base without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import jax
from flax import nnx

from .. import _dropout, _layer_specs
from .._checks import as_dims, check_instance, check_rate
from .._errors import DropmaskValueError, MissingKeyError, user_error
from .._random import DEFAULT_IMPL, DEFAULT_RESIDUAL, Impl, Residual
from ._streams import own_stream

__all__ = ["DropoutLike", "Sharded", "Stochastic"]

_NO_DETERMINISTIC = (
    "No `deterministic` argument was provided to {name}. Pass it to the constructor "
    "({name}(..., deterministic=True/False)), at call time (layer(x, deterministic=...)), "
    "or set it for a whole model with model.train() / model.eval() or "
    "nnx.view(model, deterministic=...)"
)
# Flax's own wording comes first, so that code matching on Flax's message still matches.
_NO_RNGS = (
    "`deterministic` is False, but no `rngs` argument was provided to {name}: it is in "
    "training mode and has no PRNG source for stream {stream!r}. Construct it with "
    "rngs=nnx.Rngs({stream}=0), or call it with rngs=... (an nnx.Rngs, RngStream or key), "
    "or switch to evaluation with model.eval()"
)


class Stochastic(nnx.Module):
    """What every stochastic layer shares: constructor, mode resolution, key fetching.

    A layer adds only its own arguments (``broadcast_dims``, ``impl``, ...).
    """

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        deterministic: bool | None = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
    ):
        check_rate(rate, caller=self._caller)
        self.rate = rate
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        self.rngs = own_stream(rngs, rng_collection, caller=self._caller)

    @property
    def _caller(self) -> str:
        return f"dropmask.nnx.{type(self).__name__}"

    def _prepare(self, deterministic: bool | None, rngs: Any) -> tuple[bool, jax.Array | None]:
        """``(deterministic, key)`` for this call; a call-time value wins over the
        constructor's, and the key is None when no randomness is drawn."""
        value = deterministic if deterministic is not None else self.deterministic
        if value is None:
            raise user_error(
                DropmaskValueError,
                _NO_DETERMINISTIC.format(name=type(self).__name__),
                caller=None,
            )
        det = bool(value)
        if not _dropout.needs_key(self.rate, det, caller=self._caller):
            return det, None
        source = rngs if rngs is not None else self.rngs
        if source is None:
            raise user_error(
                MissingKeyError,
                _NO_RNGS.format(name=type(self).__name__, stream=self.rng_collection),
                caller=None,
            )
        check_instance(
            source,
            (nnx.Rngs, nnx.RngStream, jax.Array),
            caller=self._caller,
            name="rngs",
            what="an nnx.Rngs, nnx.RngStream or jax.Array key",
            fix=f"Pass e.g. rngs=nnx.Rngs({self.rng_collection}=0).",
        )
        if isinstance(source, nnx.Rngs):
            return det, source[self.rng_collection]()
        if isinstance(source, nnx.RngStream):
            return det, source()
        return det, source

    def set_view(self, deterministic: bool | None = None) -> None:
        """Used by ``nnx.view``: sets ``deterministic`` when given."""
        if deterministic is not None:
            self.deterministic = deterministic


class Sharded(Stochastic):
    """A stochastic layer that can draw its block of a global mask inside ``shard_map``.

    A layer sets ``_spec``, its kind (:mod:`dropmask._layer_specs`), and stores its
    arguments, ``shard_spec`` among them; the call is the same for every kind.
    """

    _spec: ClassVar[_layer_specs.Spec]

    def __call__(
        self,
        inputs: jax.Array,
        *,
        deterministic: bool | None = None,
        rngs: Any = None,
        global_shape: Sequence[int] | None = None,
        offset: Sequence[Any] | None = None,
    ) -> jax.Array:
        """Applies the layer to ``inputs`` (shapes as in the layer's docstring).

        ``global_shape`` / ``offset``: this call's block of a global array, as in
        :func:`dropmask.dropout` (instead of ``shard_spec``).
        """
        return _layer_specs.apply(
            self._spec, self, inputs, deterministic, rngs, global_shape, offset
        )


class DropoutLike(Sharded):
    """A sharded layer that takes exactly :class:`Dropout`'s arguments
    (``Dropout``, ``AlphaDropout``); a variant sets only its ``_spec``."""

    def __init__(
        self,
        rate: float | jax.Array,
        *,
        broadcast_dims: int | Sequence[int] = (),
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
        self.broadcast_dims = as_dims(broadcast_dims, caller=self._caller)
        self.impl = impl
        self.shard_spec = shard_spec
        self.residual = residual
