"""What every Linen stochastic layer shares: resolving ``deterministic``, fetching a key.

Its own module, so that the layers of ``linen.py`` and ``_linen_structured.py`` share
one base without importing each other.
"""

from __future__ import annotations

from typing import Any

import flax.errors
import flax.linen as nn

from . import _dropout
from ._checks import check_key
from ._errors import MissingKeyError

__all__ = ["MissingStreamError", "Stochastic"]


class MissingStreamError(MissingKeyError, flax.errors.InvalidRngError):
    """A layer in training mode found no key for its PRNG stream.

    Also Flax's ``InvalidRngError``, with Flax's wording (``needs PRNG for "dropout"``)
    leading the message, so code written against ``flax.linen.Dropout`` still catches
    and matches it.
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
                raise MissingStreamError(f'{self.name} needs PRNG for "{stream}". {err}') from None
        return det, self.make_rng(stream)
