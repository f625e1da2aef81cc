"""``dot_product_attention``'s arguments checked, before any work: ``Checked``, one call's
arguments in their final form and its shapes, and the checks that build it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .._checks import (
    check_bool_mask,
    check_broadcastable,
    check_floating,
    check_impl,
    check_integer_dtype,
    check_key,
    check_lengths,
    check_one_key,
    check_rate,
    check_window,
)
from .._errors import (
    DropmaskValueError,
    DtypeError,
    call_name,
    user_error,
)
from .._masks import as_array, sequence_mask

__all__ = ["Checked", "validate", "window_span"]

_HINT = (
    "Attention masks and biases are [batch..., heads, q_len, kv_len] (heads may be 1); "
    "build masks with dropmask.attention_mask, causal_mask or segment_mask."
)
_PAD_HINT = "kv_lengths is [batch...]; kv_mask and segment ids are [batch..., length]."


def _check_qkv(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if not q.ndim == k.ndim == v.ndim or q.ndim < 3:
        raise user_error(
            DropmaskValueError,
            "q, k, v must have the same rank >= 3 ([batch..., length, heads, depth]), got "
            f"shapes {q.shape}, {k.shape}, {v.shape}",
            caller=call_name(),
        )
    if not q.shape[:-3] == k.shape[:-3] == v.shape[:-3]:
        raise user_error(
            DropmaskValueError,
            f"q, k, v batch dims must match, got shapes {q.shape}, {k.shape}, {v.shape}",
            caller=call_name(),
        )
    if k.shape[-3] != v.shape[-3] or k.shape[-2] != v.shape[-2]:
        raise user_error(
            DropmaskValueError,
            f"k and v must have the same length and heads, got {k.shape} and {v.shape}",
            caller=call_name(),
        )
    if q.shape[-1] != k.shape[-1]:
        raise user_error(
            DropmaskValueError,
            f"q and k depths must match, got {q.shape[-1]} and {k.shape[-1]}",
            caller=call_name(),
        )
    if q.shape[-2] % k.shape[-2]:
        raise user_error(
            DropmaskValueError,
            f"query heads ({q.shape[-2]}) must be a multiple of key/value heads ({k.shape[-2]}) "
            "(grouped-query attention)",
            caller=call_name(),
        )


def _as_mask(mask: Any, logits_shape: tuple[int, ...]) -> jax.Array:
    """Bool mask of rank ``len(logits_shape)``; Flax 0/1 numeric masks are accepted."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        if not (jnp.issubdtype(mask.dtype, jnp.number)):
            raise user_error(
                DtypeError,
                f"mask must be boolean or numeric, got {mask.dtype}",
                caller=call_name(),
            )
        mask = mask != 0
    check_broadcastable(mask.shape, logits_shape, caller=call_name(), name="mask", hint=_HINT)
    return mask.reshape((1,) * (len(logits_shape) - mask.ndim) + mask.shape)


