"""The dense attention path's weights: a NaN-safe softmax of the scores, fused by XLA.

:func:`attention_weights` computes ``softmax(scores + bias)`` over the allowed keys, with
the dense path's contract: an empty row is 0, a row that sees a non-finite input (its
``taint``) or a non-finite allowed score (NaN, or an overflow to +inf or -inf) is 0 and
flagged, so that its output can be poisoned without ``0 * NaN`` reaching other rows in
the backward pass. The scores of the plain product come out in the compute dtype
(float32 for 16-bit inputs), as on the blockwise and Pallas paths.

Two branches compute it, chosen at run time by one scalar:

* ``fast``: the scores cannot be NaN or infinite. That is known before they exist,
  from the inputs: ``|q . k| <= max |q| * max |k|`` (Cauchy-Schwarz over the rows of the
  zeroed, scaled ``q`` and ``k``) plus the largest finite ``|bias|`` stays far below the
  scores' dtype's largest value, and the bias holds no NaN or +inf (-inf masks).
  Then the softmax is written with the operations XLA's CPU backend fuses into the
  scores' matrix product (add, max, subtract, exp, sum, multiply, divide): a masked key
  adds -inf, an empty row's shift is clamped to the lowest finite value (its
  exponentials are 0, and so are its weights, as ``0 / (0 + tiny)``), and a tainted
  row's reciprocal is multiplied by 0. At ``[16, 8, 256, 256]`` the product, max,
  subtract and exp fuse into one kernel that writes the exponentials; the normalisation
  by the row's reciprocal is a second pass (writing ``(e / total) * keep`` instead fused
  it into the first, but that variant's encoder step measured 1.05x Flax's in one ``make
  bench`` run, within noise of this form's 0.905x, and was not kept).
* ``safe``: the masked softmax that flags non-finite rows element by element
  (:func:`softmax_flagging_nonfinite`), a -inf allowed score included. Only inputs
  that could overflow the scores, or a bias with NaN or +inf, take it.

Both compute the same function, so which one ran never shows in a result. Under
``vmap`` the choice is made once for the whole batch (:func:`_anywhere`), so a batch
runs one branch, not both.

The derivative is the closed form ``y * (t - <y, t>)`` with ``t`` the scores' tangent:
``score`` is bilinear, so ``t = score(dq, k) + score(q, dk) + dbias``. It holds in
forward and reverse mode alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._reductions import compute_dtype
from ._softmax import narrow_softmax_tangent, softmax_flagging_nonfinite

__all__ = ["attention_weights"]

Score = Callable[[jax.Array, jax.Array], jax.Array]
# The fast branch's scores must stay this far below the largest finite value, so
# that rounding in the matrix product (relative error well under 1e-3 for any
# realistic depth) cannot reach it.
_HEADROOM = 4.0


@jax.custom_batching.custom_vmap
def _anywhere(flag: jax.Array) -> jax.Array:
    return flag


@_anywhere.def_vmap
def _anywhere_vmap(axis_size: int, in_batched: list[bool], flag: jax.Array) -> tuple[Any, bool]:
    # True if any member of the batch needs the safe branch: the whole batch takes it.
    del axis_size
    return (jnp.any(flag) if in_batched[0] else flag), False


def _largest_row_norm(x: jax.Array) -> jax.Array:
    """``max_i ||x_i||`` over the last axis, in the compute dtype (inf if it overflows)."""
    x = x.astype(compute_dtype(x.dtype))
    return jnp.sqrt(jnp.max(jnp.sum(x * x, axis=-1), initial=0.0))


def _may_be_non_finite(q: jax.Array, k: jax.Array, bias: Any, scores_dtype: Any) -> jax.Array:
    """Scalar bool: some score may be NaN or +inf (then the safe branch runs)."""
    bound = _largest_row_norm(q) * _largest_row_norm(k)
    # The scores come out of the product in ``scores_dtype``: its range is the limit.
    ok = bound < jnp.asarray(float(jnp.finfo(scores_dtype).max) / _HEADROOM, bound.dtype)
    if bias is not None:
        ok &= ~jnp.any(jnp.isnan(bias) | (bias == jnp.inf))
        # A -inf bias masks its score (it is not allowed); a finite one shifts a
        # bounded score by at most its magnitude, either way: a score pushed to
        # -inf has overflowed, and taints its row as +inf does.
        largest = jnp.max(jnp.where(jnp.isfinite(bias), jnp.abs(bias), 0), initial=0.0)
        limit = jnp.asarray(float(jnp.finfo(bias.dtype).max) / _HEADROOM, bias.dtype)
        ok &= bound.astype(bias.dtype) + largest < limit
    return _anywhere(~ok)


def attention_weights(
    score: Score,
    q: jax.Array,
    k: jax.Array,
    bias: jax.Array | None,
    allowed: jax.Array | None,
    bad_rows: jax.Array,
    bad_cols: jax.Array,
    dtype: Any,
    *,
    bounded: bool,
) -> tuple[jax.Array, jax.Array]:
    """``(weights, tainted)`` of dense attention.

    Args:
      score: ``(q, k) -> scores [*b, heads, q_len, kv_len]`` in ``dtype``, bilinear.
      q, k: the zeroed, scaled inputs of ``score`` (finite).
      bias: additive, in the compute dtype, broadcastable to the scores, or None.
      allowed: bool, broadcastable to the scores (True = may attend), or None.
      bad_rows: ``bool[*b, heads, q_len, 1]``, queries with a non-finite input.
      bad_cols: ``bool[*b, heads, 1, kv_len]``, keys or values with one.
      dtype: the weights' dtype (the softmax itself runs in the compute dtype).
      bounded: whether ``score`` is the plain product, so that the row norms bound
        it; a custom einsum always takes the safe branch.

    Returns:
      ``weights`` in ``dtype`` (0 on empty and tainted rows) and ``tainted:
      bool[*b, heads, q_len, 1]``.
    """
    return _weights(score, jnp.dtype(dtype), bounded, q, k, bias, allowed, bad_rows, bad_cols)


def _scores(score: Score, q: jax.Array, k: jax.Array, bias: Any) -> jax.Array:
    logits = score(q, k)
    x = logits.astype(compute_dtype(logits.dtype))
    return x if bias is None else x + bias


def _safe(score, dtype, q, k, bias, allowed, bad_rows, bad_cols):
    x = _scores(score, q, k, bias)
    valid = jnp.ones((1,) * x.ndim, bool) if allowed is None else allowed
    # An allowed score of -inf can only be an overflow (a -inf bias is not allowed):
    # it taints the row as NaN and +inf do, whichever of them a path's product gave.
    taint = bad_rows | bad_cols | (x == -jnp.inf)
    return softmax_flagging_nonfinite(x, valid, (x.ndim - 1,), taint, dtype)


def _fast(score, dtype, q, k, bias, allowed, bad_rows, bad_cols):
    x = _scores(score, q, k, bias)
    if allowed is None:
        tainted = bad_rows | jnp.any(bad_cols, axis=-1, keepdims=True)
    else:
        # Added, not selected: a select would keep XLA from fusing the softmax into
        # the scores' product. The mask is built at its own (broadcast) shape.
        x = x + jnp.where(allowed, 0.0, -jnp.inf).astype(x.dtype)
        # A bad input taints the rows whose allowed part it is in; the mask is only
        # scanned when there is one.
        rows_shape = jnp.broadcast_shapes(allowed.shape, bad_rows.shape, bad_cols.shape)[:-1]
        tainted = lax.cond(
            _anywhere(jnp.any(bad_rows) | jnp.any(bad_cols)),
            lambda a, r, c: (
                (r & jnp.any(a, axis=-1, keepdims=True)) | jnp.any(a & c, axis=-1, keepdims=True)
            ),
            # Built from the operands, so that inside shard_map it varies as they do.
            lambda a, r, c: jnp.broadcast_to(
                (r & False) | (a[..., :1] & False) | (c[..., :1] & False), (*rows_shape, 1)
            ),
            allowed,
            bad_rows,
            bad_cols,
        )
    if x.shape[-1] == 0:
        tainted = tainted & False  # no key: nothing to see, as in the safe branch
    tainted = jnp.broadcast_to(tainted, x.shape[:-1] + (1,))
    top = jnp.max(x, axis=-1, keepdims=True, initial=-jnp.inf)
    # An empty row's maximum is -inf: clamped, its exponentials are exp(-inf) = 0.
    shift = jnp.maximum(top, jnp.finfo(x.dtype).min)
    e = jnp.exp(x - shift)
    total = jnp.sum(e, axis=-1, keepdims=True)
    # A valid row's total is at least 1 (its maximum's exp(0)), so adding the smallest
    # normal number changes nothing; an empty row's 0 becomes a safe denominator.
    keep = 1.0 - tainted.astype(x.dtype)
    return (e * (keep / (total + jnp.finfo(x.dtype).tiny))).astype(dtype), tainted


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _weights(score, dtype, bounded, q, k, bias, allowed, bad_rows, bad_cols):
    args = (q, k, bias, allowed, bad_rows, bad_cols)
    safe = functools.partial(_safe, score, dtype)
    if not bounded:
        return safe(*args)
    # A bounded score is the plain product, whose output is in the compute dtype.
    risky = _may_be_non_finite(q, k, bias, compute_dtype(dtype))
    return lax.cond(risky, safe, functools.partial(_fast, score, dtype), *args)


@_weights.defjvp
def _weights_jvp(score, dtype, bounded, primals, tangents):
    q, k, bias, allowed, bad_rows, bad_cols = primals
    dq, dk, dbias = tangents[:3]
    y, tainted = _weights(score, dtype, bounded, *primals)
    t = score(dq, k) + score(q, dk)
    t = t.astype(compute_dtype(t.dtype))
    if bias is not None:
        t = t + dbias
    flag_tangent = np.zeros(tainted.shape, dtype=jax.dtypes.float0)
    return (y, tainted), (narrow_softmax_tangent(y, t, (y.ndim - 1,)), flag_tangent)
