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
import numpy as np
from jax import lax

from ._checks import check_bool_mask, check_lengths
from ._errors import MaskShapeError, user_error
from ._masks import as_array, widen_lengths

__all__ = ["flip_sequences", "masked_scan"]

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


def _leaf_mask(m: jax.Array, leaf: jax.Array, what: str) -> jax.Array:
    """Reshapes the step mask ``[*batch]`` to broadcast against ``leaf: [*batch, ...]``."""
    if tuple(leaf.shape[: m.ndim]) != tuple(m.shape):
        raise user_error(
            MaskShapeError,
            f"mask[t] has shape {m.shape}, so every {what} leaf must start with those batch "
            f"dims, got a leaf of shape {leaf.shape}",
            caller="masked_scan",
        )
    return m.reshape(m.shape + (1,) * (leaf.ndim - m.ndim))


def _check_leading(tree: Any, shape: tuple[int, ...], what: str, fix: str) -> None:
    for leaf in jax.tree.leaves(tree):
        lshape = tuple(jnp.shape(leaf))
        if lshape[: len(shape)] != shape:
            raise user_error(
                MaskShapeError,
                f"every {what} leaf must start with {shape}, got a leaf of shape {lshape}",
                fix,
                caller="masked_scan",
            )


def masked_scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X,
    mask: jax.typing.ArrayLike,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
    fill_input: Any = 0,
) -> tuple[Carry, Y]:
    """``lax.scan`` that skips invalid steps: the carry is held and the output is 0.

    At a step where ``mask`` is False, ``f`` still runs (the scan stays branch-free)
    but its results are discarded: the carry passes through unchanged and every
    output leaf is 0. So padding never reaches the carry, NaN or inf in padded ``xs``
    never reach values or gradients (the gradient to padded ``xs`` is exactly 0), and
    a sequence with no valid step returns ``init``. With right padding, the result
    equals ``lax.scan`` on the sequence cut to its length, with zeros appended to the
    outputs, in values and in gradients.

    What ``f`` sees at an invalid step: the carry and input of the most recent valid
    step (before the first valid step, the first valid step's own carry and input).
    A discarded step still enters the backward pass as ``0 * df``, so it must run
    where ``f`` is finite with finite derivatives; replaying a valid step guarantees
    that for any ``f`` whose valid steps are finite (``log(x)`` with padded ``x = 0``
    stays NaN-free). A sequence with no valid step runs ``f(init, fill_input)``.

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
      fill_input: the input ``f`` sees in a sequence with no valid step: a scalar
        (broadcast to every ``xs`` leaf) or a pytree like one step of ``xs``. Pick
        a value where ``f`` is smooth (e.g. 1 for ``log``) to keep the gradient to
        ``init`` and to ``f``'s parameters finite for empty sequences.

    Returns:
      ``(final_carry, ys)``: ``ys`` leaves are ``[time, ...]`` and 0 at invalid steps.

    Raises:
      DtypeError: ``mask`` is not boolean.
      MaskShapeError: leaves whose leading dims do not match ``mask``, or a
        ``fill_input`` that does not broadcast to one step of ``xs``.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> step = lambda c, x: (c + x, c + x)
      >>> xs, mask = jnp.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]), jnp.array(
      ...     [[True, True, False], [True, False, False]])
      >>> carry, ys = jax.vmap(lambda x, m: dropmask.masked_scan(step, 0.0, x, m))(xs, mask)
      >>> carry.tolist(), ys.tolist()
      ([3.0, 3.0], [[1.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    """
    if isinstance(mask, list | tuple):  # a nested list of bools, read as an array
        mask = np.asarray(mask)
    mask = check_bool_mask(mask, caller="masked_scan")
    if mask.ndim == 0:
        raise user_error(
            MaskShapeError,
            "mask needs a leading time axis, got a scalar",
            "Pass bool[time] (or bool[time, *batch]).",
            caller="masked_scan",
        )
    steps, batch = int(mask.shape[0]), tuple(mask.shape[1:])
    _check_leading(xs, (steps, *batch), "xs", "Time must lead, as in lax.scan.")
    _check_leading(init, batch, "init (carry)", "With a batched mask the carry is [*batch, ...].")
    first = _first_valid_input(xs, mask, reverse, fill_input)

    def body(state: Any, inputs: Any) -> tuple[Any, Any]:
        carry, (last_carry, last_x) = state
        x_t, m_t = inputs

        def pick(valid: Any, held: Any, what: str) -> Any:
            return jax.tree.map(lambda a, b: jnp.where(_leaf_mask(m_t, a, what), a, b), valid, held)

        # Clean inputs are selected, never computed from the padded ones, so garbage
        # there reaches neither the values nor (through `where`) the gradients.
        step_carry, step_x = pick(carry, last_carry, "carry"), pick(x_t, last_x, "xs")
        new_carry, y_t = f(step_carry, step_x)
        held = pick(new_carry, carry, "carry")
        zeroed = jax.tree.map(
            lambda a: jnp.where(_leaf_mask(m_t, a, "output"), a, jnp.zeros((), a.dtype)), y_t
        )
        return (held, (step_carry, step_x)), zeroed

    (carry, _), ys = lax.scan(
        body, (init, (init, first)), (xs, mask), reverse=reverse, unroll=unroll
    )
    return carry, ys