@dataclasses.dataclass(frozen=True)
class Checked:
    """One call's checked arguments: arrays in their final form, and the shapes."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    dtype: Any
    rng: Any
    rate: Any
    drops: bool
    batch: tuple[int, ...]
    kv_heads: int
    groups: int
    q_len: int
    kv_len: int
    logits_shape: tuple[int, ...]
    mask: Any
    bias: Any
    span: tuple[int | None, int | None]
    kv_valid: Any
    q_seg: Any
    kv_seg: Any


def validate(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any,
    bias: Any,
    dropout_rate: Any,
    key: Any,
    dropout_rng: Any,
    deterministic: bool,
    is_causal: bool,
    window: Any,
    kv_lengths: Any,
    kv_mask: Any,
    q_segment_ids: Any,
    kv_segment_ids: Any,
    dtype: Any,
    precision: Any,
    einsums: tuple[Any, Any],
    impl: Any,
) -> Checked:
    """Every check of :func:`dot_product_attention`, in order, before any work."""
    rng, rate, drops = _check_options(
        einsums, precision, key, dropout_rng, dropout_rate, impl, deterministic
    )
    q, k, v = as_array(q), as_array(k), as_array(v)
    dtype = _check_dtype(q, k, v, dtype)
    _check_qkv(q, k, v)
    heads, kv_heads = q.shape[-2], k.shape[-2]
    groups = heads // kv_heads
    if groups > 1 and einsums[0] is not None:
        raise user_error(
            DropmaskValueError,
            "custom einsums do not support grouped-query attention",
            caller=call_name(),
        )
    batch = q.shape[:-3]
    q_len, kv_len = q.shape[-3], k.shape[-3]
    logits_shape = (*batch, heads, q_len, kv_len)
    m = None if mask is None else _as_mask(mask, logits_shape)
    if bias is not None:
        _check_bias(bias, logits_shape)
    span = window_span(window, is_causal)
    kv_valid = _kv_valid(kv_lengths, kv_mask, batch, kv_len)
    q_seg, kv_seg = _segments(q_segment_ids, kv_segment_ids, batch, q_len, kv_len)
    return Checked(
        q=q,
        k=k,
        v=v,
        dtype=dtype,
        rng=rng,
        rate=rate,
        drops=drops,
        batch=batch,
        kv_heads=kv_heads,
        groups=groups,
        q_len=q_len,
        kv_len=kv_len,
        logits_shape=logits_shape,
        mask=m,
        bias=bias,
        span=span,
        kv_valid=kv_valid,
        q_seg=q_seg,
        kv_seg=kv_seg,
    )


def _check_options(
    einsums: tuple[Any, Any],
    precision: Any,
    key: Any,
    dropout_rng: Any,
    dropout_rate: Any,
    impl: Any,
    deterministic: bool,
) -> tuple[Any, float | None, bool]:
    """The einsum, key, rate and ``impl`` checks; ``(key, rate, whether it drops)``."""
    qk_attn_weights_einsum, attn_weights_value_einsum = einsums
    if (qk_attn_weights_einsum is None) != (attn_weights_value_einsum is None):
        raise user_error(
            DropmaskValueError,
            "qk_attn_weights_einsum and attn_weights_value_einsum must be given together",
            caller=call_name(),
        )
    if qk_attn_weights_einsum is not None and precision is not None:
        raise user_error(
            DropmaskValueError,
            "precision and custom einsums are mutually exclusive",
            caller=call_name(),
        )
    rng = check_one_key(key, dropout_rng, caller=call_name())
    rate = check_rate(dropout_rate, caller=call_name())
    check_impl(impl, caller=call_name())
    drops = not deterministic and rate != 0.0
    if drops:
        check_key(rng, caller=call_name())
    return rng, rate, drops


def _check_dtype(q: jax.Array, k: jax.Array, v: jax.Array, dtype: Any) -> Any:
    """The computation dtype (``dtype`` or that of q, k and v); raises unless real floating."""
    dtype = jnp.result_type(q, k, v) if dtype is None else jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise user_error(
            DtypeError,
            f"q, k and v must be real, got dtype {dtype} (the softmax over scores needs an order)",
            "Attend over real features, e.g. concatenate x.real and x.imag on the depth axis.",
            caller=call_name(),
        )
    check_floating(jnp.zeros((), dtype), caller=f"{call_name()} (q, k, v)")
    return dtype


def _check_bias(bias: Any, logits_shape: tuple[int, ...]) -> None:
    """Raises unless ``bias`` broadcasts to the scores and is not boolean."""
    check_broadcastable(jnp.shape(bias), logits_shape, caller=call_name(), name="bias", hint=_HINT)
    if jnp.result_type(bias) == jnp.bool_:
        raise user_error(
            DtypeError,
            "bias is added to the scores, so a boolean bias would add 1 where True; got dtype bool",
            "Pass a boolean array as mask= (True = attend).",
            caller=call_name(),
        )


def window_span(window: Any, is_causal: bool) -> tuple[int | None, int | None]:
    """``(left, right)`` reach of a query (None = unbounded) from ``window`` and causality."""
    left = right = None
    if window is not None:
        left, right = check_window(
            window, caller=call_name(), fix=" Pass e.g. window=(128, 0) for causal local attention."
        )
    if is_causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def _kv_valid(lengths: Any, kv_mask: Any, batch: tuple[int, ...], kv_len: int) -> Any:
    """``bool`` broadcastable to ``[*batch, kv_len]`` from ``kv_lengths`` and ``kv_mask``."""
    valid = None
    if lengths is not None:
        arr = check_lengths(lengths, kv_len, caller=call_name(), name="kv_lengths")
        check_broadcastable(arr.shape, batch, caller=call_name(), name="kv_lengths", hint=_PAD_HINT)
        valid = sequence_mask(arr, kv_len)
    if kv_mask is not None:
        km = check_bool_mask(kv_mask, caller=call_name(), name="kv_mask")
        check_broadcastable(
            km.shape, (*batch, kv_len), caller=call_name(), name="kv_mask", hint=_PAD_HINT
        )
        valid = km if valid is None else valid & km
    return valid


def _segments(
    q_ids: Any, kv_ids: Any, batch: tuple[int, ...], q_len: int, kv_len: int
) -> tuple[Any, Any]:
    if q_ids is None and kv_ids is None:
        return None, None
    if q_ids is None:
        raise user_error(
            DropmaskValueError,
            "kv_segment_ids needs q_segment_ids (the queries' segments)",
            "Pass both.",
            caller=call_name(),
        )
    if kv_ids is None:
        if q_len != kv_len:
            raise user_error(
                DropmaskValueError,
                f"q_segment_ids alone serves keys only when q_len == kv_len, got {q_len} and "
                f"{kv_len}",
                "Pass kv_segment_ids too.",
                caller=call_name(),
            )
        kv_ids = q_ids
    q_ids, kv_ids = jnp.asarray(q_ids), jnp.asarray(kv_ids)
    for ids, name, length in ((q_ids, "q_segment_ids", q_len), (kv_ids, "kv_segment_ids", kv_len)):
        check_integer_dtype(ids, caller=call_name(), name=name)
        check_broadcastable(
            ids.shape, (*batch, length), caller=call_name(), name=name, hint=_PAD_HINT
        )
    return q_ids, kv_ids


# JAX's message when forward mode evaluates a custom_vjp's derivative.
