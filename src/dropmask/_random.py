"""How keep-masks are drawn from a JAX key: the one place for all RNG logic.

Two generators live here:

* ``"fast"`` (the default): a counter-based generator. Element ``i`` of a mask (its
  row-major index in the mask's shape) gets the first word of Philox-2x32-10
  (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
  Random123 default round count) applied to the counter ``(i, k1)`` under key ``k0``,
  where ``(k0, k1) = jax.random.bits(key, (2,), uint32)``. Because element ``i``
  depends only on ``(key, i)``, the mask is the same under ``jit`` or not, under
  ``vmap`` over keys, and for any sharding of the array, with no communication. The
  top ``b`` bits (``b`` in 8, 16, 32: the fewest that represent the rate to a relative
  error of 1e-3, or 24 for a traced rate) are compared with an integer threshold, and
  kept values are scaled by the exact keep probability that threshold realises.
* ``"flax"``: ``jax.random.bernoulli(key, keep_prob, shape)``, exactly what
  ``flax.linen.Dropout`` and ``flax.nnx.Dropout`` draw, so outputs match Flax bit for
  bit for the same key.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from ._errors import check_key, check_rate, normalize_axes

__all__ = ["Impl", "keep_mask", "random_bits"]

Impl = Literal["fast", "flax"]
IMPLS: tuple[str, ...] = ("fast", "flax")
DEFAULT_IMPL: Impl = "fast"

# Philox-2x32 constants (Random123): the round multiplier and the Weyl key increment.
_PHILOX_M = 0xD256D193
_PHILOX_W = 0x9E3779B9
_PHILOX_ROUNDS = 10
_U32 = jnp.uint32
# A static rate is represented with the fewest bits whose threshold is within this
# relative error of both the rate and the keep probability.
_RATE_REL_TOL = 1e-3
_TRACED_BITS = 24  # thresholds up to 2**24 are exact in float32


def _mulhilo(a: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """(high, low) 32-bit words of ``a * m`` using only 32-bit integer ops."""
    m_lo, m_hi = m & 0xFFFF, m >> 16
    a_lo, a_hi = a & _U32(0xFFFF), a >> _U32(16)
    ll, lh = a_lo * _U32(m_lo), a_lo * _U32(m_hi)
    hl, hh = a_hi * _U32(m_lo), a_hi * _U32(m_hi)
    mid = (ll >> _U32(16)) + (lh & _U32(0xFFFF)) + (hl & _U32(0xFFFF))
    hi = hh + (lh >> _U32(16)) + (hl >> _U32(16)) + (mid >> _U32(16))
    return hi, a * _U32(m)


def philox2x32(c0: jax.Array, c1: jax.Array, k0: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Philox-2x32-10 of counter ``(c0, c1)`` under key ``k0``: two uint32 words."""
    for r in range(_PHILOX_ROUNDS):
        if r:
            k0 = k0 + _U32(_PHILOX_W)
        hi, lo = _mulhilo(c0, _PHILOX_M)
        c0, c1 = hi ^ k0 ^ c1, lo
    return c0, c1


def key_words(key: Any) -> jax.Array:
    """Two uint32 words derived from a key of any impl (threefry, rbg, raw uint32)."""
    return jax.random.bits(key, (2,), _U32)


@dataclasses.dataclass(frozen=True)
class Block:
    """Where a local array sits in a global one: for masks drawn inside ``shard_map``.

    Attributes:
      global_shape: the shape of the whole (unsharded) mask.
      offset: the global index of the local block's first element, one entry per
        axis (ints or traced scalars such as ``lax.axis_index('x') * local_size``).
    """

    global_shape: tuple[int, ...]
    offset: tuple[Any, ...]


