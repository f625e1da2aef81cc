"""DropBlock: contiguous blocks of a feature map dropped together (Ghiasi et al., 2018).

Dropping single units of a convolutional feature map removes little information: its
neighbours carry the same signal. DropBlock drops ``block_size``-wide cubes instead.
Seeds are drawn through the one mask entry point (``_random.draw``), only where a
whole block fits inside the map (the paper's border correction); each seed's block is
then spread by a max filter, and the kept units are rescaled by the fraction kept.

The seed probability ``gamma`` is solved so that the expected fraction of dropped
units is exactly ``rate``. The paper's closed form, ``rate / b**d * prod(S) /
prod(S - b + 1)``, is the first-order term of the same equation: it counts
overlapping blocks twice and so drops fewer units than asked (0.093 instead of 0.1,
and 0.243 instead of 0.3, for 7x7 blocks on a 14x14 map). Here every unit ``u`` is dropped with
probability ``1 - (1 - gamma)**n(u)``, where ``n(u)`` is the number of seed
positions whose block covers it, and the mean of that over the map is set equal to
``rate`` (a bisection: in Python for a Python rate, in the program for a JAX scalar).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._checks import (
    check_array,
    check_floating,
    check_key,
    check_ndim,
    check_rate,
)
from .._errors import (
    DropmaskTypeError,
    DropmaskValueError,
    RateError,
    call_name,
    named,
    rate_name,
    user_error,
)
from .._random import draw, flags_only, local_block, loop_zero, threshold
from .._reductions import fill_where

__all__ = ["drop_block"]

_BISECTION_STEPS = 60  # halves [0, 1] below float64's resolution


def _block_sizes(block_size: Any, spatial: tuple[int, ...], caller: str) -> tuple[int, ...]:
    sizes = block_size if isinstance(block_size, tuple | list) else (block_size,) * len(spatial)
    if any(isinstance(b, bool) or not isinstance(b, int | np.integer) for b in sizes):
        raise user_error(
            DropmaskTypeError,
            f"block_size must be an int or one int per spatial axis, got {block_size!r}",
            "Pass e.g. block_size=7 (the paper's size for ResNet-50).",
            caller=caller,
        )
    sizes = tuple(int(b) for b in sizes)
    if len(sizes) != len(spatial):
        raise user_error(
            DropmaskValueError,
            f"block_size must have one entry per spatial axis ({len(spatial)} for spatial shape "
            f"{spatial}), got {block_size!r}",
            caller=caller,
        )
    for b, s in zip(sizes, spatial, strict=True):
        if not 1 <= b <= s:
            raise user_error(
                DropmaskValueError,
                f"block_size must be in [1, spatial size] on every axis, got {sizes} for spatial "
                f"shape {spatial}",
                "Use a block no larger than the map (DropBlock needs room for at least one "
                "whole block).",
                caller=caller,
            )
    return sizes


def coverage(spatial: Sequence[int], sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(n, weight)``: the distinct seed counts ``n(u)`` covering a unit, and the fraction
    of the map's units with each count."""
    total = np.ones((), np.int64)
    for s, b in zip(spatial, sizes, strict=True):
        p = np.arange(s)
        per_axis = np.minimum(p, s - b) - np.maximum(0, p - b + 1) + 1
        total = np.multiply.outer(total, per_axis)
    values, counts = np.unique(total, return_counts=True)
    return values.astype(np.float64), counts / counts.sum()


