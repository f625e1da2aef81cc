"""The dense attention path: ``[q, k]`` weights with the NaN-safe softmax, then dropout."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from .._dropout import dropout, scale_and_fill
from .._errors import call_name, unnamed
from .._masks import segment_mask, sliding_window_mask
from .._random import Impl, draw, explicit_split, kept, mask_shape, probability
from .._reductions import compute_dtype
from ._dense_dropped import dropped_attention
from ._dense_weights import attention_weights
from ._nonfinite import poison, prepared, taint

__all__ = ["Dense", "dense", "dense_jit", "rank"]


@dataclasses.dataclass(frozen=True)
class Dense:
    """Everything static about one dense attention call (hashable: it keys the jit cache)."""

    dtype: Any
    kv_heads: int
    groups: int
    precision: Any
    logits_shape: tuple[int, ...]
    span: tuple[int | None, int | None]
    broadcast_dropout: bool
    drops: bool
    impl: Impl
    rate: float | None  # None: a run-time rate, passed as an array


def dense(
    spec: Dense,
    extras: tuple[Any, tuple[Any, Any]] | None,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    m: Any,
    kv_valid: Any,
    q_seg: Any,
    kv_seg: Any,
    bias: Any,
    rng: Any,
    run_time_rate: Any,
) -> jax.Array:
    """The dense path: ``[q, k]`` weights with the NaN-safe softmax, then dropout.

    ``extras`` is ``(module, (qk einsum, weights-value einsum))`` when the call sows its
    weights or brings its own einsums, None otherwise.
    """
    module, (qk_attn_weights_einsum, attn_weights_value_einsum) = extras or (None, (None, None))
    dtype, kv_heads, groups, precision = spec.dtype, spec.kv_heads, spec.groups, spec.precision
    logits_shape, drops, impl = spec.logits_shape, spec.drops, spec.impl
    dropout_rate: Any = spec.rate if run_time_rate is None else run_time_rate
    q, k, v, bad_q, bad_k, bad_v = prepared(q, k, v, dtype)
    m = _dense_structure(m, logits_shape, spec.span, kv_valid, q_seg, kv_seg)
    custom = qk_attn_weights_einsum is not None
    if custom:
        # The user's einsums: their own dropmask calls name themselves.
        score = functools.partial(unnamed(qk_attn_weights_einsum), "...qhd,...khd->...hqk")
    else:
        score = functools.partial(
            _heads_major_scores, kv_heads, groups, precision, compute_dtype(dtype)
        )
    acc = compute_dtype(dtype)
    allowed = m
    bias_arr = None
    if bias is not None:
        bias_arr = rank(jnp.asarray(bias, acc), len(logits_shape))
        # A -inf bias is a mask: such a key is unseen, so its garbage must not count.
        not_neg_inf = bias_arr != -jnp.inf
        allowed = not_neg_inf if allowed is None else allowed & not_neg_inf
    bad_rows, bad_cols = taint(bad_q, bad_k | bad_v, groups)
    structure = (allowed, bad_rows, bad_cols)
    dims = tuple(range(len(logits_shape) - 2)) if spec.broadcast_dropout else ()
    if attn_weights_value_einsum is None:
        product = functools.partial(_heads_major_values, kv_heads, groups, precision)
    else:
        product = functools.partial(unnamed(attn_weights_value_einsum), "...hqk,...khd->...qhd")
    if drops and impl == "fast":
        if module is not None:
            _sow(module, attention_weights(score, q, k, bias_arr, *structure, dtype)[0])
        p = probability(dropout_rate, spec.rate, keep=True, caller=call_name())
        shape = mask_shape(logits_shape, dims)
        beside = _mask_type(score, q, k, shape)
        mask = draw(rng, shape, p, "fast", kept, beside, caller=call_name())
        # The kept weights' 1/keep goes onto v, [*b, kv_len, kv_heads, depth], not onto
        # the weights: the gradient's matching multiply then also lands on a small array.
        # An invalid run-time rate's NaN scale reaches every output through v.
        scale, _ = scale_and_fill(mask.realised, acc)
        v = (v.astype(scale.dtype) * scale).astype(v.dtype)
        return dropped_attention(score, product, dtype, q, k, bias_arr, v, mask, structure)
    weights, tainted = attention_weights(score, q, k, bias_arr, *structure, dtype)
    if module is not None:
        _sow(module, weights)
    if drops:
        weights = dropout(weights, dropout_rate, rng, broadcast_dims=dims, impl=impl)
    return poison(product(weights, v), q, tainted)


dense_jit = jax.jit(dense, static_argnums=(0, 1))


def _mask_type(score: Any, q: jax.Array, k: jax.Array, shape: tuple[int, ...]) -> Any:
    """What the weights' mask is drawn beside: ``q``, or under a mesh of explicit axes the
    mask's own type, sharded as the weights (read from ``score``'s abstract evaluation)
    on the axes it does not broadcast, so that the TPU kernels draw each device's block
    of it (``_random._draw``)."""
    if explicit_split(q) is None:
        return q
    weights = jax.eval_shape(score, q, k)
    sharding = weights.sharding
    entries = tuple(sharding.spec) + (None,) * (len(shape) - len(tuple(sharding.spec)))
    spec = [part if size > 1 else None for part, size in zip(entries, shape, strict=True)]
    partition = jax.sharding.PartitionSpec(*spec)
    return jax.ShapeDtypeStruct(shape, jnp.int8, sharding=sharding.update(spec=partition))


def rank(x: jax.Array, ndim: int) -> jax.Array:
    return x.reshape((1,) * (ndim - x.ndim) + x.shape)


def _dense_structure(
    m: Any,
    logits_shape: tuple[int, ...],
    span: tuple[int | None, int | None],
    kv_valid: Any,
    q_seg: Any,
    kv_seg: Any,
) -> Any:
    """The dense mask: ``m`` and the structure arguments, built with the mask helpers."""
    q_len, kv_len = logits_shape[-2:]
    ndim = len(logits_shape)
    parts = [m]
    left, right = span
    if left is not None or right is not None:
        reach = (
            q_len + kv_len if left is None else left,
            q_len + kv_len if right is None else right,
        )
        parts.append(sliding_window_mask(q_len, reach, kv_len))
    if kv_valid is not None:
        parts.append(kv_valid[..., None, None, :])
    if q_seg is not None:
        parts.append(segment_mask(q_seg, kv_seg))
    out = None
    for part in parts:
        if part is None:
            continue
        part = rank(part, ndim)
        out = part if out is None else out & part
    return out


def _heads_major_scores(
    kv_heads: int, groups: int, precision: Any, accumulate: Any, q: jax.Array, k: jax.Array
) -> jax.Array:
    """``q . k`` as ``[*b, heads, q_len, kv_len]`` in ``accumulate``, computed heads-major.

    The scores come out in ``accumulate`` (float32 for 16-bit inputs), as the
    blockwise and Pallas paths accumulate them: a float16 score beyond 65504 is a
    finite float32 number on every path, not an overflow on this one only.

    ``q`` and ``k`` (``[*b, length, heads, depth]``) are transposed to ``[*b, kv_heads,
    groups * q_len, depth]`` and ``[*b, kv_heads, depth, kv_len]`` first, so the product
    is a plain batched matrix product whose output is already in the weights' layout.
    Written as an einsum from the ``[*b, length, heads, depth]`` layout, XLA's CPU
    backend chose transposed layouts for the attention products and their gradients,
    and one of them ran several times slower (see ``docs/dropout_speed.md``).
    """
    q_len, depth = q.shape[-3], q.shape[-1]
    qg = q.reshape(q.shape[:-2] + (kv_heads, groups, depth))
    qg = jnp.moveaxis(qg, -4, -2)  # [*b, kv_heads, groups, q_len, depth]
    qg = qg.reshape(qg.shape[:-3] + (groups * q_len, depth))
    k_t = jnp.moveaxis(k, -3, -1)  # [*b, kv_heads, depth, kv_len]
    logits = jnp.einsum(
        "...mn,...np->...mp", qg, k_t, precision=precision, preferred_element_type=accumulate
    )
    if groups == 1:
        return logits
    # Split, then merge: a reshape that does one of them keeps the heads' split under a
    # mesh of explicit axes (JAX infers it); one that does both is refused.
    logits = logits.reshape(logits.shape[:-2] + (groups, q_len, logits.shape[-1]))
    return logits.reshape(logits.shape[:-4] + (kv_heads * groups, q_len, logits.shape[-1]))


def _heads_major_values(
    kv_heads: int, groups: int, precision: Any, weights: jax.Array, v: jax.Array
) -> jax.Array:
    """``weights @ v`` as ``[*b, q_len, heads, v_depth]``, heads-major as the scores."""
    q_len, kv_len = weights.shape[-2:]
    wg = weights  # one group: already [*b, kv_heads, q_len, kv_len]
    if groups > 1:  # split, then merge (as in _heads_major_scores)
        wg = wg.reshape(wg.shape[:-3] + (kv_heads, groups, q_len, kv_len))
        wg = wg.reshape(wg.shape[:-4] + (kv_heads, groups * q_len, kv_len))
    vb = jnp.swapaxes(v, -2, -3)  # [*b, kv_heads, kv_len, v_depth]
    out = jnp.einsum("...mn,...np->...mp", wg, vb, precision=precision)
    out = out.reshape(out.shape[:-2] + (groups, q_len, out.shape[-1]))
    out = jnp.moveaxis(out, -2, -4)  # [*b, q_len, kv_heads, groups, v_depth]
    return out.reshape(out.shape[:-3] + (kv_heads * groups, out.shape[-1]))


def _sow(module: Any, weights: jax.Array) -> None:
    from flax import nnx

    if isinstance(module, nnx.Module):
        module.sow(nnx.Intermediate, "attention_weights", weights)
    else:
        module.sow("intermediates", "attention_weights", weights)
