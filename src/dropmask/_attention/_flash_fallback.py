"""The TPU attention kernels tried once per call configuration, before a call takes them.

A kernel that Mosaic fails to lower (an op or a layout its lowering lacks, in some JAX
version) would fail the user's whole program when it is lowered for the TPU. Instead,
the first call of each configuration (shapes, dtypes, options) traces the kernels'
forward and backward passes once with ``jax.eval_shape``, each kernel lowered for a TPU
as it is traced (``_random.tpu_only``'s ``check``, cached per kernel); where one fails,
that configuration takes the path the call takes without the kernels (the blockwise or
dense path, which draws the same dropout mask) and one warning names the call, the
kernel and the error. Later calls of the configuration read the answer from a cache.

Cost: one more trace of the kernels' forward and backward passes, and one lowering of
each kernel, per configuration and process (the program's own lowering lowers them
again). A failure inside the TPU compiler's own passes, when XLA compiles the program,
is not seen here; ``dropmask.testing.tpu_kernels(False)`` is the way around it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax

from .._random import KernelLoweringError
from ._checked import Checked

__all__ = ["lowering_error"]

# A call configuration's signature -> None where every kernel lowers, else the error.
_TRIED: dict[Any, KernelLoweringError | None] = {}


def _signature(*values: Any) -> tuple[Any, ...]:
    """A hashable description of ``values``: arrays (and tracers) by shape and dtype,
    other leaves as themselves (by identity where unhashable)."""
    out: list[Any] = []
    for leaf in jax.tree.leaves(values, is_leaf=lambda x: x is None):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            out.append(("array", tuple(leaf.shape), str(leaf.dtype)))
            continue
        try:
            hash(leaf)
            out.append(leaf)
        except TypeError:
            out.append(("object", type(leaf).__name__, id(leaf)))
    return tuple(out)


def lowering_error(
    c: Checked, run_flash: Callable[[Checked], jax.Array], *options: Any
) -> KernelLoweringError | None:
    """None where the TPU kernels lower for calls like ``c`` (``run_flash(c)`` is the
    call by the kernels; ``options``, the call's other static choices, complete the
    configuration); else the error, after one warning for the configuration."""
    key = _signature(*(getattr(c, f.name) for f in dataclasses.fields(c)), *options)
    if key in _TRIED:
        return _TRIED[key]

    def gradients(q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            return run_flash(dataclasses.replace(c, q=q, k=k, v=v))

        out, pull = jax.vjp(attend, q, k, v)
        return pull(out)

    try:
        jax.eval_shape(gradients, c.q, c.k, c.v)
        error = None
    except KernelLoweringError as err:
        error = err
        warnings.warn(
            f"dot_product_attention: Mosaic failed to lower the TPU attention kernel "
            f"{err.name} ({err.cause}); calls with q {c.q.shape} {c.q.dtype}, k "
            f"{c.k.shape} and these options take the path without the kernels, which "
            "draws the same dropout mask. dropmask.testing.tpu_kernels(False) takes "
            "that path without trying the kernels.",
            RuntimeWarning,
            stacklevel=5,
        )
    _TRIED[key] = error
    return error
