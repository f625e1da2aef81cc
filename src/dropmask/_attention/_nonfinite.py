"""The non-finite convention every attention path shares.

A NaN or inf in a query, key or value is zeroed before the einsums and recorded per
position; the paths empty the rows it may reach, and :func:`poison` writes NaN into
those queries' outputs afterwards, with a NaN gradient to their ``q`` only.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._random import loop_zero
from ._softmax import select

__all__ = [
    "poison",
    "poison_where_tainted",
    "poisoned_cotangent",
    "poisoned_gradient",
    "prepared",
    "taint",
]


def prepared(q: jax.Array, k: jax.Array, v: jax.Array, dtype: Any) -> tuple[jax.Array, ...]:
    """``q`` (scaled by ``1/sqrt(depth)``), ``k`` and ``v`` in ``dtype`` with non-finite
    entries zeroed, and where they were: ``(q, k, v, bad_q, bad_k, bad_v)``. Zeroed
    before the einsums, whose backward multiplies by every key and query, masked or not."""
    q, bad_q = _finite_part(q, dtype)
    k, bad_k = _finite_part(k, dtype)
    v, bad_v = _finite_part(v, dtype)
    return q / jnp.sqrt(q.shape[-1]).astype(dtype), k, v, bad_q, bad_k, bad_v


def _finite_part(x: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``x`` in ``dtype`` with non-finite entries zeroed; ``bad: bool[*b, length, heads]``."""
    return _zeroed(x, dtype), _nonfinite_rows(x, dtype)


def _sanitised(x: jax.Array, dtype: Any) -> jax.Array:
    """``x`` in ``dtype``, non-finite entries (before or after the cast) set to 0.

    Zeroed before the cast, so no op passes a NaN along (``jax_debug_nans``); a cast
    can overflow (float32 to float16), so its result is checked too.
    """
    zero = loop_zero(x)  # not a constant a differentiated scan would hold whole
    out = lax.convert_element_type(select(_is_finite(x), x, zero), dtype)
    if x.dtype != dtype:
        out = select(_is_finite(out), out, lax.convert_element_type(zero, dtype))
    return out


def _is_finite(x: jax.Array) -> jax.Array:
    """``jnp.isfinite`` in lax: an integer is always finite (``x == x``, not a constant)."""
    return lax.is_finite(x) if jnp.issubdtype(x.dtype, jnp.floating) else lax.eq(x, x)


