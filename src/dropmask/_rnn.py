"""The functional core of the masked recurrent modules: one cell over a padded batch.

``dropmask.linen.MaskedRNN`` and ``dropmask.nnx.MaskedRNN`` only turn their cell into
a pure step function and call :func:`masked_rnn`; the masking itself is
:func:`dropmask.masked_scan`'s, the reversal of valid prefixes
:func:`dropmask.flip_sequences`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ._checks import check_bool_mask
from ._errors import DropmaskValueError, MaskShapeError
from ._masks import as_array, sequence_mask
from ._scan import flip_sequences, masked_scan

__all__ = ["masked_rnn", "resolve_mask"]

# (carry, x_t, t) -> (carry, y_t); ``t`` is the int32 scalar index of the time step.
StepFn = Callable[[Any, Any, jax.Array], tuple[Any, Any]]


def resolve_mask(
    inputs: Any, mask: Any, lengths: Any, *, fn: str
) -> tuple[jax.Array, jax.Array, int, int]:
    """``(mask: bool[batch, time], lengths: int32[batch], batch, time)`` from either form.

    Exactly one of ``mask`` and ``lengths`` may be given; with neither, every step of
    every sequence is valid.
    """
    leaves = jax.tree.leaves(inputs)
    if not leaves or any(jnp.ndim(leaf) < 2 for leaf in leaves):
        shapes = [tuple(jnp.shape(leaf)) for leaf in leaves]
        raise MaskShapeError(
            f"{fn}: inputs must be [batch, time, ...] (every leaf), got shapes {shapes}. "
            "Add a batch axis, e.g. x[None]."
        )
    batch, steps = (int(d) for d in jnp.shape(leaves[0])[:2])
    for leaf in leaves:
        if tuple(jnp.shape(leaf)[:2]) != (batch, steps):
            raise MaskShapeError(
                f"{fn}: every inputs leaf must start with [batch, time] = {(batch, steps)}, "
                f"got a leaf of shape {jnp.shape(leaf)}."
            )
    if mask is not None and lengths is not None:
        raise DropmaskValueError(
            f"{fn}: pass mask or lengths, not both (got both). lengths=n is the same as "
            "mask=dropmask.sequence_mask(n, time)."
        )
    if lengths is not None:
        if tuple(jnp.shape(lengths)) != (batch,):
            raise MaskShapeError(
                f"{fn}: lengths must be [batch] = {(batch,)}, got shape {jnp.shape(lengths)}."
            )
        mask_arr = sequence_mask(lengths, steps)
        return mask_arr, jnp.sum(mask_arr, axis=-1, dtype=jnp.int32), batch, steps
    if mask is None:
        return jnp.ones((batch, steps), bool), jnp.full((batch,), steps, jnp.int32), batch, steps
    mask_arr = check_bool_mask(mask, fn=fn)
    if tuple(mask_arr.shape) != (batch, steps):
        raise MaskShapeError(
            f"{fn}: mask must be bool[batch, time] = {(batch, steps)}, got shape "
            f"{mask_arr.shape}. Build one from lengths with dropmask.sequence_mask."
        )
    return mask_arr, jnp.sum(mask_arr, axis=-1, dtype=jnp.int32), batch, steps


def masked_rnn(
    step: StepFn,
    init_carry: Any,
    inputs: Any,
    mask: jax.Array,
    lengths: jax.Array,
    *,
    reverse: bool = False,
    keep_order: bool = False,
    unroll: int | bool = 1,
) -> tuple[Any, Any]:
    """Runs ``step`` over ``inputs: [batch, time, ...]``, holding the carry at padding.

    Args:
      step: ``(carry, x_t, t) -> (carry, y_t)`` on a whole batch (``x_t: [batch,
        ...]``); ``t`` is the step's time index (int32 scalar), from which a step
        derives its own dropout keys.
      init_carry: the carry before the first valid step, leaves ``[batch, ...]``.
      inputs: pytree of ``[batch, time, ...]`` arrays.
      mask: ``bool[batch, time]`` (from :func:`resolve_mask`).
      lengths: ``int32[batch]``, the number of valid steps of each sequence.
      reverse: run each sequence from its last valid step to its first.
      keep_order: with ``reverse``, keep outputs aligned with their inputs; if False
        (Flax's default), output ``t`` belongs to input ``lengths - 1 - t``.
      unroll: passed to ``lax.scan``.

    Returns:
      ``(carry, outputs)``: the carry after each sequence's last valid step (the
      initial carry for a sequence of length 0) and ``outputs: [batch, time, ...]``,
      0 at padding.
    """
    steps, batch = mask.shape[1], mask.shape[0]
    xs = jax.tree.map(lambda a: jnp.moveaxis(as_array(a), 1, 0), inputs)
    # Every sequence's index of the step; a held sequence replays an earlier step's
    # input, so the step's index is the largest, the index of every valid sequence
    # (exact with right padding, where held sequences replay a step before t).
    times = lax.broadcasted_iota(jnp.int32, (steps, batch), 0)

    def body(carry: Any, x_and_t: tuple[Any, jax.Array]) -> tuple[Any, Any]:
        x_t, t = x_and_t
        return step(carry, x_t, jnp.max(t, initial=0))

    carry, ys = masked_scan(body, init_carry, (xs, times), mask.T, reverse=reverse, unroll=unroll)
    outputs = jax.tree.map(lambda a: jnp.moveaxis(a, 0, 1), ys)
    if reverse and not keep_order:
        outputs = jax.tree.map(lambda a: flip_sequences(a, lengths), outputs)
    return carry, outputs