def _first_valid_input(xs: Any, mask: jax.Array, reverse: bool, fill_input: Any) -> Any:
    """One step of ``xs`` per sequence: its first valid step in scan order, else the fill."""
    leaves, treedef = jax.tree.flatten(xs)
    fills = jax.tree.leaves(fill_input)
    if len(fills) == 1 and jnp.ndim(fills[0]) == 0:
        fills = fills * len(leaves)
    if len(fills) != len(leaves):
        raise user_error(
            MaskShapeError,
            f"fill_input must be a scalar or a pytree like one step of xs, got {len(fills)} "
            f"leaves for {len(leaves)} xs leaves",
            caller="masked_scan",
        )
    steps = mask.shape[0]
    if steps:
        index = jnp.argmax(mask[::-1] if reverse else mask, axis=0)  # first True, or 0
        index = steps - 1 - index if reverse else index
    else:  # nothing to pick from; the fill only sets the state's shape
        index = jnp.zeros(mask.shape[1:], jnp.int32)
    any_valid = jnp.any(mask, axis=0)
    out = []
    for leaf, fill in zip(leaves, fills, strict=True):
        leaf = as_array(leaf)
        step_shape = leaf.shape[1:]
        fill = jnp.asarray(fill, leaf.dtype)
        if fill.ndim > len(step_shape) or fill.shape != step_shape[len(step_shape) - fill.ndim :]:
            raise user_error(
                MaskShapeError,
                f"fill_input leaf of shape {fill.shape} does not broadcast to one step of xs, "
                f"{step_shape}",
                "Pass a scalar or an array of that shape.",
                caller="masked_scan",
            )
        fill = jnp.broadcast_to(
            fill.reshape((1,) * (len(step_shape) - fill.ndim) + fill.shape), step_shape
        )
        extra = (1,) * (leaf.ndim - mask.ndim)
        if not steps:
            out.append(fill)
            continue
        picked = jnp.take_along_axis(leaf, index.reshape((1, *index.shape, *extra)), axis=0)[0]
        out.append(jnp.where(any_valid.reshape(any_valid.shape + extra), picked, fill))
    return jax.tree.unflatten(treedef, out)


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
        raise user_error(
            MaskShapeError,
            f"x must be {layout} with batch = lengths.shape = {lengths_shape}, got x of shape "
            f"{x.shape}",
            caller="flip_sequences",
        )
    steps = x.shape[time_axis]
    lengths_arr = check_lengths(lengths, steps, caller="flip_sequences")
    if time_major:
        x = jnp.moveaxis(x, 0, nb)
    t = lax.broadcasted_iota(jnp.int32, lengths_shape + (steps,), nb)
    # Clipped so that a traced out-of-range length cannot index past the row.
    n = jnp.clip(widen_lengths(lengths_arr, steps), 0, steps)[..., None]
    source = jnp.where(t < n, n - 1 - t, t)
    source = source.reshape(source.shape + (1,) * (x.ndim - nb - 1))
    out = jnp.take_along_axis(x, jnp.broadcast_to(source, x.shape), axis=nb)
    return jnp.moveaxis(out, nb, 0) if time_major else out