def local_block(
    shape: tuple[int, ...],
    global_shape: Sequence[int] | None,
    offset: Sequence[Any] | None,
    broadcast_dims: Sequence[int] = (),
) -> Block | None:
    """Validates ``global_shape`` / ``offset`` against a local ``shape``; None if unset."""
    if global_shape is None and offset is None:
        return None
    if global_shape is None or offset is None:
        raise ValueError(
            "global_shape and offset go together (the local block's place in the global "
            f"array), got global_shape={global_shape!r}, offset={offset!r}."
        )
    global_shape = tuple(int(d) for d in global_shape)
    offset = tuple(offset)
    if len(global_shape) != len(shape) or len(offset) != len(shape):
        raise ValueError(
            f"global_shape and offset need one entry per axis of the local shape {shape}, "
            f"got global_shape={global_shape} and {len(offset)} offsets."
        )
    if any(g < d for g, d in zip(global_shape, shape, strict=True)):
        raise ValueError(f"global_shape {global_shape} is smaller than the local shape {shape}.")
    axes = normalize_axes(broadcast_dims, len(shape), name="broadcast_dims")
    return Block(
        tuple(1 if i in axes else d for i, d in enumerate(global_shape)),
        tuple(0 if i in axes else o for i, o in enumerate(offset)),
    )


def _flat_index(shape: tuple[int, ...], block: Block | None = None) -> jax.Array:
    """uint32 row-major index of every element of ``shape`` (within ``block``'s global
    array when given), built from iotas so that any sharding computes it locally."""
    global_shape = shape if block is None else block.global_shape
    size = 1
    for d in global_shape:
        size *= d
    if size >= 2**32:
        raise ValueError(
            f"impl='fast' indexes mask elements with 32 bits, but the mask has {size} "
            f">= 2**32 elements (shape {global_shape}). Split the array, share the mask "
            f"along an axis with broadcast_dims, or use impl='flax'."
        )
    index = jnp.zeros(shape, _U32)
    stride = 1
    for axis in reversed(range(len(shape))):
        if global_shape[axis] > 1:
            position = lax.broadcasted_iota(_U32, shape, axis)
            if block is not None:
                position = position + jnp.asarray(block.offset[axis]).astype(_U32)
            index = index + position * _U32(stride)
        stride *= global_shape[axis]
    return index


def bits_from_words(
    words: jax.Array, shape: tuple[int, ...], block: Block | None = None
) -> jax.Array:
    """uint32 bits for every element of ``shape`` from ``key_words(key)``."""
    return philox2x32(_flat_index(shape, block), words[1], words[0])[0]


def random_bits(key: Any, shape: Sequence[int]) -> jax.Array:
    """The fast generator's raw stream: ``uint32[*shape]``, element i depends on (key, i).

    Example:
      >>> import jax, dropmask._random as r
      >>> k = jax.random.key(0)
      >>> bool((r.random_bits(k, (4, 8))[1] == r.random_bits(k, (32,))[8:16]).all())
      True
    """
    return _jitted_bits(key, tuple(int(d) for d in shape), None, None)


# Jitted so that eager calls compile once per shape instead of dispatching ~100 ops.
@functools.partial(jax.jit, static_argnums=(1, 2))
def _jitted_bits(
    key: Any,
    shape: tuple[int, ...],
    global_shape: tuple[int, ...] | None,
    offset: tuple[Any, ...] | None,
) -> jax.Array:
    block = None if global_shape is None or offset is None else Block(global_shape, offset)
    return bits_from_words(key_words(key), shape, block)


@dataclasses.dataclass(frozen=True)
class Threshold:
    """``mask = (bits >> shift) < value``; True with probability ``realised``."""

    shift: int
    value: Any  # int, or a traced uint32 scalar
    realised: Any  # float, or a traced float32 scalar


def threshold(p: Any) -> Threshold:
    """The integer threshold for "True with probability p", static or traced ``p``."""
    if isinstance(p, int | float):
        for nbits in (8, 16, 32):
            scale = 2**nbits
            value = min(round(p * scale), scale - 1) if p < 1 else scale
            realised = value / scale
            err = abs(realised - p)
            if nbits == 32 or err <= _RATE_REL_TOL * min(p, 1 - p):
                return Threshold(32 - nbits, value, realised)
    p = jnp.asarray(p, jnp.float32)
    scale = float(2**_TRACED_BITS)
    value = jnp.round(jnp.clip(p, 0.0, 1.0) * scale)
    # A traced probability cannot be validated at trace time; outside [0, 1] (or NaN)
    # it yields realised = NaN, which callers turn into NaN outputs, never a clip.
    realised = jnp.where((p >= 0) & (p <= 1), value / scale, jnp.nan)
    return Threshold(32 - _TRACED_BITS, value.astype(_U32), realised)


