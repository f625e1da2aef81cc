"""What every Linen stochastic layer shares: resolving ``deterministic``, fetching a key.

Its own module, so that the layers of ``__init__.py`` and ``_structured_layers.py`` share
one base without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import flax.errors
import flax.linen as nn
import jax

from .. import _dropout, _layer_specs
from .._checks import check_key
from .._errors import MissingKeyError, user_error

__all__ = ["MissingStreamError", "Sharded", "Stochastic"]


class MissingStreamError(MissingKeyError, flax.errors.InvalidRngError):
    """A layer in training mode found no key for its PRNG stream.

    Also Flax's ``InvalidRngError``, with Flax's wording (``needs PRNG for "dropout"``)
    leading the message, so code written against ``flax.linen.Dropout`` still catches
    and matches it.

    Example:
      >>> import flax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> try:
      ...     dl.Dropout(0.5, deterministic=False).apply({}, jnp.ones(3))  # no rngs
      ... except flax.errors.InvalidRngError as err:  # a dropmask.MissingKeyError too
      ...     print(type(err).__name__)
      MissingStreamError
    """

    def __init__(self, message: str):
        MissingKeyError.__init__(self, message)


class Stochastic(nn.Module):
    """What every stochastic layer shares: resolving ``deterministic`` and fetching a key.

    Each layer declares its own fields (``rate``, ``deterministic``, ``rng_collection``,
    ...) in Flax's order; a layer adds only what differs.
    """

    @property
    def _caller(self) -> str:
        return f"dropmask.linen.{type(self).__name__}"

    def _prepare(self, deterministic: bool | None, rng: Any) -> tuple[bool, Any]:
        """``(deterministic, key)`` for this call; key None when no randomness is drawn.

        ``deterministic`` is merged exactly as Flax does. The key is ``rng`` if given,
        else the next key of the layer's stream; like Flax's ``make_rng``, a missing
        stream falls back to ``'params'`` (so that ``init`` in training mode works), and
        only when neither exists is it an error, naming the streams that were given.
        """
        fields: Any = self  # the fields are declared by each layer
        det = bool(nn.merge_param("deterministic", fields.deterministic, deterministic))
        if not _dropout.needs_key(fields.rate, det, caller=self._caller):
            return det, None
        if rng is not None:
            check_key(rng, caller=self._caller, name="rng")
            return det, rng
        stream = fields.rng_collection
        if not (self.has_rng(stream) or self.has_rng("params")):
            given = list(self.scope.rngs) if self.scope is not None else []
            try:
                check_key(None, caller=self._caller, stream=stream, streams=given)
            except MissingKeyError as err:
                raise user_error(
                    MissingStreamError,
                    f'{self.name} needs PRNG for "{stream}"',
                    str(err),
                    caller=None,
                ) from None
        return det, self.make_rng(stream)


class Sharded(Stochastic):
    """A stochastic layer that can draw its block of a global mask inside ``shard_map``.

    A layer sets ``_spec``, its kind (:mod:`dropmask._layer_specs`), and declares its
    fields, ``shard_spec`` among them; the call is the same for every kind.
    """

    _spec: ClassVar[_layer_specs.Spec]

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        deterministic: bool | None = None,
        rng: Any = None,
        *,
        global_shape: Sequence[int] | None = None,
        offset: Sequence[Any] | None = None,
    ) -> jax.Array:
        """Applies the layer to ``inputs`` (shapes as in the layer's docstring).

        ``global_shape`` / ``offset``: this call's block of a global array, as in
        :func:`dropmask.dropout` (instead of ``shard_spec``).
        """
        return _layer_specs.apply(
            self._spec, self, inputs, deterministic, rng, global_shape, offset
        )
