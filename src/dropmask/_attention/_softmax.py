"""The dense attention path's softmax: a row that sees a non-finite input is emptied and flagged.

The masked softmax of :mod:`dropmask._reductions` (its shift, sum and closed-form
tangent), with two additions attention needs: a row whose valid elements include a
NaN or +inf, or that the caller marks tainted, becomes 0 and is flagged, found from
the sum the softmax computes anyway; and weights stored in a narrower dtype than the
softmax computes in (bf16 attention) differentiate from what is stored.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._random import explicitly_sharded_axes, loop_zero, sharded_as
from .._reductions import compute_dtype, softmax_tangent

__all__ = ["narrow_softmax_tangent", "select", "softmax_flagging_nonfinite"]

# Added to a tainted row's exponentials (each in [0, 1]): no sum of untainted ones
# reaches it, and it is finite, so no NaN is built where none was given.
_TAINT = 2.0**64


def softmax_flagging_nonfinite(
    x: jax.Array, m: jax.Array, axes: tuple[int, ...], taint: jax.Array, dtype: Any = None
) -> tuple[jax.Array, jax.Array]:
    """``_reductions.softmax_core``, except that a row with a non-finite valid element is 0.

    ``m`` and ``taint`` (bool, broadcastable to ``x``; pass them unbroadcast, they
    are read inside the fusions) mark valid elements and elements that count as
    non-finite although ``x`` is finite there; only valid ones matter. Returns
    ``(weights, nonfinite)`` with ``weights`` in the compute dtype and
    ``nonfinite: bool``, 1 on the reduced axes.

    Dense attention uses it (``_dense_weights``, its only softmax) to find the rows
    that see a non-finite input from the sum the softmax computes anyway (``taint``
    joins it inside the exp fusion) and from a minimum beside the maximum, over the
    array the maximum reads (a valid -inf), and to empty them so
    that ``0 * NaN`` in the backward pass cannot reach the other rows; it then writes
    NaN into their outputs itself. The backward pass keeps the weights only: one array
    the size of ``x``.

    ``dtype`` (default: the compute dtype) is the weights' output dtype. The softmax is
    computed in f32+ either way; a narrower ``dtype`` (bf16 attention) is also the
    array the backward pass keeps, so it holds half the bytes of the f32 weights; the
    tangent is then computed in f32+ from those rounded weights, as a softmax run in
    bf16 (Flax's default) differentiates from its bf16 output.
    """
    out = compute_dtype(x.dtype) if dtype is None else jnp.dtype(dtype)
    return _softmax_flagged(x, m, taint, axes, out)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _softmax_flagged(
    x: jax.Array, m: jax.Array, taint: jax.Array, axes: tuple[int, ...], dtype: Any
) -> tuple[jax.Array, jax.Array]:
    # A NaN or +inf valid element makes the shift 0 and the sum NaN or inf; a
    # tainted one makes it at least _TAINT. A -inf one adds 0 to the sum: the row's
    # minimum finds it, over the array the maximum reads (masked elements held at the
    # lowest finite value, so that only a valid -inf reaches -inf). Checked element
    # by element beside the exponentials instead, the scores stayed alive until the
    # weights were written: one more [*b, heads, q, k] array at the peak.
    # Every fill, and the mask, start from a 0 of the scores: in a differentiated scan
    # none of them is a constant array JAX holds for the whole loop (``loop_zero``).
    # In lax, not jnp: each jnp function is a jitted function that tracing runs again
    # for every new shape (``select``).
    zero = loop_zero(x)
    m = lax.bitwise_or(m, lax.ne(zero, np.zeros((), zero.dtype)))
    xz = lax.convert_element_type(select(m, x, zero), compute_dtype(x.dtype))
    zero = lax.convert_element_type(zero, xz.dtype)
    held = select(m, xz, lax.add(zero, np.array(jnp.finfo(xz.dtype).min, xz.dtype)))
    top = _keep(lax.reduce_max(held, axes), axes)
    no_neg_inf = lax.gt(_keep(lax.reduce_min(held, axes), axes), np.array(-np.inf, xz.dtype))
    shift = lax.stop_gradient(select(lax.is_finite(top), top, zero))
    extra = select(taint, lax.add(zero, np.array(_TAINT, xz.dtype)), zero)
    e = _broadcasting(lax.sub, select(m, xz, shift), shift)
    e = select(m, _broadcasting(lax.add, lax.exp(e), extra), zero)
    s = _keep(lax.reduce_sum(e, axes), axes)
    clean = lax.bitwise_and(lax.lt(s, np.array(_TAINT, s.dtype)), no_neg_inf)  # NaN: False
    denominator = select(lax.eq(s, zero), lax.add(zero, np.ones((), s.dtype)), s)
    y = select(clean, _broadcasting(lax.div, e, denominator), zero)
    return lax.convert_element_type(y, dtype), lax.bitwise_not(clean)


def select(m: Any, a: Any, b: Any) -> jax.Array:
    """``jnp.where(m, a, b)`` in lax for ``a`` and ``b`` of one dtype: the three broadcast
    against each other as NumPy broadcasts them.

    ``jnp.where`` is a jitted function that tracing runs again for every new shape
    (about 0.7 ms on 2 CPU cores); a dense attention call traced about 30 of them.
    """
    shape = jnp.broadcast_shapes(jnp.shape(m), jnp.shape(a), jnp.shape(b))
    operands = [_to(v, shape) for v in (m, a, b)]
    # Under a mesh of explicit axes lax.select needs its operands sharded alike: a
    # broadcast scalar or mask takes the sharding of the first operand that has one.
    like = next((v for v in operands if explicitly_sharded_axes(v)), None)
    if like is not None:
        operands = [sharded_as(v, like) for v in operands]
    return lax.select(*operands)


def _broadcasting(op: Any, a: jax.Array, b: jax.Array) -> jax.Array:
    """``op(a, b)`` for a lax binary ``op``, the two broadcast against each other."""
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    return op(_to(a, shape), _to(b, shape))


def _to(x: Any, shape: tuple[int, ...]) -> jax.Array:
    if jnp.shape(x) == shape:
        return x
    ndim = jnp.ndim(x)
    return lax.broadcast_in_dim(x, shape, tuple(range(len(shape) - ndim, len(shape))))


def _keep(reduced: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """A reduction's result with its reduced ``axes`` back, as 1s (``keepdims=True``)."""
    return lax.expand_dims(reduced, axes)


@_softmax_flagged.defjvp
def _softmax_flagged_jvp(
    axes: tuple[int, ...],
    dtype: Any,
    primals: tuple[jax.Array, ...],
    tangents: tuple[Any, ...],
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, Any]]:
    x, m, taint = primals
    y, nonfinite = _softmax_flagged(x, m, taint, axes, dtype)
    flag_tangent = np.zeros(nonfinite.shape, dtype=jax.dtypes.float0)
    return (y, nonfinite), (narrow_softmax_tangent(y, tangents[0], axes), flag_tangent)


def narrow_softmax_tangent(y: jax.Array, t: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``_reductions.softmax_tangent`` in f32+ from weights ``y`` stored in a narrower dtype.

    Inside ``jax.checkpoint`` the widening of ``y`` belongs to the tangent's own
    computation, so the backward pass keeps ``y`` as given (bf16) and widens it
    again, instead of keeping a widened f32 copy.
    """
    acc = compute_dtype(y.dtype)
    if acc == y.dtype:
        return softmax_tangent(y, t, axes)
    widened = jax.checkpoint(lambda y, t: softmax_tangent(y.astype(acc), t.astype(acc), axes))
    return widened(y, t).astype(y.dtype)