def compare(bits: jax.Array, thr: Threshold) -> jax.Array:
    """Boolean mask from raw bits and a threshold (integer compare, no floats)."""
    if isinstance(thr.value, int) and thr.value >= 2 ** (32 - thr.shift):
        return jnp.ones(bits.shape, bool)
    shifted = bits >> _U32(thr.shift) if thr.shift else bits
    return shifted < jnp.asarray(thr.value, _U32)


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}.")


def mask_shape(shape: Sequence[int], broadcast_dims: Sequence[int]) -> tuple[int, ...]:
    """The shape a mask is drawn at: ``shape`` with every broadcast dim set to 1."""
    axes = normalize_axes(broadcast_dims, len(shape), name="broadcast_dims")
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def draw_keep(
    key: Any, shape: tuple[int, ...], keep_prob: Any, impl: str, block: Block | None = None
) -> tuple[jax.Array, Any]:
    """Draws a boolean keep-mask of ``shape``.

    Returns:
      ``(mask, realised_keep_prob)``: ``mask[i]`` is True with probability
      ``realised_keep_prob``, the number dropout must divide kept values by for an
      unbiased output (equal to ``keep_prob`` for ``impl="flax"``).
    """
    check_impl(impl)
    if impl == "flax":
        if block is not None:
            raise ValueError(
                "global_shape/offset need impl='fast'; impl='flax' masks are not blockwise."
            )
        return jax.random.bernoulli(key, p=keep_prob, shape=shape), keep_prob
    thr = threshold(keep_prob)
    global_shape, offset = (None, None) if block is None else (block.global_shape, block.offset)
    return compare(_jitted_bits(key, shape, global_shape, offset), thr), thr.realised


def keep_mask(
    key: Any,
    shape: Sequence[int],
    rate: float | jax.Array,
    *,
    broadcast_dims: Sequence[int] = (),
    impl: Impl = DEFAULT_IMPL,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
) -> jax.Array:
    """The boolean keep-mask that :func:`dropmask.dropout` applies for this key.

    Args:
      key: a JAX PRNG key (``jax.random.key`` or a raw ``uint32[2]`` key).
      shape: the shape of the array to be masked.
      rate: probability of dropping an element, in ``[0, 1]``.
      broadcast_dims: axes along which one mask value is shared.
      impl: the generator: ``"fast"`` (counter-based, sharding-invariant) or
        ``"flax"`` (matches ``flax.linen.Dropout`` bit for bit).
      global_shape: inside ``shard_map``, the shape of the whole array ``shape`` is a
        block of; with ``offset`` (the block's first global index per axis) the local
        mask equals the matching block of the global one (``impl="fast"`` only).
      offset: see ``global_shape``.

    Returns:
      ``bool[*shape]``, True where the element is kept.

    Example:
      >>> import jax, dropmask
      >>> m = dropmask.keep_mask(jax.random.key(0), (2, 3), 0.5, broadcast_dims=(0,))
      >>> bool((m[0] == m[1]).all())
      True
    """
    shape = tuple(int(d) for d in shape)
    static_rate = check_rate(rate)
    check_impl(impl)
    bshape = mask_shape(shape, broadcast_dims)
    block = local_block(shape, global_shape, offset, broadcast_dims)
    if static_rate == 0.0:
        return jnp.ones(shape, dtype=bool)
    if static_rate == 1.0:
        return jnp.zeros(shape, dtype=bool)
    check_key(key, fn="keep_mask")
    keep_prob = 1.0 - rate
    mask, _ = draw_keep(key, bshape, keep_prob, impl, block)
    return jnp.broadcast_to(mask, shape)
