"""The random stream every dropmask NNX layer draws its masks from.

One helper for the NNX front end's layers (``nnx.Dropout`` and its family, the
recurrent wrappers), so that neither imports it from the other.
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from .._errors import DropmaskTypeError

__all__ = ["own_stream"]


def own_stream(rngs: Any, rng_collection: str, *, caller: str) -> Any:
    """The layer's own fork of ``rngs``' ``rng_collection`` stream (``nnx.data(None)`` for
    None), shared by every dropmask NNX layer that draws masks."""
    if isinstance(rngs, nnx.Rngs):
        return rngs[rng_collection].fork()
    if isinstance(rngs, nnx.RngStream):
        return rngs.fork()
    if rngs is None:
        return nnx.data(None)
    raise DropmaskTypeError(
        f"{caller}: rngs must be an nnx.Rngs, nnx.RngStream or None, got "
        f"{type(rngs).__name__}. Pass e.g. rngs=nnx.Rngs({rng_collection}=0)."
    )
