"""Building boolean masks, and converting from and to other mask conventions.

Every mask here is ``bool`` and **True means valid / keep**. Attention masks have
the Flax layout ``[batch..., heads, q_len, kv_len]`` (``heads`` is 1 when the mask
is shared by all heads). Other conventions enter and leave only through the
converters at the bottom of this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._checks import (
    check_bool_mask,
    check_broadcastable,
    check_int,
    check_integer_dtype,
    check_lengths,
    check_scalar,
    check_window,
)
from ._errors import DtypeError, MaskShapeError, user_error

__all__ = [
    "attention_mask",
    "causal_mask",
    "combine_masks",
    "from_bias",
    "from_flax_mask",
    "from_numpy_ma",
    "padding_mask",
    "segment_mask",
    "sequence_mask",
    "sliding_window_mask",
    "to_bias",
    "to_flax_mask",
    "to_numpy_ma",
]

# A bias at or below this value is read as "masked" by `from_bias`: it catches the
# common conventions (-1e4 in BERT, -1e9 / -1e10 in T5X, finfo.min in Flax, -inf)
# while a real positional bias (ALiBi, relative buckets) stays far above it.
DEFAULT_BIAS_THRESHOLD = -1e4


# ----------------------------------------------------------------- shared checks


def as_array(x: Any) -> jax.Array:
    """``jnp.asarray`` that leaves JAX arrays (and tracers) untouched.

    Converting a traced array is itself an op, and under ``jax_debug_nans`` an op
    that merely passes through a NaN held in a masked slot would raise.
    """
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def broadcast_mask(
    mask: Any, shape: Sequence[int], *, caller: str, name: str = "mask"
) -> jax.Array:
    """Validates ``mask`` (bool, broadcastable) and broadcasts it to ``shape``.

    ``mask=None`` means every element is valid.
    """
    shape = tuple(shape)
    if mask is None:
        return jnp.ones(shape, dtype=bool)
    mask = check_bool_mask(mask, caller=caller, name=name)
    check_broadcastable(mask.shape, shape, caller=caller, name=name)
    return jnp.broadcast_to(mask, shape)


def _broadcast_batch(
    *shapes: tuple[int, ...], caller: str, names: Sequence[str]
) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        got = ", ".join(f"{n}: {s}" for n, s in zip(names, shapes, strict=True))
        raise user_error(
            MaskShapeError,
            f"the leading (batch) dimensions do not broadcast together ({got})",
            caller=caller,
        ) from None


def widen_lengths(lengths: jax.Array, max_len: int) -> jax.Array:
    """``lengths`` as int32, clipped to ``[0, max_len]`` where the cast could wrap.

    Positions ``0 .. max_len - 1`` are compared with the lengths in int32: a counter
    in the lengths' own dtype would wrap (uint8 with ``max_len=300``). Clipping keeps
    what an out-of-range traced length means (negative: nothing valid; too long:
    everything valid) for dtypes wider than int32.
    """
    info = jnp.iinfo(lengths.dtype)
    wide = jnp.iinfo(jnp.int32)
    if info.min >= wide.min and info.max <= wide.max:
        return lengths.astype(jnp.int32)
    return jnp.clip(lengths, 0, max_len).astype(jnp.int32)


# ----------------------------------------------------------------- building masks


def sequence_mask(lengths: jax.typing.ArrayLike, max_len: int) -> jax.Array:
    """Marks the first ``lengths[...]`` steps of each padded sequence as valid.

    Args:
      lengths: integer ``[...]`` of any integer dtype (positions are compared in
        int32, so ``uint8`` lengths with ``max_len=300`` are exact); each value in
        ``[0, max_len]``. Concrete values are checked; traced values cannot raise,
        and one outside the range gives an all-False (negative) or all-True (too
        long) row.
      max_len: the padded length, a static Python int.

    Returns:
      ``bool[..., max_len]``, True at ``t < lengths[...]``.

    Raises:
      DtypeError: ``lengths`` is not an integer array.
      ValueError: a concrete length outside ``[0, max_len]``, or a negative ``max_len``.

    Example:
      >>> import dropmask
      >>> dropmask.sequence_mask([3, 0, 4], 4).astype(int).tolist()
      [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    """
    max_len = check_int(max_len, name="max_len", caller="sequence_mask", minimum=0, shape=True)
    lengths_arr = check_lengths(lengths, max_len, caller="sequence_mask")
    shape = lengths_arr.shape + (max_len,)
    steps = lax.broadcasted_iota(jnp.int32, shape, lengths_arr.ndim)
    return steps < widen_lengths(lengths_arr, max_len)[..., None]


def padding_mask(tokens: jax.typing.ArrayLike, pad_id: Any = 0) -> jax.Array:
    """Marks every element that is not the padding id as valid.

    Args:
      tokens: ``[...]`` token ids (or any values compared with ``pad_id``).
      pad_id: the padding value, a scalar.

    Returns:
      ``bool[...]``, True where ``tokens != pad_id``.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> dropmask.padding_mask(jnp.array([[1, 2, 0], [4, 0, 0]])).tolist()
      [[True, True, False], [True, False, False]]
    """
    check_scalar(pad_id, caller="padding_mask", name="pad_id")
    return jnp.asarray(tokens) != pad_id


def _check_offset(offset: Any, caller: str) -> int:
    return check_int(offset, caller=caller, name="offset")


def _relative_positions(q_len: int, kv_len: int | None, offset: int, caller: str) -> jax.Array:
    """``k - (q + offset)`` as an int32 ``[q_len, kv_len]`` grid."""
    q_len = check_int(q_len, name="q_len", caller=caller, minimum=0, shape=True)
    kv_len = (
        q_len
        if kv_len is None
        else check_int(kv_len, name="kv_len", caller=caller, minimum=0, shape=True)
    )
    offset = _check_offset(offset, caller)
    q = lax.broadcasted_iota(jnp.int32, (q_len, kv_len), 0)
    k = lax.broadcasted_iota(jnp.int32, (q_len, kv_len), 1)
    return k - (q + offset)


def causal_mask(q_len: int, kv_len: int | None = None, *, offset: int = 0) -> jax.Array:
    """Lets query ``i`` attend to keys ``j <= i + offset``.

    ``offset=0`` aligns the first query with the first key (``jnp.tril``, as in
    ``jax.nn.dot_product_attention(is_causal=True)`` and PyTorch). For ``q_len`` new
    queries at the end of a ``kv_len`` cache, pass ``offset=kv_len - q_len``.

    Args:
      q_len: number of queries (static int).
      kv_len: number of keys; defaults to ``q_len``.
      offset: position of query 0 among the keys.

    Returns:
      ``bool[q_len, kv_len]``; broadcasts against ``[batch..., heads, q, kv]``.

    Example:
      >>> import dropmask
      >>> dropmask.causal_mask(3).astype(int).tolist()
      [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    return _relative_positions(q_len, kv_len, offset, "causal_mask") <= 0


def sliding_window_mask(
    q_len: int, window: int | tuple[int, int], kv_len: int | None = None, *, offset: int = 0
) -> jax.Array:
    """Lets query ``i`` attend to keys ``j`` with ``-left <= j - (i + offset) <= right``.

    The window follows ``jax.nn.dot_product_attention(local_window_size=...)``: an
    int ``w`` means ``(w, w)``. For causal local attention (Mistral-style, the last
    ``w + 1`` tokens) pass ``window=(w, 0)``.

    Args:
      q_len: number of queries (static int).
      window: ``(left, right)`` non-negative ints, or one int for both.
      kv_len: number of keys; defaults to ``q_len``.
      offset: position of query 0 among the keys, as in :func:`causal_mask`.

    Returns:
      ``bool[q_len, kv_len]``.

    Example:
      >>> import dropmask
      >>> dropmask.sliding_window_mask(4, (1, 0)).astype(int).tolist()
      [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    caller = "sliding_window_mask"
    left, right = check_window(window, caller=caller)
    rel = _relative_positions(q_len, kv_len, offset, caller)
    return (rel >= -left) & (rel <= right)


def attention_mask(q_valid: jax.typing.ArrayLike, kv_valid: jax.typing.ArrayLike) -> jax.Array:
    """The pairwise mask of valid queries and valid keys (padding on both sides).

    Args:
      q_valid: ``bool[..., q_len]``, e.g. from :func:`padding_mask`.
      kv_valid: ``bool[..., kv_len]``; leading dims broadcast with ``q_valid``'s.

    Returns:
      ``bool[..., 1, q_len, kv_len]`` (the 1 broadcasts over heads), True where both
      the query and the key are valid: the mask ``flax.linen.make_attention_mask``
      builds, as booleans.

    Raises:
      DtypeError: an input is not boolean.
      MaskShapeError: the leading dims do not broadcast.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> valid = jnp.array([[True, True, False]])
      >>> dropmask.attention_mask(valid, valid).shape
      (1, 1, 3, 3)
    """
    caller = "attention_mask"
    q = check_bool_mask(q_valid, caller=caller, name="q_valid")
    k = check_bool_mask(kv_valid, caller=caller, name="kv_valid")
    return _pairwise(q, k, lambda a, b: a & b, caller, ("q_valid", "kv_valid"))


def _pairwise(q: jax.Array, k: jax.Array, op: Any, caller: str, names: Sequence[str]) -> jax.Array:
    if q.ndim == 0 or k.ndim == 0:
        raise user_error(
            MaskShapeError,
            f"{names[0]} and {names[1]} need a length axis, got shapes {q.shape} and {k.shape}",
            caller=caller,
        )
    batch = _broadcast_batch(q.shape[:-1], k.shape[:-1], caller=caller, names=names)
    q = jnp.broadcast_to(q, batch + q.shape[-1:])
    k = jnp.broadcast_to(k, batch + k.shape[-1:])
    return op(q[..., None, :, None], k[..., None, None, :])


def segment_mask(
    q_segment_ids: jax.typing.ArrayLike, kv_segment_ids: jax.typing.ArrayLike | None = None
) -> jax.Array:
    """Attention mask for packed sequences: attend only within the same segment.

    Segment ids follow t5x / MaxText: ``1, 2, ...`` number the sequences packed into
    a row and ``0`` marks padding, which attends to nothing and is never attended.

    Args:
      q_segment_ids: integer ``[..., q_len]``.
      kv_segment_ids: integer ``[..., kv_len]``; defaults to ``q_segment_ids``.

    Returns:
      ``bool[..., 1, q_len, kv_len]``. Combine with :func:`causal_mask` for packed
      decoder training.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> m = dropmask.segment_mask(jnp.array([1, 1, 2, 0]))
      >>> m[0].astype(int).tolist()
      [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    """
    caller = "segment_mask"
    q = jnp.asarray(q_segment_ids)
    k = q if kv_segment_ids is None else jnp.asarray(kv_segment_ids)
    check_integer_dtype(q, caller=caller, name="q_segment_ids")
    check_integer_dtype(k, caller=caller, name="kv_segment_ids")
    return _pairwise(
        q, k, lambda a, b: (a == b) & (a != 0), caller, ("q_segment_ids", "kv_segment_ids")
    )


def combine_masks(*masks: jax.typing.ArrayLike | None) -> jax.Array | None:
    """Logical AND of boolean masks with NumPy broadcasting; ``None`` entries are skipped.

    Args:
      *masks: boolean arrays whose shapes broadcast together, or None.

    Returns:
      The broadcast AND, or None when every mask is None.

    Raises:
      DtypeError: a mask is not boolean.
      MaskShapeError: the shapes do not broadcast together.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> pad = dropmask.attention_mask(jnp.array([[True, True, False]]),
      ...                               jnp.array([[True, True, False]]))
      >>> dropmask.combine_masks(pad, None, dropmask.causal_mask(3))[0, 0].astype(int).tolist()
      [[1, 0, 0], [1, 1, 0], [0, 0, 0]]
    """
    arrays = [
        check_bool_mask(m, caller="combine_masks", name=f"masks[{i}]")
        for i, m in enumerate(masks)
        if m is not None
    ]
    if not arrays:
        return None
    shape = _broadcast_batch(
        *(a.shape for a in arrays),
        caller="combine_masks",
        names=[f"masks[{i}]" for i, m in enumerate(masks) if m is not None],
    )
    out = jnp.broadcast_to(arrays[0], shape)
    for a in arrays[1:]:
        out = out & jnp.broadcast_to(a, shape)
    return out


# ----------------------------------------------------------------- converters


def from_flax_mask(mask: jax.typing.ArrayLike) -> jax.Array:
    """A Flax-style numeric mask (1 = attend, 0 = masked, any dtype) as a bool mask.

    ``flax.linen.make_attention_mask`` returns float32 masks; Flax treats every
    nonzero value as "attend", and so does this converter.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> dropmask.from_flax_mask(jnp.array([1.0, 0.0])).tolist()
      [True, False]
    """
    mask = jnp.asarray(mask)
    if mask.dtype == jnp.bool_:
        return mask
    return mask != 0


def to_flax_mask(mask: jax.typing.ArrayLike, dtype: Any = jnp.float32) -> jax.Array:
    """A bool mask as Flax's numeric convention: 1 where valid, 0 where masked.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> dropmask.to_flax_mask(jnp.array([True, False])).tolist()
      [1.0, 0.0]
    """
    return check_bool_mask(mask, caller="to_flax_mask").astype(dtype)


def to_bias(
    mask: jax.typing.ArrayLike, dtype: Any = jnp.float32, *, big_neg: float | None = None
) -> jax.Array:
    """A bool mask as an additive attention bias: 0 where valid, ``big_neg`` where masked.

    Args:
      mask: ``bool[...]``.
      dtype: a floating dtype for the bias.
      big_neg: the value at masked positions; defaults to half of
        ``jnp.finfo(dtype).min`` so that two such biases can be added without
        overflowing to ``-inf``.

    Returns:
      ``dtype[...]``. Note that an additive bias cannot express an *empty* row: a row
      that is all ``big_neg`` softmaxes to a uniform average. Keep masks as masks
      when rows can be empty.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> dropmask.to_bias(jnp.array([True, False]), big_neg=-1e9).tolist()
      [0.0, -1000000000.0]
    """
    mask = check_bool_mask(mask, caller="to_bias")
    if not jnp.issubdtype(dtype, jnp.floating):
        raise user_error(
            DtypeError,
            f"dtype must be floating, got {jnp.dtype(dtype)}",
            caller="to_bias",
        )
    if big_neg is None:
        big_neg = float(jnp.finfo(dtype).min) / 2
    return jnp.where(mask, jnp.zeros((), dtype), jnp.asarray(big_neg, dtype))


def from_bias(
    bias: jax.typing.ArrayLike, *, threshold: float = DEFAULT_BIAS_THRESHOLD
) -> jax.Array:
    """An additive attention bias as a bool mask: valid where ``bias > threshold``.

    Args:
      bias: floating ``[...]``; masked positions hold a large negative value or -inf.
      threshold: values at or below it count as masked (default -1e4, which catches
        BERT's -1e4, T5X's -1e10, Flax's ``finfo.min`` and -inf). NaN counts as masked.

    Returns:
      ``bool[...]``.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> dropmask.from_bias(jnp.array([0.0, -3.0, -1e9, -jnp.inf])).tolist()
      [True, True, False, False]
    """
    bias = jnp.asarray(bias)
    if not jnp.issubdtype(bias.dtype, jnp.floating):
        raise user_error(
            DtypeError,
            f"bias must be floating, got dtype {bias.dtype}",
            caller="from_bias",
        )
    return bias > threshold


def to_numpy_ma(x: jax.typing.ArrayLike, mask: jax.typing.ArrayLike) -> np.ma.MaskedArray:
    """Data and a bool mask as a ``numpy.ma.MaskedArray`` (whose mask is True = invalid).

    Args:
      x: ``[...]`` data.
      mask: ``bool``, broadcastable to ``x``; True = valid.

    Returns:
      A host-side masked array with ``mask = ~mask``.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> m = dropmask.to_numpy_ma(jnp.array([1.0, 2.0, 9.0]), jnp.array([True, True, False]))
      >>> float(m.mean())
      1.5
    """
    data = np.asarray(x)
    valid = np.asarray(broadcast_mask(mask, data.shape, caller="to_numpy_ma"))
    return np.ma.MaskedArray(data, mask=~valid)


def from_numpy_ma(marr: Any) -> tuple[jax.Array, jax.Array]:
    """A ``numpy.ma`` array as ``(data, mask)`` with mask True = valid.

    The data under masked entries is passed through unchanged; dropmask's masked
    functions ignore it whatever it holds.

    Example:
      >>> import numpy as np, dropmask
      >>> data, mask = dropmask.from_numpy_ma(np.ma.masked_invalid([1.0, np.nan]))
      >>> mask.tolist()
      [True, False]
    """
    data = np.ma.getdata(marr)
    invalid = np.ma.getmaskarray(marr)
    return jnp.asarray(data), jnp.asarray(~invalid)
