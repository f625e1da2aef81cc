"""Scans over padded sequences: masked_scan and flip_sequences.

Layout. :func:`masked_scan` has exactly ``lax.scan``'s layout, time leading:
``xs: [time, ...]`` and ``mask: [time]`` for one sequence. Flax-layout batches
(``x: [batch, time, features]``, ``mask: [batch, time]``) are handled by ``jax.vmap``
over the batch axis, or, for a cell written for batches, by a time-major scan with
``mask: [time, batch]`` (every carry and output leaf then starts with ``batch``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from ._errors import MaskShapeError
from ._masks import as_array, check_bool_mask, check_lengths, widen_lengths

__all__ = ["flip_sequences", "masked_scan"]

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


def _leaf_mask(m: jax.Array, leaf: jax.Array, what: str) -> jax.Array:
    """Reshapes the step mask ``[*batch]`` to broadcast against ``leaf: [*batch, ...]``."""
    if tuple(leaf.shape[: m.ndim]) != tuple(m.shape):
        raise MaskShapeError(
            f"masked_scan: mask[t] has shape {m.shape}, so every {what} leaf must start "
            f"with those batch dims, got a leaf of shape {leaf.shape}."
        )
    return m.reshape(m.shape + (1,) * (leaf.ndim - m.ndim))


def _check_leading(tree: Any, shape: tuple[int, ...], what: str, fix: str) -> None:
    for leaf in jax.tree.leaves(tree):
        lshape = tuple(jnp.shape(leaf))
        if lshape[: len(shape)] != shape:
            raise MaskShapeError(
                f"masked_scan: every {what} leaf must start with {shape}, got a leaf of "
                f"shape {lshape}. {fix}"
            )


def masked_scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X,
    mask: jax.typing.ArrayLike,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> tuple[Carry, Y]:
    """``lax.scan`` that skips invalid steps: the carry is held and the output is 0.

    At a step where ``mask`` is False, ``f`` still runs (the scan stays branch-free)
    but on ``xs`` leaves replaced by zeros, and its results are discarded: the carry
    passes through unchanged and every output leaf is 0. So padding never reaches
    the carry, NaN or inf in padded ``xs`` never reach values or gradients (the
    gradient to padded ``xs`` is exactly 0), and a sequence with no valid step
    returns ``init``. With right padding, the result equals ``lax.scan`` on the
    sequence cut to its length, with zeros appended to the outputs.

    ``reverse=True`` scans from the last step to the first; as held steps change
    nothing, each sequence's valid part runs backwards starting from its last valid
    step, and outputs stay aligned with their inputs (Flax's ``keep_order=True``).

    Args:
      f: ``(carry, x_t) -> (carry, y_t)``, as for ``lax.scan``.
      init: initial carry (a pytree).
      xs: pytree of arrays ``[time, ...]`` (or None).
      mask: ``bool[time]`` for one sequence, or ``bool[time, *batch]`` for a
        time-major batch; then every ``xs`` leaf is ``[time, *batch, ...]`` and every
        carry and output leaf ``[*batch, ...]``.
      reverse: scan from the end.
      unroll: passed to ``lax.scan``.

    Returns:
      ``(final_carry, ys)``: ``ys`` leaves are ``[time, ...]`` and 0 at invalid steps.

    Raises:
      DtypeError: ``mask`` is not boolean.
      MaskShapeError: leaves whose leading dims do not match ``mask``.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> step = lambda c, x: (c + x, c + x)
      >>> xs, mask = jnp.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]), jnp.array(
      ...     [[True, True, False], [True, False, False]])
      >>> carry, ys = jax.vmap(lambda x, m: dropmask.masked_scan(step, 0.0, x, m))(xs, mask)
      >>> carry.tolist(), ys.tolist()
      ([3.0, 3.0], [[1.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    """
    mask = check_bool_mask(mask, fn="masked_scan")
    if mask.ndim == 0:
        raise MaskShapeError(
            "masked_scan: mask needs a leading time axis, got a scalar. Pass bool[time] "
            "(or bool[time, *batch])."
        )
    steps, batch = int(mask.shape[0]), tuple(mask.shape[1:])
    _check_leading(xs, (steps, *batch), "xs", "Time must lead, as in lax.scan.")
    _check_leading(init, batch, "init (carry)", "With a batched mask the carry is [*batch, ...].")

    def body(carry: Any, inputs: Any) -> tuple[Any, Any]:
        x_t, m_t = inputs
        safe_x = jax.tree.map(
            lambda a: jnp.where(_leaf_mask(m_t, a, "xs"), a, jnp.zeros((), a.dtype)), x_t
        )
        new_carry, y_t = f(carry, safe_x)
        held = jax.tree.map(
            lambda new, old: jnp.where(_leaf_mask(m_t, new, "carry"), new, old),
            new_carry,
            carry,
        )
        zeroed = jax.tree.map(
            lambda a: jnp.where(_leaf_mask(m_t, a, "output"), a, jnp.zeros((), a.dtype)), y_t
        )
        return held, zeroed

    return lax.scan(body, init, (xs, mask), reverse=reverse, unroll=unroll)


def flip_sequences(
    x: jax.typing.ArrayLike, lengths: jax.typing.ArrayLike, *, time_major: bool = False
) -> jax.Array:
    """Reverses each sequence's valid prefix; padding stays where it is.

    ``flip_sequences(flip_sequences(x, n), n) == x``. Useful to run a backward RNN
    over right-padded data with any scan, as Flax's ``nn.RNN(reverse=True)`` does.

    Args:
      x: ``[*batch, time, ...]`` (or ``[time, *batch, ...]`` with ``time_major``).
      lengths: integer ``[*batch]`` of any integer dtype, each in ``[0, time]``
        (checked when concrete; a traced length below 0 flips nothing, one above
        ``time`` flips the whole row).
      time_major: whether time is the leading axis.

    Returns:
      An array like ``x`` with ``out[..., t, ...] = x[..., lengths - 1 - t, ...]`` for
      ``t < lengths`` and ``x`` elsewhere.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.array([[1, 2, 3, 0], [4, 5, 0, 0]])
      >>> dropmask.flip_sequences(x, jnp.array([3, 2])).tolist()
      [[3, 2, 1, 0], [5, 4, 0, 0]]
    """
    x = as_array(x)
    lengths_shape = tuple(jnp.shape(lengths))
    nb = len(lengths_shape)
    time_axis = 0 if time_major else nb
    batch = x.shape[1 : 1 + nb] if time_major else x.shape[:nb]
    if x.ndim <= nb or tuple(batch) != lengths_shape:
        layout = "[time, *batch, ...]" if time_major else "[*batch, time, ...]"
        raise MaskShapeError(
            f"flip_sequences: x must be {layout} with batch = lengths.shape = "
            f"{lengths_shape}, got x of shape {x.shape}."
        )
    steps = x.shape[time_axis]
    lengths_arr = check_lengths(lengths, steps, fn="flip_sequences")
    if time_major:
        x = jnp.moveaxis(x, 0, nb)
    t = lax.broadcasted_iota(jnp.int32, lengths_shape + (steps,), nb)
    # Clipped so that a traced out-of-range length cannot index past the row.
    n = jnp.clip(widen_lengths(lengths_arr, steps), 0, steps)[..., None]
    source = jnp.where(t < n, n - 1 - t, t)
    source = source.reshape(source.shape + (1,) * (x.ndim - nb - 1))
    out = jnp.take_along_axis(x, jnp.broadcast_to(source, x.shape), axis=nb)
    return jnp.moveaxis(out, nb, 0) if time_major else out
