"""The functional core of the masked recurrent modules: one cell over a padded batch,
and the recurrent regularizers, zoneout and weight dropout on the recurrent kernel.

``dropmask.linen.MaskedRNN`` and ``dropmask.nnx.MaskedRNN`` only turn their cell into
a pure step function and call :func:`masked_rnn`; the masking itself is
:func:`dropmask.masked_scan`'s, the reversal of valid prefixes
:func:`dropmask.flip_sequences`'s. The regularizers act inside that scan, so a
padded step, whose carry the scan holds, changes nothing under them either:
zoneout wraps the step (:func:`regularized_step`), and weight dropout masks the
cell's recurrent kernels once per call, before the scan (:func:`drop_recurrent_kernels`),
so that every time step of a sequence batch sees the same mask (AWD-LSTM's DropConnect).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from ._checks import (
    check_bool_mask,
    check_floating,
    check_key,
    check_lengths,
    check_names,
    check_rate,
    check_shape_is,
    concrete_value,
)
from ._dropout import dropout
from ._errors import (
    DropmaskTypeError,
    DropmaskValueError,
    MaskShapeError,
    RateError,
    call_name,
    named,
    naming,
    user_error,
)
from ._masks import as_array, sequence_mask
from ._random import keep_mask, sharded_as
from ._scan import flip_sequences, masked_scan

__all__ = [
    "FLAX_RECURRENT_KERNELS",
    "carry_rates",
    "check_carry",
    "check_recurrent_kernels",
    "check_rnn_args",
    "check_zoneout_carry",
    "concat_features",
    "drop_recurrent_kernels",
    "recurrent_kernel_names",
    "leaf_rates",
    "masked_rnn",
    "regularized_step",
    "regularizer_keys",
    "resolve_mask",
    "zoneout",
]


def concat_features(a: Any, b: Any) -> Any:
    """Two directions' outputs joined on the feature axis: Bidirectional's default merge."""
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=-1), a, b)


# (carry, x_t, t) -> (carry, y_t); ``t`` is the int32 scalar index of the time step.
StepFn = Callable[[Any, Any, jax.Array], tuple[Any, Any]]


def resolve_mask(
    inputs: Any, mask: Any, lengths: Any, *, caller: str
) -> tuple[jax.Array, jax.Array, int, int]:
    """``(mask: bool[batch, time], lengths: int32[batch], batch, time)`` from either form.

    Exactly one of ``mask`` and ``lengths`` may be given; with neither, every step of
    every sequence is valid.
    """
    leaves = jax.tree.leaves(inputs)
    if not leaves or any(jnp.ndim(leaf) < 2 for leaf in leaves):
        shapes = [tuple(jnp.shape(leaf)) for leaf in leaves]
        raise user_error(
            MaskShapeError,
            f"inputs must be [batch, time, ...] (every leaf), got shapes {shapes}",
            "Add a batch axis, e.g. x[None].",
            caller=caller,
        )
    batch, steps = (int(d) for d in jnp.shape(leaves[0])[:2])
    for leaf in leaves:
        if tuple(jnp.shape(leaf)[:2]) != (batch, steps):
            raise user_error(
                MaskShapeError,
                f"every inputs leaf must start with [batch, time] = {(batch, steps)}, got a leaf "
                f"of shape {jnp.shape(leaf)}",
                caller=caller,
            )
    if mask is not None and lengths is not None:
        raise user_error(
            DropmaskValueError,
            "pass mask or lengths, not both (got both)",
            "lengths=n is the same as mask=dropmask.sequence_mask(n, time).",
            caller=caller,
        )
    if lengths is not None:
        check_shape_is(
            jnp.shape(lengths), (batch,), caller=caller, name="lengths", layout="[batch]"
        )
        mask_arr = sequence_mask(check_lengths(lengths, steps, caller=caller), steps)
        return mask_arr, jnp.sum(mask_arr, axis=-1, dtype=jnp.int32), batch, steps
    if mask is None:
        return jnp.ones((batch, steps), bool), jnp.full((batch,), steps, jnp.int32), batch, steps
    mask_arr = check_bool_mask(mask, caller=caller)
    check_shape_is(
        mask_arr.shape,
        (batch, steps),
        caller=caller,
        name="mask",
        layout="bool[batch, time]",
        fix=" Build one from lengths with dropmask.sequence_mask.",
    )
    return mask_arr, jnp.sum(mask_arr, axis=-1, dtype=jnp.int32), batch, steps


def check_rnn_args(
    inputs: Any,
    mask: Any,
    lengths: Any,
    initial_carry: Any,
    init_key: Any,
    *,
    caller: str,
    pair: bool = False,
) -> None:
    """Validates a recurrent layer's call arguments, naming the layer the user called.

    ``pair``: ``initial_carry`` is a ``(forward, backward)`` pair (``Bidirectional``).
    """
    resolve_mask(inputs, mask, lengths, caller=caller)
    if init_key is not None:
        check_key(init_key, caller=caller, name="init_key")
    if pair and initial_carry is not None:
        if not isinstance(initial_carry, tuple | list) or len(initial_carry) != 2:
            raise user_error(
                DropmaskTypeError,
                "initial_carry must be a (forward, backward) pair of carries, got "
                f"{type(initial_carry).__name__}",
                "Pass (forward_carry, backward_carry), or None for the cells' initial carries.",
                caller=caller,
            )


def check_carry(carry: Any, batch: int, *, caller: str) -> None:
    """Raises unless every leaf of ``carry`` starts with the batch axis."""
    for leaf in jax.tree.leaves(carry):
        if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != batch:
            raise user_error(
                MaskShapeError,
                f"initial_carry leaves must be [batch, ...] with batch {batch}, got a leaf of "
                f"shape {jnp.shape(leaf)}",
                "inputs must be [batch, time, *features] (x[..., None] adds a feature axis), "
                "and a given initial_carry batched.",
                caller=caller,
            )


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


# Flax's cells name their hidden-to-hidden Dense layers after the gate they feed
# (LSTMCell, OptimizedLSTMCell: hi, hf, hg, ho; GRUCell: hr, hz, hn; MGUCell: hf, hn;
# SimpleCell: h) in Linen, and ``dense_h`` in NNX's GRUCell, OptimizedLSTMCell and
# SimpleCell. The input-to-hidden layers (ii, if, iz, dense_i, ...) are never matched.
FLAX_RECURRENT_KERNELS = ("h", "hi", "hf", "hg", "ho", "hr", "hz", "hn", "dense_h")


def _as_rates(zoneout: Any) -> tuple:
    return tuple(zoneout) if isinstance(zoneout, tuple | list) else (zoneout,)


def carry_rates(zoneout: Any, *, caller: str) -> tuple[float, ...]:
    """``zoneout`` (one rate, or one per carry leaf) as a validated tuple, empty when 0."""
    rates = _as_rates(zoneout)
    if not rates:
        raise user_error(
            DropmaskValueError,
            "zoneout must be a rate or a tuple of rates (one per carry leaf), got an empty tuple",
            "Pass zoneout=0.0 to turn zoneout off.",
            caller=caller,
        )
    try:
        values = [check_rate(r, caller=caller, name="zoneout") for r in rates]
    except RateError:
        raise user_error(
            RateError,
            "zoneout must be in [0, 1] (the probability that a unit keeps its previous value), "
            f"got {zoneout!r}",
            "Pass e.g. zoneout=0.1.",
            caller=caller,
        ) from None
    return () if all(v == 0.0 for v in values) else rates


@named("zoneout")
def zoneout(
    prev: Any,
    new: Any,
    rate: Any,
    key: Any = None,
    *,
    deterministic: bool = False,
) -> Any:
    """Zoneout (Krueger et al., 2017): each unit keeps its previous value at ``rate``.

    In training every element of every carry leaf independently keeps ``prev`` with
    probability ``rate`` and takes ``new`` otherwise (no rescaling: a kept unit is a
    value the carry already held). In evaluation (``deterministic``) the result is
    the expectation, ``rate * prev + (1 - rate) * new``, computed in at least f32.

    Args:
      prev: the carry before the step, a pytree of floating arrays.
      new: the carry the cell computed, the same structure, shapes and dtypes.
      rate: probability of keeping ``prev``, in ``[0, 1]``: one value for every leaf,
        or a tuple with one per leaf in ``jax.tree.leaves`` order (for Flax's LSTM
        cells, whose carry is ``(c, h)``: ``(cell_rate, hidden_rate)``).
      key: a JAX PRNG key; needed in training unless every rate is 0 or 1. Leaf ``i``
        draws its mask from ``fold_in(key, i)`` through :func:`dropmask.keep_mask`.
      deterministic: return the expectation instead of a random mix.

    Returns:
      A carry like ``new``, dtypes preserved.

    Raises:
      DropmaskTypeError: a rate that is not a real scalar, or a key that is not one.
      RateError: a rate outside ``[0, 1]``.
      DropmaskValueError: a tuple of rates whose length is not the number of leaves.
      MaskShapeError: ``prev`` and ``new`` of different structures or shapes.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> prev, new = jnp.zeros(4), jnp.ones(4)
      >>> dropmask.zoneout(prev, new, 0.25, deterministic=True).tolist()
      [0.75, 0.75, 0.75, 0.75]
      >>> y = dropmask.zoneout(prev, new, 0.5, jax.random.key(0))
      >>> set(y.tolist()) <= {0.0, 1.0}
      True
    """
    caller = call_name()
    carry_rates(rate, caller=caller)
    rates = _as_rates(rate)
    prev_leaves, treedef = jax.tree.flatten(prev)
    new_leaves, new_treedef = jax.tree.flatten(new)
    if treedef != new_treedef or any(
        jnp.shape(a) != jnp.shape(b) for a, b in zip(prev_leaves, new_leaves, strict=True)
    ):
        raise user_error(
            MaskShapeError,
            "prev and new must be carries of one structure and shapes, got "
            f"{jax.tree.map(jnp.shape, prev)} and {jax.tree.map(jnp.shape, new)}",
            "Pass the carry before and after one step of the same cell.",
            caller=caller,
        )
    rates = leaf_rates(rates, new, caller=caller)
    values = [concrete_value(r) for r in rates]
    if not deterministic and any(v not in (0.0, 1.0) for v in values):
        check_key(key, caller=caller)
    out = []
    for i, (a, b, r, v) in enumerate(zip(prev_leaves, new_leaves, rates, values, strict=True)):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if v == 0.0:
            out.append(b)
        elif v == 1.0:
            out.append(a.astype(b.dtype))
        else:
            ok = None if v is not None else _traced_rate_ok(r, caller)
            if deterministic:
                dtype = jnp.promote_types(b.dtype, jnp.float32)
                r = jnp.asarray(r, dtype)
                mixed = (r * a.astype(dtype) + (1 - r) * b.astype(dtype)).astype(b.dtype)
            else:
                update = sharded_as(keep_mask(jax.random.fold_in(key, i), b.shape, r), b)
                mixed = jnp.where(update, b, a.astype(b.dtype))
            # A traced rate outside [0, 1] gives NaN, as a traced dropout rate does,
            # never an extrapolated mix.
            out.append(mixed if ok is None else jnp.where(ok, mixed, jnp.nan).astype(b.dtype))
    return jax.tree.unflatten(treedef, out)


def _traced_rate_ok(rate: Any, caller: str) -> jax.Array:
    """Whether a traced zoneout rate is in ``[0, 1]``; an error under ``checkify``."""
    r = jnp.asarray(rate, jnp.float32)
    ok = (r >= 0) & (r <= 1)
    checkify.debug_check(
        ok,
        f"{caller}: zoneout must be in [0, 1] (the probability that a unit keeps its "
        "previous value), got {r}.",
        r=r,
    )
    return ok


def check_zoneout_carry(zoneout: Any, carry: Any, *, caller: str) -> None:
    """Checks that ``zoneout`` has one rate or one per leaf of ``carry``, even if all 0."""
    leaf_rates(_as_rates(zoneout), carry, caller=caller)


def leaf_rates(rates: tuple, carry: Any, *, caller: str) -> tuple:
    """One zoneout rate per leaf of ``carry`` (floating leaves only), or raises."""
    leaves = jax.tree.leaves(carry)
    if len(rates) == 1:
        rates = rates * len(leaves)
    if len(rates) != len(leaves):
        raise user_error(
            DropmaskValueError,
            f"zoneout must be one rate or one per carry leaf ({len(leaves)} here), got "
            f"{len(rates)} rates",
            "For an LSTM's (c, h) carry pass (cell_rate, hidden_rate); a GRU's carry is one "
            "array: pass one rate.",
            caller=caller,
        )
    for leaf in leaves:
        check_floating(leaf, caller=caller, hint=" (zoneout mixes carries)")
    return rates


def _key_name(entry: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return None


def recurrent_kernel_names(value: Any, *, caller: str) -> tuple[str, ...]:
    """``recurrent_kernels`` (one name or a tuple of names) as a tuple of names."""
    return check_names(value, caller=caller, name="recurrent_kernels", example="('hi', 'hf')")


def _kernel_owners(path: tuple) -> list[Any]:
    """The submodule names that own a ``kernel`` leaf along ``path``."""
    keys = [_key_name(e) for e in path]
    return [a for a, b in zip(keys, keys[1:], strict=False) if b == "kernel"]


def check_recurrent_kernels(params: Any, names: Sequence[str], *, caller: str) -> list[tuple]:
    """The paths of the recurrent kernels among ``params``; raises if ``names`` misses.

    A recurrent kernel is a leaf at ``.../NAME/kernel`` with ``NAME`` in ``names``
    (a Linen params dict or an NNX state alike). With the default names (Flax's
    cells'), any that the cell lacks are skipped; names given explicitly must each
    name a submodule with a kernel.

    Raises:
      DropmaskValueError: no leaf matches, or an explicit name matches none, naming
        the submodules that have a kernel.
    """
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    chosen = set(names)
    owners = sorted({str(o) for path in paths for o in _kernel_owners(path)})
    hits = [path for path in paths if chosen & set(_kernel_owners(path))]
    unknown = [n for n in names if n not in owners]
    if not hits:
        raise user_error(
            DropmaskValueError,
            "weight_dropout needs the cell's recurrent kernels, named by recurrent_kernels="
            f"{tuple(names)}, got a cell whose submodules with a kernel are {owners}",
            "Pass recurrent_kernels=(names of the hidden-to-hidden layers,).",
            caller=caller,
        )
    if unknown and tuple(names) != FLAX_RECURRENT_KERNELS:
        known = tuple(n for n in names if n in owners)
        raise user_error(
            DropmaskValueError,
            f"recurrent_kernels names {unknown[0]!r}, which is no submodule of the cell with a "
            f"kernel; those are {owners}",
            f"Pass names among them, e.g. recurrent_kernels={known}.",
            caller=caller,
        )
    return hits


def drop_recurrent_kernels(
    params: Any, rate: Any, key: Any, names: Sequence[str], *, caller: str
) -> Any:
    """``params`` with every recurrent kernel passed through :func:`dropmask.dropout`.

    The kernels are those :func:`check_recurrent_kernels` finds. Kernel ``j`` (in the
    tree's sorted order) is masked with ``fold_in(key, j)``: one mask per call, so a
    scan that closes over the result uses the same mask at every time step.

    Raises:
      DropmaskValueError: as :func:`check_recurrent_kernels`.
    """
    hits = check_recurrent_kernels(params, names, caller=caller)
    index = {path: j for j, path in enumerate(hits)}

    def drop(path: tuple, leaf: Any) -> Any:
        if path not in index:
            return leaf
        with naming(caller, rate="weight_dropout"):
            return dropout(leaf, rate, jax.random.fold_in(key, index[path]))

    return jax.tree_util.tree_map_with_path(drop, params)


def regularized_step(
    step: StepFn,
    zoneout_rates: tuple,
    key: Any,
    init_carry: Any,
    *,
    deterministic: bool,
    caller: str,
) -> StepFn:
    """``step`` followed by zoneout of its carry, drawing ``fold_in(key, t)`` at step ``t``.

    The rates are checked against ``init_carry`` here, before the scan.

    An output leaf that is a carry leaf itself (Flax's cells return their new hidden
    state as the output) is replaced by that leaf after zoneout, so that the output
    is the state the next step sees, as in Krueger et al.
    """
    if not zoneout_rates:
        return step
    zoneout_rates = leaf_rates(zoneout_rates, init_carry, caller=caller)

    def wrapped(carry: Any, x_t: Any, t: jax.Array) -> tuple[Any, Any]:
        new_carry, y = step(carry, x_t, t)
        step_key = None if key is None else jax.random.fold_in(key, t)
        with naming(caller, rate="zoneout"):
            zoned = zoneout(carry, new_carry, zoneout_rates, step_key, deterministic=deterministic)
        pairs = list(zip(jax.tree.leaves(new_carry), jax.tree.leaves(zoned), strict=True))

        def same(leaf: Any) -> Any:
            return next((z for n, z in pairs if n is leaf), leaf)

        return zoned, jax.tree.map(same, y)

    return wrapped


def regularizer_keys(key: Any) -> tuple[Any, Any]:
    """``(zoneout_key, weight_key)`` from the one key a module draws per call."""
    if key is None:
        return None, None
    return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
