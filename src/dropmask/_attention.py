"""Masked dot-product attention, a drop-in ``attention_fn`` for Flax.

It computes what ``flax.linen.dot_product_attention`` computes, except where Flax
is wrong: a query with no valid key outputs zeros (Flax and
``jax.nn.dot_product_attention`` output the mean of all values), with finite
gradients, and a query depends only on the keys its mask allows. A NaN or inf in a
key or value reaches exactly the queries that may attend to it, in values and in
gradients: Flax and ``jax.nn`` spread it to every query through ``0 * NaN`` in the
einsums (forward and backward).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ._checks import check_floating, check_impl, check_key, check_rate
from ._dropout import dropout
from ._errors import DropmaskValueError, DtypeError
from ._masks import as_array, causal_mask, check_broadcastable
from ._random import DEFAULT_IMPL, Impl
from ._reductions import compute_dtype, softmax_flagging_nonfinite

__all__ = ["dot_product_attention"]

_FN = "dot_product_attention"
_HINT = (
    "Attention masks and biases are [batch..., heads, q_len, kv_len] (heads may be 1); "
    "build masks with dropmask.attention_mask, causal_mask or segment_mask."
)


def _check_qkv(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if not q.ndim == k.ndim == v.ndim or q.ndim < 3:
        raise DropmaskValueError(
            f"{_FN}: q, k, v must have the same rank >= 3 ([batch..., length, heads, "
            f"depth]), got shapes {q.shape}, {k.shape}, {v.shape}."
        )
    if not q.shape[:-3] == k.shape[:-3] == v.shape[:-3]:
        raise DropmaskValueError(
            f"{_FN}: q, k, v batch dims must match, got shapes {q.shape}, {k.shape}, {v.shape}."
        )
    if k.shape[-3] != v.shape[-3] or k.shape[-2] != v.shape[-2]:
        raise DropmaskValueError(
            f"{_FN}: k and v must have the same length and heads, got {k.shape} and {v.shape}."
        )
    if q.shape[-1] != k.shape[-1]:
        raise DropmaskValueError(
            f"{_FN}: q and k depths must match, got {q.shape[-1]} and {k.shape[-1]}."
        )
    if q.shape[-2] % k.shape[-2]:
        raise DropmaskValueError(
            f"{_FN}: query heads ({q.shape[-2]}) must be a multiple of key/value heads "
            f"({k.shape[-2]}) (grouped-query attention)."
        )


def _as_mask(mask: Any, logits_shape: tuple[int, ...]) -> jax.Array:
    """Bool mask of rank ``len(logits_shape)``; Flax 0/1 numeric masks are accepted."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        if not (jnp.issubdtype(mask.dtype, jnp.number)):
            raise DtypeError(f"{_FN}: mask must be boolean or numeric, got {mask.dtype}.")
        mask = mask != 0
    check_broadcastable(mask.shape, logits_shape, fn=_FN, name="mask", hint=_HINT)
    return mask.reshape((1,) * (len(logits_shape) - mask.ndim) + mask.shape)


