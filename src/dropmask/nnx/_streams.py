"""The random stream every dropmask NNX layer draws its masks from.

One helper for the NNX front end's layers (``nnx.Dropout`` and its family, the
recurrent wrappers), so that neither imports it from the other.
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from .._checks import check_instance

__all__ = ["own_stream"]


def own_stream(rngs: Any, rng_collection: str, *, caller: str) -> Any:
    """The layer's own fork of ``rngs``' ``rng_collection`` stream (``nnx.data(None)`` for
    None), shared by every dropmask NNX layer that draws masks."""
    check_instance(
        rngs,
        (nnx.Rngs, nnx.RngStream, type(None)),
        caller=caller,
        name="rngs",
        what="an nnx.Rngs, nnx.RngStream or None",
        fix=f"Pass e.g. rngs=nnx.Rngs({rng_collection}=0).",
    )
    if isinstance(rngs, nnx.Rngs):
        return rngs[rng_collection].fork()
    if isinstance(rngs, nnx.RngStream):
        return rngs.fork()
    return nnx.data(None)
