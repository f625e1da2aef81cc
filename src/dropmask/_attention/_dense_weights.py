"""The dense attention path's weights: a NaN-safe softmax of the scores.

:func:`attention_weights` computes ``softmax(scores + bias)`` over the allowed keys, with
the dense path's contract: an empty row is 0, a row that sees a non-finite input (its
``taint``) or a non-finite allowed score (NaN, or an overflow to +inf or -inf) is 0 and
flagged, so that its output can be poisoned without ``0 * NaN`` reaching other rows in
the backward pass. The scores of the plain product come out in the compute dtype
(float32 for 16-bit inputs), as on the blockwise and Pallas paths.

One softmax serves every input: the masked softmax that flags rows with a non-finite
allowed score (:func:`softmax_flagging_nonfinite`), a -inf one included. A
second, select-free softmax for scores that provably cannot overflow, chosen at run
time by a ``cond``, ran an encoder layer's train step 1.6 % faster (median of five
paired runs) but put a second product and softmax into every call's compiled program,
which then compiled 1.2 times as long (docs/dropout_speed.md, "Compile time").

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

from .._reductions import compute_dtype
from ._softmax import narrow_softmax_tangent, softmax_flagging_nonfinite

__all__ = ["Score", "attention_weights", "scores"]

Score = Callable[[jax.Array, jax.Array], jax.Array]


def attention_weights(
    score: Score,
    q: jax.Array,
    k: jax.Array,
    bias: jax.Array | None,
    allowed: jax.Array | None,
    bad_rows: jax.Array,
    bad_cols: jax.Array,
    dtype: Any,
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

    Returns:
      ``weights`` in ``dtype`` (0 on empty and tainted rows) and ``tainted:
      bool[*b, heads, q_len, 1]``.
    """
    return _weights(score, jnp.dtype(dtype), q, k, bias, allowed, bad_rows, bad_cols)


def scores(score: Score, q: jax.Array, k: jax.Array, bias: Any) -> jax.Array:
    """``score(q, k)`` in the compute dtype, plus ``bias`` when given."""
    logits = score(q, k)
    x = logits.astype(compute_dtype(logits.dtype))
    return x if bias is None else x + bias


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _weights(score, dtype, q, k, bias, allowed, bad_rows, bad_cols):
    x = scores(score, q, k, bias)
    valid = jnp.ones((1,) * x.ndim, bool) if allowed is None else allowed
    # An allowed score of -inf can only be an overflow (a -inf bias is not allowed):
    # the softmax flags its row as it flags NaN and +inf, whichever of them a path's
    # product gave.
    return softmax_flagging_nonfinite(x, valid, (x.ndim - 1,), bad_rows | bad_cols, dtype)


@_weights.defjvp
def _weights_jvp(score, dtype, primals, tangents):
    q, k, bias, allowed, bad_rows, bad_cols = primals
    dq, dk, dbias = tangents[:3]
    y, tainted = _weights(score, dtype, *primals)
    t = score(dq, k) + score(q, dk)
    t = t.astype(compute_dtype(t.dtype))
    if bias is not None:
        t = t + dbias
    flag_tangent = np.zeros(tainted.shape, dtype=jax.dtypes.float0)
    return (y, tainted), (narrow_softmax_tangent(y, t, (y.ndim - 1,)), flag_tangent)