def _nonfinite_rows(x: jax.Array, dtype: Any) -> jax.Array:
    finite = _is_finite(x)
    if x.dtype != dtype:
        safe = lax.convert_element_type(select(finite, x, np.zeros((), x.dtype)), dtype)
        finite = lax.bitwise_and(finite, _is_finite(safe))
    return lax.bitwise_not(lax.reduce_and(finite, (x.ndim - 1,)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _zeroed(x: jax.Array, dtype: Any) -> jax.Array:
    """:func:`_sanitised` whose derivative is the identity, zeroed entries included.

    No weight touches a zeroed entry (its query row or key column is emptied), so
    its cotangent from the einsums is already exactly 0. The derivative of a
    ``where`` would zero it again, a select over the whole ``[*b, length, heads,
    depth]`` gradient that XLA writes out beside the einsum's output for each of
    ``q``, ``k`` and ``v``; the identity keeps no residual and writes nothing.
    """
    return _sanitised(x, dtype)


@_zeroed.defjvp
def _zeroed_jvp(
    dtype: Any, primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[jax.Array, jax.Array]:
    return _zeroed(primals[0], dtype), tangents[0].astype(dtype)


def taint(bad_q: jax.Array, bad_kv: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
    """``(rows, cols)``: a non-finite query's row ``[*b, heads, q, 1]`` and a non-finite
    key's or value's column ``[*b, heads, 1, k]``.

    Together they mark the scores a non-finite input touches without being that large:
    the softmax flags exactly the rows whose *allowed* part holds one, from the sums
    it computes anyway or from these small arrays; nothing of size ``[q_len, kv_len,
    depth]`` is built.
    """
    rows = jnp.swapaxes(bad_q, -1, -2)[..., None]  # [*b, heads, q, 1]
    cols = jnp.swapaxes(bad_kv, -1, -2)  # [*b, kv_heads, k]
    if groups > 1:  # each key-value head's column for its query heads: a repeat
        *lead, kv_heads, k = cols.shape
        cols = jnp.broadcast_to(cols[..., None, :], (*lead, kv_heads, groups, k))
        cols = cols.reshape(*lead, kv_heads * groups, k)  # keeps a split of the heads
    return rows, cols[..., None, :]


def poison(out: jax.Array, q: jax.Array, tainted: jax.Array) -> jax.Array:
    """Writes NaN into tainted query rows, with a NaN gradient to their ``q`` only.

    Their attention rows were emptied, so the einsums above saw only finite inputs
    and every other query's value and gradient is exact. ``q * 0 / 0`` is NaN in
    value and derivative on tainted rows, and ``q * 0 / 1`` is 0 elsewhere, so a
    tainted query's gradient is NaN as in plain attention, and no NaN is built when
    there is none (``jax_debug_nans`` stays quiet). One entry of ``q``, not a sum
    over depth, which XLA would recompute for every output feature. The NaN reaches
    that entry whatever it held (:func:`_zeroed` passes gradients through): a
    tainted query's first feature always gets a NaN gradient.
    """
    rows = _rows(tainted)
    first = lax.slice_in_dim(q, 0, 1, axis=q.ndim - 1)
    zero = lax.mul(lax.convert_element_type(first, out.dtype), np.zeros((), out.dtype))
    nan = lax.div(zero, select(rows, np.zeros((), out.dtype), np.ones((), out.dtype)))
    return select(rows, nan, out)


def poison_where_tainted(out: jax.Array, q: jax.Array, tainted: jax.Array) -> jax.Array:
    """:func:`poison` where some row is tainted, ``out`` as it is otherwise.

    For the TPU kernels' output: there the select over the output and the taint's
    ``[*b, q, heads, 1]`` arrays (a size-1 minor axis, padded to whole registers) are
    passes over memory that the common call, with no tainted row, skips. On a v5e,
    bf16 causal ``[1, 8192, 8, 128]``: the forward 1.513 ms against 1.572, with its
    backward 3.920 against 4.020. Under ``vmap`` the condition is batched and both
    branches run, as :func:`poison` alone; a caller whose ``tainted`` is split over
    devices keeps :func:`poison`, since the condition would reduce over them.
    """
    return lax.cond(jnp.any(tainted), poison, lambda out, q, tainted: out, out, q, tainted)


def poisoned_cotangent(tainted: jax.Array, g: jax.Array) -> jax.Array:
    """The cotangent :func:`poison` passes to its ``out``: ``g`` zeroed on tainted rows.

    With :func:`poisoned_gradient`, :func:`poison`'s derivative, for a backward rule of
    its own.
    """
    return select(_rows(tainted), np.zeros((), g.dtype), g)


def poisoned_gradient(tainted: jax.Array, dq: jax.Array) -> jax.Array:
    """``dq``, the queries' gradient (0 on tainted rows, which were emptied), with the
    NaN that :func:`poison` gives the first feature of a tainted query.

    Written into ``dq`` elementwise, where :func:`poison`'s own derivative adds a
    ``q``-sized pad of that feature's cotangent, which XLA may compute early and hold
    through the attention's backward pass. ``0 / 0`` where tainted and ``dq / 1``
    elsewhere: no NaN is built when there is none.
    """
    first = lax.eq(lax.broadcasted_iota(jnp.int32, dq.shape, dq.ndim - 1), np.int32(0))
    bad = lax.bitwise_and(first, jnp.broadcast_to(_rows(tainted), dq.shape))
    zero, one = np.zeros((), dq.dtype), np.ones((), dq.dtype)
    return lax.div(select(bad, lax.mul(dq, zero), dq), select(bad, zero, one))


def _rows(tainted: jax.Array) -> jax.Array:
    """``tainted: bool[*b, heads, q, 1]`` as ``[*b, q, heads, 1]``, the outputs' layout."""
    return jnp.swapaxes(tainted[..., 0], -1, -2)[..., None]
