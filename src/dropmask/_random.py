"""How keep-masks are drawn from a JAX key: the one place for all RNG logic.

Two generators live here:

* ``"flax"``: ``jax.random.bernoulli(key, keep_prob, shape)``, exactly what
  ``flax.linen.Dropout`` and ``flax.nnx.Dropout`` draw, so outputs match Flax bit for
  bit for the same key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

from ._errors import check_key, check_rate, normalize_axes

__all__ = ["Impl", "keep_mask"]

Impl = Literal["flax"]
IMPLS: tuple[str, ...] = ("flax",)
DEFAULT_IMPL: Impl = "flax"


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}.")


def mask_shape(shape: Sequence[int], broadcast_dims: Sequence[int]) -> tuple[int, ...]:
    """The shape a mask is drawn at: ``shape`` with every broadcast dim set to 1."""
    axes = normalize_axes(broadcast_dims, len(shape), name="broadcast_dims")
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def draw_keep(key: Any, shape: tuple[int, ...], keep_prob: Any, impl: str) -> tuple[jax.Array, Any]:
    """Draws a boolean keep-mask of ``shape``.

    Returns:
      ``(mask, realised_keep_prob)``: ``mask[i]`` is True with probability
      ``realised_keep_prob``, the number dropout must divide kept values by for an
      unbiased output (equal to ``keep_prob`` for ``impl="flax"``).
    """
    check_impl(impl)
    return jax.random.bernoulli(key, p=keep_prob, shape=shape), keep_prob


def keep_mask(
    key: Any,
    shape: Sequence[int],
    rate: float | jax.Array,
    *,
    broadcast_dims: Sequence[int] = (),
    impl: Impl = DEFAULT_IMPL,
) -> jax.Array:
    """The boolean keep-mask that :func:`dropmask.dropout` applies for this key.

    Args:
      key: a JAX PRNG key (``jax.random.key`` or a raw ``uint32[2]`` key).
      shape: the shape of the array to be masked.
      rate: probability of dropping an element, in ``[0, 1]``.
      broadcast_dims: axes along which one mask value is shared.
      impl: the generator; ``"flax"`` matches ``flax.linen.Dropout`` bit for bit.

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
    if static_rate == 0.0:
        return jnp.ones(shape, dtype=bool)
    if static_rate == 1.0:
        return jnp.zeros(shape, dtype=bool)
    check_key(key, fn="keep_mask")
    keep_prob = 1.0 - rate
    mask, _ = draw_keep(key, bshape, keep_prob, impl)
    return jnp.broadcast_to(mask, shape)