def seed_probability(rate: Any, spatial: Sequence[int], sizes: Sequence[int]) -> Any:
    """``gamma``, the seed probability that drops a ``rate`` fraction of units in expectation.

    A Python float for a Python ``rate``; a float32 scalar for a JAX ``rate`` (NaN when
    outside ``[0, 1]``).
    """
    n, weight = coverage(spatial, sizes)
    if not isinstance(rate, jax.Array):
        lo, hi = 0.0, 1.0
        for _ in range(_BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            dropped = float(np.sum(weight * (1.0 - (1.0 - mid) ** n)))
            lo, hi = (mid, hi) if dropped < rate else (lo, mid)
        return 0.5 * (lo + hi)
    r = jnp.asarray(rate, jnp.float32)
    n32, w32 = jnp.asarray(n, jnp.float32), jnp.asarray(weight, jnp.float32)

    def halve(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        low = jnp.sum(w32 * (1.0 - (1.0 - mid) ** n32)) < r
        return jnp.where(low, mid, lo), jnp.where(low, hi, mid)

    # float32 stops halving after about 24 steps; more would change nothing.
    lo, hi = lax.fori_loop(0, 32, halve, (jnp.float32(0), jnp.float32(1)))
    return jnp.where((r >= 0) & (r <= 1), 0.5 * (lo + hi), jnp.nan)


def _check_seed_resolution(gamma: float, rate: float, sizes: tuple[int, ...], caller: str) -> None:
    """Refuses a static rate whose seed probability the generator would draw as 0 or 1."""
    realised = threshold(gamma).realised
    if realised not in (0.0, 1.0):
        return
    name = rate_name()
    fix = (
        f"Pass {name}=0 to drop nothing, or a larger {name} or a smaller block_size."
        if realised == 0.0
        else f"Pass {name}=1 to drop everything, or a smaller {name} or a larger block_size."
    )
    raise user_error(
        RateError,
        f"{name}={rate:.6g} with block_size {sizes} needs a seed probability (the chance that a "
        f"unit starts a block) of {gamma:.3g}, which rounds to {realised:g} (masks are drawn to "
        "2**-16)",
        fix,
        caller=caller,
    )


@named("drop_block")
def drop_block(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    block_size: int | Sequence[int],
    per_channel: bool = False,
    deterministic: bool = False,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
) -> jax.Array:
    """Drops contiguous blocks of a 1-D, 2-D or 3-D feature map, rescaling the rest.

    Args:
      x: ``[batch, *spatial, channels]`` floating (1 to 3 spatial axes), e.g.
        ``[batch, height, width, channels]`` as Flax's ``nn.Conv`` gives.
      rate: the expected fraction of units dropped, in ``[0, 1]`` (a Python float or a
        JAX scalar, e.g. from a schedule: one compilation for every value).
      key: PRNG key (needed in training mode).
      block_size: the block's width, an int or one per spatial axis; at most the
        spatial size.
      per_channel: False (the paper's default): one block pattern shared by all
        channels of an example; True: each channel draws its own blocks.
      deterministic: if True, return ``x``.
      global_shape: inside ``shard_map``: the global shape ``x`` is a block of, as in
        :func:`dropmask.dropout`; only the batch and channel axes may be split
        (blocks span the spatial axes).
      offset: the global index of ``x``'s first element, one per axis.

    Returns:
      An array like ``x``: dropped units 0, kept units scaled by ``count / kept`` per
      example and channel (the paper's normalisation; the whole map is zero when
      nothing is kept). A traced ``rate`` outside ``[0, 1]`` gives NaN.

    Raises:
      DtypeError: ``x`` is not floating point.
      DropmaskValueError: ``x`` is not 3-d to 5-d, or ``block_size`` is larger than
        the map or not one per spatial axis, or ``global_shape`` splits a spatial axis.
      RateError: a static ``rate`` so small for ``block_size`` that the seed
        probability rounds to 0 at the generator's resolution (``2**-16``), or so
        close to 1 that it rounds to 1.
      DropmaskError: the rate and key errors of :func:`dropmask.dropout`.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> y = dropmask.drop_block(jnp.ones((2, 8, 8, 3)), 0.2, jax.random.key(0), block_size=3)
      >>> y.shape, bool((y == y[..., :1]).all())  # shared across channels
      ((2, 8, 8, 3), True)
    """
    caller = call_name()
    x = check_array(x, caller=caller)
    check_floating(x, caller=caller)
    check_ndim(
        x.shape,
        caller=caller,
        name="x",
        layout="[batch, *spatial, channels] with 1 to 3 spatial axes (3-d to 5-d)",
        minimum=3,
        maximum=5,
        fix=" Add a channel axis with x[..., None].",
    )
    value = check_rate(rate, caller=caller)
    spatial = x.shape[1:-1]
    sizes = _block_sizes(block_size, spatial, caller)
    seed_shape = (*x.shape[:-1], x.shape[-1] if per_channel else 1)
    shared = () if per_channel else (x.ndim - 1,)
    block = local_block(x.shape, global_shape, offset, shared, caller=caller)
    if block is not None and block.global_shape[1:-1] != spatial:
        raise user_error(
            DropmaskValueError,
            f"global_shape {tuple(global_shape or ())} splits a spatial axis of the local shape "
            f"{x.shape}; blocks span the spatial axes, so split only the batch and channel axes",
            caller=caller,
        )
    if key is not None or (not deterministic and value not in (0.0, 1.0)):
        check_key(key, caller=caller)
    if deterministic or value == 0.0:
        return x
    if value == 1.0:
        return jnp.zeros_like(x)
    gamma = seed_probability(rate if isinstance(rate, jax.Array) else value, spatial, sizes)
    if value is not None:
        _check_seed_resolution(gamma, value, sizes, caller)
    seeds = draw(key, seed_shape, gamma, "fast", flags_only, block=block, caller=caller)
    # A seed is the block's first corner; only corners whose block fits are seeds. Each
    # axis's test is built on its own length, tied to the seeds (which vary with the
    # key), and broadcast: in a differentiated scan nothing of the seeds' size is
    # computed before the loop. Not to x: under a mesh of explicit axes x's 0 keeps x's
    # sharded axes (loop_zero), its channels among them, which shared seeds lack.
    tie = loop_zero(seeds)
    for axis, (s, b) in enumerate(zip(spatial, sizes, strict=True), start=1):
        along = tuple(s if a == axis else 1 for a in range(x.ndim))
        fits = lax.broadcast_in_dim(lax.iota(jnp.int32, s) <= s - b, along, (axis,))
        seeds = seeds & (fits | tie)
    seeds = seeds.astype(jnp.uint8)
    window = (1, *sizes, 1)
    padding = ((0, 0), *((b - 1, 0) for b in sizes), (0, 0))
    dropped = lax.reduce_window(seeds, np.uint8(0), lax.max, window, (1,) * x.ndim, padding)
    keep = dropped == 0
    spatial_axes = tuple(range(1, x.ndim - 1))
    kept = jnp.sum(keep, axis=spatial_axes, keepdims=True, dtype=jnp.float32)
    scale = jnp.where(kept > 0, math.prod(spatial) / jnp.maximum(kept, 1.0), 0.0)
    compute = jnp.promote_types(x.dtype, jnp.float32)
    out = fill_where(keep, x.astype(compute) * scale, 0)
    if value is None:  # NaN everywhere for an invalid run-time rate, by a scalar factor
        out = out * jnp.where(jnp.isnan(gamma), jnp.nan, 1.0).astype(compute)
    return out.astype(x.dtype)
