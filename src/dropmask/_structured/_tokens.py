"""Token dropping: train on a random subset of each example's tokens (PatchDropout, Liu
et al., 2022; the token-dropping speed-ups of long-input pre-training).

The output is shorter than the input, so the work of every later layer shrinks with
it. Which tokens stay is a uniformly random subset of each example's valid tokens:
every token gets a 32-bit random score, a word of the generator's raw stream at the
token's position (so the choice is the same eagerly, under ``jit``, ``vmap`` and any
sharding of the batch), and the lowest-scoring valid tokens are kept, in their
original order. Padding is never kept.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .._checks import (
    check_array,
    check_bool_mask,
    check_key,
    check_ndim,
    check_rate,
    check_shape_is,
)
from .._errors import DropmaskTypeError, user_error
from .._random import random_bits

__all__ = ["TokenSubset", "drop_tokens"]


class TokenSubset(NamedTuple):
    """What :func:`drop_tokens` keeps, padded to one static length ``kept``.

    Attributes:
      tokens: ``[batch, kept, ...]``: the kept tokens in their original order; zeros
        in the padding slots.
      positions: ``int32[batch, kept]``: each kept token's index in the input's time
        axis (for position embeddings, or ``jnp.take_along_axis`` on other per-token
        arrays such as segment ids); 0 in the padding slots.
      mask: ``bool[batch, kept]``: True for a kept token, False for padding.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> x = jnp.array([[10, 11, 12, 13, 14, 15]])
      >>> tokens, positions, mask = dropmask.drop_tokens(x, 0.5, jax.random.key(0))
      >>> bool((tokens == x[0, positions]).all()), mask.tolist()  # each token from its position
      (True, [[True, True, True]])
    """

    tokens: jax.Array
    positions: jax.Array
    mask: jax.Array


def kept_length(rate: float, length: int) -> int:
    """``ceil((1 - rate) * length)``, without float noise pushing an exact product up."""
    return min(length, math.ceil((1.0 - rate) * length - 1e-9))


def drop_tokens(
    x: jax.typing.ArrayLike,
    rate: float,
    key: Any = None,
    *,
    mask: jax.typing.ArrayLike | None = None,
    deterministic: bool = False,
) -> TokenSubset:
    """Keeps a random ``1 - rate`` of each example's valid tokens, gathered to the front.

    Example ``b`` with ``n_b`` valid tokens keeps ``ceil((1 - rate) * n_b)`` of them,
    each subset of that size equally likely; the output length is
    ``ceil((1 - rate) * time)``, the most any example keeps. The layout is the same at
    every rate, 0 and ``deterministic=True`` included: the kept tokens first, in their
    original order, then padding, so code after it (a first-token readout, the mask)
    sees in evaluation what it saw in training. Without ``mask`` that is the input
    itself at rate 0.

    Args:
      x: ``[batch, time, ...]`` of any dtype: token ids, embeddings or patches.
      rate: the fraction of tokens to drop, a Python float in ``[0, 1)``; it fixes the
        output's length, so it cannot be a traced value.
      key: PRNG key (needed in training mode).
      mask: ``bool[batch, time]``, True for a valid token (as
        :func:`dropmask.sequence_mask` or ``segment_ids > 0`` of
        :func:`dropmask.pack_sequences` give); None: every token is valid.
      deterministic: if True, keep every valid token (output length ``time``), gathered
        to the front as at any rate.

    Returns:
      A :class:`TokenSubset` ``(tokens, positions, mask)``.

    Raises:
      DropmaskTypeError: ``rate`` is a traced value, or ``x`` is not an array.
      DropmaskValueError: ``x`` has fewer than 2 axes.
      MaskShapeError: ``mask`` is not ``[batch, time]``.
      DtypeError: ``mask`` is not boolean.
      DropmaskError: the rate and key errors of :func:`dropmask.dropout` (``rate`` must be below 1).

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> x = jnp.arange(1, 9).reshape(2, 4)
      >>> kept = dropmask.drop_tokens(x, 0.5, jax.random.key(0),
      ...                             mask=jnp.array([[1, 1, 1, 1], [1, 1, 0, 0]]) > 0)
      >>> kept.tokens.shape, kept.mask.sum(axis=1).tolist()
      ((2, 2), [2, 1])
    """
    caller = "drop_tokens"
    arr = check_array(x, caller=caller)
    check_ndim(
        arr.shape,
        caller=caller,
        name="x",
        layout="[batch, time, ...] (at least 2-d)",
        minimum=2,
        fix=" Add a batch axis with x[None].",
    )
    batch, time = arr.shape[:2]
    if mask is None:
        valid = jnp.ones((batch, time), bool)
    else:
        valid = check_bool_mask(mask, caller=caller)
        check_shape_is(
            valid.shape,
            (batch, time),
            caller=caller,
            name="mask",
            layout="[batch, time]",
            fix=" One flag per token of x: build it with dropmask.sequence_mask or "
            "segment_ids > 0.",
        )
    value = check_rate(rate, caller=caller, allow_one=False)
    if value is None:
        raise user_error(
            DropmaskTypeError,
            "rate must be a Python float (it fixes the output length), got a traced "
            f"{type(rate).__name__}",
            "Pass the rate as a constant; each distinct rate compiles its own program.",
            caller=caller,
        )
    if deterministic or value == 0.0:
        if mask is None:  # every token valid and kept: already at the front, in order
            return TokenSubset(arr, lax.broadcasted_iota(jnp.int32, (batch, time), 1), valid)
        # Every valid token, gathered to the front as at any other rate.
        counts = jnp.sum(valid, axis=1, dtype=jnp.int32)
        return _gathered(arr, valid, jnp.zeros((batch, time), jnp.uint32), time, counts)
    check_key(key, caller=caller)
    kept = kept_length(value, time)
    counts = jnp.sum(valid, axis=1, dtype=jnp.float32)
    keep_counts = jnp.ceil(counts * (1.0 - value) - 1e-6).astype(jnp.int32)
    keep_counts = jnp.minimum(keep_counts, kept)  # float rounding only: n_b <= time
    return _gathered(arr, valid, random_bits(key, (batch, time)), kept, keep_counts)


def _gathered(
    arr: jax.Array, valid: jax.Array, scores: jax.Array, kept: int, keep_counts: jax.Array
) -> TokenSubset:
    """Example ``b``'s ``keep_counts[b]`` lowest-scoring valid tokens, in their original
    order, in the first of ``kept`` slots; padding (zeros, position 0) after them."""
    time = arr.shape[1]
    # Valid tokens first, in score order; padding after, never chosen before a valid token.
    order = jnp.argsort(jnp.where(valid, scores >> 1, jnp.uint32(2**31)), axis=1, stable=True)
    slot = lax.broadcasted_iota(jnp.int32, (arr.shape[0], kept), 1)
    chosen = slot < keep_counts[:, None]
    picked = jnp.sort(jnp.where(chosen, order[:, :kept].astype(jnp.int32), time), axis=1)
    new_mask = picked < time
    picked = jnp.where(new_mask, picked, 0)
    index = picked.reshape(picked.shape + (1,) * (arr.ndim - 2))
    tokens = jnp.take_along_axis(arr, index, axis=1)
    expand = new_mask.reshape(new_mask.shape + (1,) * (arr.ndim - 2))
    tokens = jnp.where(expand, tokens, jnp.zeros((), arr.dtype))
    return TokenSubset(tokens, picked, new_mask)