def dot_product_attention(
    q: jax.typing.ArrayLike,
    k: jax.typing.ArrayLike,
    v: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
    bias: jax.typing.ArrayLike | None = None,
    dropout_rate: float = 0.0,
    key: Any = None,
    deterministic: bool = True,
    broadcast_dropout: bool = True,
    is_causal: bool = False,
    dropout_rng: Any = None,
    dtype: Any = None,
    precision: Any = None,
    module: Any = None,
    force_fp32_for_softmax: bool = False,
    qk_attn_weights_einsum: Callable[..., jax.Array] | None = None,
    attn_weights_value_einsum: Callable[..., jax.Array] | None = None,
    impl: Impl = DEFAULT_IMPL,
) -> jax.Array:
    """Scaled dot-product attention with boolean masks, bias and attention dropout.

    Plugs into ``flax.linen.MultiHeadDotProductAttention(attention_fn=...)`` and
    ``flax.nnx.MultiHeadAttention(attention_fn=...)``: it accepts the keywords they
    pass (``dropout_rng``, ``dtype``, ``precision``, ``module``, ``is_causal``, ...).

    Args:
      q: ``[batch..., q_len, heads, depth]``.
      k: ``[batch..., kv_len, kv_heads, depth]``; ``heads`` must be a multiple of
        ``kv_heads`` (grouped-query attention, as in ``nnx``).
      v: ``[batch..., kv_len, kv_heads, v_depth]``.
      mask: broadcastable to ``[batch..., heads, q_len, kv_len]``; True (or, as in
        Flax, nonzero) = may attend. A query row with no valid key outputs zeros.
      bias: additive, broadcastable to ``[batch..., heads, q_len, kv_len]``; a -inf
        bias acts as a mask, a finite one (e.g. ``finfo.min``) does not.
      dropout_rate: probability of dropping an attention weight.
      key: PRNG key for dropout (``dropout_rng`` is Flax's name for it).
      deterministic: if True, no dropout.
      broadcast_dropout: share the dropout mask across batch and head dims, as Flax.
      is_causal: also apply :func:`causal_mask` (``nnx``'s argument).
      dropout_rng: alias of ``key``; pass one or the other.
      dtype: computation dtype; default: promote ``q``, ``k``, ``v``.
      precision: passed to the einsums.
      module: a Linen or NNX module to sow the weights into (``attention_weights``).
      force_fp32_for_softmax: accepted for Flax; the softmax always runs in float32
        for 16-bit inputs.
      qk_attn_weights_einsum: Linen's optional ``'...qhd,...khd->...hqk'`` einsum.
      attn_weights_value_einsum: Linen's optional ``'...hqk,...khd->...qhd'`` einsum.
      impl: dropout mask generator, as in :func:`dropmask.dropout`; ``"flax"`` draws
        the same mask as Flax's attention for the same key (bit-identical weights).

    Returns:
      ``[batch..., q_len, heads, v_depth]`` in the computation dtype.

      Non-finite inputs: a query *taints* when its own ``q``, or a key or value it
      may attend to (mask True and bias not -inf), holds NaN or inf, or one of its
      allowed scores is NaN or +inf (a NaN bias, an overflow). A tainted query's
      output row is NaN, its ``q`` gets a NaN gradient and it passes none to
      ``k`` or ``v``. Every other output, and the gradient flowing through it to
      ``q``, ``k`` and ``v``, equals the result with the offending entries replaced
      by any finite number; non-finite entries get a zero gradient. The check is a
      reduction over the key axis of the scores; nothing of size
      ``[q_len, kv_len, depth]`` is built.

    Raises:
      ValueError: mismatched q/k/v shapes, both ``key`` and ``dropout_rng``, or
        custom einsums given without their partner or with ``precision``.
      MaskShapeError: ``mask`` or ``bias`` does not broadcast to the weights.
      RateError, MissingKeyError: as for :func:`dropmask.dropout`.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> q = k = v = jnp.ones((1, 2, 1, 4))
      >>> mask = jnp.array([[True, True], [False, False]])
      >>> dropmask.dot_product_attention(q, k, v, mask=mask)[0, :, 0, 0].tolist()
      [1.0, 0.0]
    """
    if (qk_attn_weights_einsum is None) != (attn_weights_value_einsum is None):
        raise DropmaskValueError(
            f"{_FN}: qk_attn_weights_einsum and attn_weights_value_einsum must be given together."
        )
    if qk_attn_weights_einsum is not None and precision is not None:
        raise DropmaskValueError(f"{_FN}: precision and custom einsums are mutually exclusive.")
    if key is not None and dropout_rng is not None:
        raise DropmaskValueError(f"{_FN}: pass the dropout key as key= or dropout_rng=, not both.")
    rng = key if key is not None else dropout_rng
    rate = check_rate(dropout_rate, fn=_FN, name="dropout_rate")
    check_impl(impl, fn=_FN)
    if not deterministic and rate != 0.0:
        check_key(rng, fn=_FN)

    q, k, v = as_array(q), as_array(k), as_array(v)
    dtype = jnp.result_type(q, k, v) if dtype is None else jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise DtypeError(
            f"{_FN}: q, k and v must be real, got dtype {dtype} (the softmax over scores "
            f"needs an order). Attend over real features, e.g. concatenate x.real and "
            f"x.imag on the depth axis."
        )
    check_floating(jnp.zeros((), dtype), fn=f"{_FN} (q, k, v)")
    _check_qkv(q, k, v)
    heads, kv_heads = q.shape[-2], k.shape[-2]
    groups = heads // kv_heads
    if groups > 1 and qk_attn_weights_einsum is not None:
        raise DropmaskValueError(f"{_FN}: custom einsums do not support grouped-query attention.")
    batch = q.shape[:-3]
    logits_shape = (*batch, heads, q.shape[-3], k.shape[-3])
    m = None if mask is None else _as_mask(mask, logits_shape)
    if bias is not None:
        check_broadcastable(jnp.shape(bias), logits_shape, fn=_FN, name="bias", hint=_HINT)
        if jnp.result_type(bias) == jnp.bool_:
            raise DtypeError(
                f"{_FN}: bias is added to the scores, so a boolean bias would add 1 where "
                f"True; got dtype bool. Pass a boolean array as mask= (True = attend)."
            )
    if is_causal:
        causal = causal_mask(q.shape[-3], k.shape[-3])
        m = causal if m is None else m & jnp.broadcast_to(causal, m.shape[:-2] + causal.shape)
        m = m.reshape((1,) * (len(logits_shape) - m.ndim) + m.shape)

    # Non-finite entries are zeroed before the einsums (whose backward multiplies by
    # every key and query, masked or not) and recorded per position instead.
    q, bad_q = _finite_part(q, dtype)
    k, bad_k = _finite_part(k, dtype)
    v, bad_v = _finite_part(v, dtype)

    weights_einsum = qk_attn_weights_einsum or functools.partial(jnp.einsum, precision=precision)
    values_einsum = attn_weights_value_einsum or functools.partial(jnp.einsum, precision=precision)
    q = q / jnp.sqrt(q.shape[-1]).astype(dtype)
    if groups > 1:
        qg = q.reshape(q.shape[:-2] + (kv_heads, groups, q.shape[-1]))
        logits = jnp.einsum("...qhgd,...khd->...hgqk", qg, k, precision=precision)
        logits = logits.reshape(logits_shape)
    else:
        logits = weights_einsum("...qhd,...khd->...hqk", q, k)

    acc = compute_dtype(dtype)
    logits = logits.astype(acc)
    allowed = m
    if bias is not None:
        bias_arr = jnp.asarray(bias, acc)
        bias_arr = bias_arr.reshape((1,) * (len(logits_shape) - bias_arr.ndim) + bias_arr.shape)
        logits = logits + bias_arr
        # A -inf bias is a mask: such a key is unseen, so its garbage must not count.
        not_neg_inf = bias_arr != -jnp.inf
        allowed = not_neg_inf if allowed is None else allowed & not_neg_inf
    valid = jnp.ones((1,) * len(logits_shape), bool) if allowed is None else allowed
    weights, tainted = softmax_flagging_nonfinite(
        logits,
        jnp.broadcast_to(valid, logits_shape),
        (len(logits_shape) - 1,),
        _taint(bad_q, bad_k | bad_v, groups),
    )
    weights = weights.astype(dtype)
    if module is not None:
        _sow(module, weights)
    if not deterministic and rate != 0.0:
        dims = tuple(range(weights.ndim - 2)) if broadcast_dropout else ()
        weights = dropout(weights, dropout_rate, rng, broadcast_dims=dims, impl=impl)

    if groups > 1:
        wg = weights.reshape(weights.shape[:-3] + (kv_heads, groups) + weights.shape[-2:])
        out = jnp.einsum("...hgqk,...khd->...qhgd", wg, v, precision=precision)
        out = out.reshape(out.shape[:-3] + (heads, out.shape[-1]))
    else:
        out = values_einsum("...hqk,...khd->...qhd", weights, v)
    return _poison(out, q, tainted)


