"""How keep-masks are drawn from a JAX key: the one entry point for all mask RNG.

Two generators:

* ``"fast"`` (the default): counter-based, on Threefry-4x32-20 (``_threefry``), cut
  into bit-packed words (``_fast_mask``). An element depends only on the key and its
  global position, so the mask is the same under ``jit`` or not, under ``vmap`` over
  keys and for any sharding; kept values are scaled by the keep probability that the
  integer threshold realises.
* ``"flax"``: ``jax.random.bernoulli(key, keep_prob, shape)``, exactly what
  ``flax.linen.Dropout`` and ``flax.nnx.Dropout`` draw, so outputs match Flax bit for
  bit for the same key.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

from ._errors import check_key, check_rate, normalize_axes
from ._fast_mask import Block, Threshold, keep_from_words, key_words, local_block, threshold

__all__ = ["Impl", "keep_mask"]

Impl = Literal["fast", "flax"]
IMPLS: tuple[str, ...] = ("fast", "flax")
DEFAULT_IMPL: Impl = "fast"
_U32 = jnp.uint32


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
    value = jnp.asarray(thr.value, _U32)
    return _jitted_keep(key, shape, thr.nbits, thr.shift, global_shape, value, offset), thr.realised


# Jitted so that eager calls compile once per shape instead of dispatching op by op.
@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _jitted_keep(
    key: Any,
    shape: tuple[int, ...],
    nbits: int,
    shift: int,
    global_shape: tuple[int, ...] | None,
    value: jax.Array,
    offset: tuple[Any, ...] | None,
) -> jax.Array:
    block = None if global_shape is None or offset is None else Block(global_shape, offset)
    return keep_from_words(key_words(key), shape, Threshold(nbits, shift, value, None), block)


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