def _finite_part(x: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``x`` in ``dtype`` with non-finite entries zeroed; ``bad: bool[*b, length, heads]``.

    Zeroed before the cast, so no op passes a NaN along (``jax_debug_nans``); a cast
    can overflow (float32 to float16), so its result is checked too.
    """
    finite = jnp.isfinite(x)
    out = jnp.where(finite, x, jnp.zeros((), x.dtype)).astype(dtype)
    if x.dtype != dtype:
        cast_finite = jnp.isfinite(out)
        out = jnp.where(cast_finite, out, jnp.zeros((), dtype))
        finite = finite & cast_finite
    return out, ~jnp.all(finite, axis=-1)


def _taint(bad_q: jax.Array, bad_kv: jax.Array, groups: int) -> jax.Array:
    """True on the row of a non-finite query and the column of a non-finite key/value.

    Broadcastable to the scores ``[*b, heads, q, k]`` without being that large. The
    softmax folds it into the sums it computes anyway and flags exactly the rows
    whose *allowed* part holds a non-finite input or score: no extra pass over
    ``[q, k]``, nothing of size ``[q, k, depth]``.
    """
    bad_q = jnp.swapaxes(bad_q, -1, -2)[..., None]  # [*b, heads, q, 1]
    bad_kv = jnp.swapaxes(bad_kv, -1, -2)  # [*b, kv_heads, k]
    if groups > 1:
        bad_kv = jnp.repeat(bad_kv, groups, axis=-2)
    return bad_q | bad_kv[..., None, :]  # [*b, heads, 1, k]


def _poison(out: jax.Array, q: jax.Array, tainted: jax.Array) -> jax.Array:
    """Writes NaN into tainted query rows, with a NaN gradient to their ``q`` only.

    Their attention rows were emptied, so the einsums above saw only finite inputs
    and every other query's value and gradient is exact. ``q * 0 / 0`` is NaN in
    value and derivative on tainted rows, and ``q * 0 / 1`` is 0 elsewhere, so a
    tainted query's gradient is NaN as in plain attention, and no NaN is built when
    there is none (``jax_debug_nans`` stays quiet). One entry of ``q``, not a sum
    over depth, which XLA would recompute for every output feature.
    """
    rows = jnp.swapaxes(tainted[..., 0], -1, -2)[..., None]  # [*b, q, heads, 1]
    zero = q[..., :1].astype(out.dtype) * jnp.zeros((), out.dtype)
    nan = zero / jnp.where(rows, jnp.zeros((), out.dtype), jnp.ones((), out.dtype))
    return jnp.where(rows, nan, out)


def _sow(module: Any, weights: jax.Array) -> None:
    from flax import nnx

    if isinstance(module, nnx.Module):
        module.sow(nnx.Intermediate, "attention_weights", weights)
    else:
        module.sow("intermediates", "attention_weights", weights)
