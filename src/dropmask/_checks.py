"""The argument checks of the library's public functions, in one message style.

Here live the checks that recur across modules: a rate, a key (also one given under
either of its two names), ``impl`` and ``residual``, an array and its floating dtype, a
callable, an instance of given types, a shape, a rank, an exact shape, axes and
``broadcast_dims``, a Python int (:func:`check_int`, static or with a lower bound; a count
from a config, :func:`check_int_at_least`), a scalar, one of a few choices, an optax
transformation and the gradients it is given (against the parameters), a sliding window,
a boolean mask and its broadcasting, integer ids, ``lengths``, label ranges, a tuple of
names. Each raises ``"{caller}: {name} must be <expected>, got
<given>. <fix>"``, where ``caller`` is the public function or class the user called, and
runs on static (trace-time) information only, so a bad call fails before anything is
computed, also under ``jit``. A traced value is left to run time: a traced rate out of
range gives NaN, an error under ``checkify``.

Every message, here and in the raises written elsewhere, is put together by
``_errors.user_error``. Those other raises are of kinds that belong to their module:

- relations between one function's arguments that no other function shares (attention's
  q, k and v shapes and its path options, DropBlock's block against the map, a pack
  that needs more rows than given), checked by that function before its work;
- a check of one argument that one function alone makes, in words about that function
  (``to_bias``'s ``dtype``, ``audit_model``'s ``rngs``, ``word_dropout``'s token dtype);
- the contents of host-side data (a ragged or non-numeric sequence in ``_padding``, a
  value the batch dtype cannot hold), and command-line flags, config entries and an
  example's fields, each reported against the user's own flag or line (``training``,
  ``_workflow``);
- conditions met while running rather than in the arguments: a checkpoint that does not
  match the run or cannot be read or written, a non-finite state, a user's layer, model
  or example that returned or did something else than promised, an error of Flax or
  orbax raised again with the fix.

The exception classes, one base for all, live in ``_errors``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.experimental import checkify

from ._errors import (
    AxisError,
    DropmaskTypeError,
    DropmaskValueError,
    DtypeError,
    MaskShapeError,
    MissingKeyError,
    RateError,
    rate_name,
    user_error,
)

__all__ = [
    "as_dims",
    "check_array",
    "check_bool_mask",
    "check_broadcastable",
    "check_callable",
    "check_choice",
    "check_floating",
    "check_impl",
    "check_instance",
    "check_int",
    "check_int_at_least",
    "check_integer_dtype",
    "check_key",
    "check_label_range",
    "check_grads",
    "check_lengths",
    "check_names",
    "check_ndim",
    "check_one_key",
    "check_optimizer",
    "check_rate",
    "check_scalar",
    "check_shape",
    "check_shape_is",
    "check_window",
    "concrete_value",
    "is_concrete",
    "normalize_axes",
    "normalize_broadcast_dims",
]


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds values known at trace time (not a tracer)."""
    return not isinstance(x, Tracer)


def concrete_value(x: Any) -> float | None:
    """``x`` as a Python float when it is a real scalar known at trace time, else None."""
    if isinstance(x, bool | int | float | np.integer | np.floating):
        return float(x)
    if isinstance(x, np.ndarray | jax.Array) and x.shape == () and is_concrete(x):
        if jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating):
            return float(x)
    return None


def check_optimizer(tx: Any, *, caller: str) -> None:
    """Raises :class:`DropmaskTypeError` unless ``tx`` is an optax transformation (has
    callable ``init`` and ``update``)."""
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise user_error(
            DropmaskTypeError,
            f"tx must be an optax.GradientTransformation (with init and update), got {tx!r:.80}",
            "Pass e.g. tx=optax.adam(1e-3).",
            caller=caller,
        )


def check_rate(
    rate: Any, *, caller: str | None = None, name: str | None = None, allow_one: bool = True
) -> float | None:
    """Validates a dropout rate; returns it as a float when known now, None when traced.

    ``name`` is the argument's name in messages; by default the one the call was named
    with (:func:`~dropmask._errors.rate_name`: ``"rate"`` unless a caller names it).

    A rate is a real scalar: a Python or NumPy number, a 0-d array, or a JAX scalar
    (concrete or traced). Only a JAX tracer is left unchecked here (its value exists
    only at run time).

    Raises:
      DropmaskTypeError: ``rate`` is not a real scalar (None, a string, a list, an
        array with elements, a complex or boolean value).
      RateError: a known rate outside ``[0, 1]`` (``[0, 1)`` when ``allow_one`` is
        False) or NaN.
    """
    name = rate_name() if name is None else name
    dtype = getattr(rate, "dtype", None)
    shape = tuple(getattr(rate, "shape", ()))
    is_real_number = isinstance(rate, int | float | np.integer | np.floating) and not isinstance(
        rate, bool | np.bool_
    )
    is_real_array = (
        isinstance(rate, np.ndarray | jax.Array)
        and dtype is not None
        and (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))
    )
    if not (is_real_number or is_real_array) or shape != ():
        got = f"an array of shape {shape} and dtype {dtype}" if dtype is not None else repr(rate)
        raise user_error(
            DropmaskTypeError,
            f"{name} must be a real number in [0, 1] (a Python float or a JAX scalar, e.g. "
            f"from a schedule), got {got} of type {type(rate).__name__}",
            f"Pass one value for the whole array, e.g. {name}=0.1.",
            caller=caller,
        )
    value = concrete_value(rate)
    if value is None:
        return None
    upper = "1]" if allow_one else "1)"
    if math.isnan(value) or value < 0.0 or value > 1.0 or (not allow_one and value == 1.0):
        raise user_error(
            RateError,
            f"{name} must be in [0, {upper} (the probability of dropping), got {value!r}",
            f"To keep a fraction p of the units, pass {name}=1 - p.",
            caller=caller,
        )
    return value


def check_key(
    key: Any,
    *,
    caller: str,
    stream: str | None = None,
    name: str = "key",
    streams: Sequence[str] | None = None,
) -> None:
    """Validates one PRNG key: a typed scalar key or a raw ``uint32[2]`` (or ``[4]``) key.

    Serves every caller that takes a key: the dropout functions (``key``), attention
    (``dropout_rng``), the modules (``stream`` names the Flax PRNG stream), and
    ``training.TrainState`` (``caller="TrainState.create"``). ``streams``: the PRNG streams
    the caller was given, named in the message so that a misspelt one stands out.

    Raises:
      MissingKeyError: ``key`` is None.
      DropmaskTypeError: ``key`` is not a PRNG key (e.g. an int seed, a batch of keys).
    """
    if key is None:
        if stream is None:
            raise user_error(
                MissingKeyError,
                f"{caller} is in training mode (deterministic=False) and needs a PRNG key, got "
                f"{name}=None",
                f"Pass {name}=jax.random.key(0) (or a key split from yours), or set "
                "deterministic=True for evaluation.",
                caller=None,
            )
        given = ""
        if streams is not None:
            close = difflib.get_close_matches(stream, list(streams), n=1)
            given = f" The rngs given are {sorted(streams)!r}" if streams else " No rngs were given"
            given += f"; {close[0]!r} looks like a misspelling of {stream!r}." if close else "."
        raise user_error(
            MissingKeyError,
            f"{caller} is in training mode (deterministic=False) and draws from the PRNG stream "
            f"{stream!r}, but no key was provided for it.{given} Pass one to apply, e.g. "
            f"model.apply(variables, x, rngs={{{stream!r}: jax.random.key(0)}}), or run in "
            "evaluation mode with deterministic=True",
            caller=None,
        )
    dtype = getattr(key, "dtype", None)
    shape = tuple(getattr(key, "shape", ()))
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key) and shape == ():
        return
    if dtype == jnp.uint32 and shape in ((2,), (4,)):
        return
    if isinstance(key, bool | int | np.integer):
        got = f"the int {key!r}"
        fix = f"A seed is not a key: pass {name}=jax.random.key({key!r})"
    elif dtype is not None:
        got = f"a {type(key).__name__} with dtype {dtype} and shape {shape}"
        fix = (
            f"Pass one key, e.g. {name}=jax.random.key(0); for a batch of keys, jax.vmap over them"
        )
    else:
        got = f"{key!r} of type {type(key).__name__}"
        fix = f"Pass {name}=jax.random.key(0)"
    raise user_error(
        DropmaskTypeError,
        f"{name} must be one PRNG key (jax.random.key(seed), or a raw uint32[2] key), got {got}",
        f"{fix}, or a key split from yours: main_key, dropout_key = "
        "jax.random.split(jax.random.key(0)).",
        caller=caller,
    )


def check_one_key(key: Any, dropout_rng: Any, *, caller: str) -> Any:
    """The dropout key, given as ``key`` or as Flax's ``dropout_rng`` (None if neither);
    giving both is an error."""
    if key is not None and dropout_rng is not None:
        raise user_error(
            DropmaskValueError,
            "pass the dropout key as key= or dropout_rng=, not both",
            caller=caller,
        )
    return key if key is not None else dropout_rng


def check_impl(impl: Any, *, caller: str | None = None) -> None:
    """Raises DropmaskValueError unless ``impl`` names a mask generator."""
    check_choice(
        impl,
        ("fast", "flax"),
        caller=caller,
        name="impl",
        fix=" Use 'fast' (the default) or 'flax' for masks bit-identical to Flax's.",
    )


def check_residual(residual: Any, *, caller: str | None = None) -> None:
    """Raises DropmaskValueError unless ``residual`` names what the backward pass keeps."""
    check_choice(
        residual,
        ("mask", "none"),
        caller=caller,
        name="residual",
        fix=" Use 'mask' (the default: keep 1 bit per element) or 'none' (keep only the key "
        "and draw the mask again in the backward pass).",
    )


def check_array(x: Any, *, caller: str, name: str = "x") -> jax.Array:
    """``x`` as a JAX array; rejects Python containers, which JAX's own functions reject."""
    if isinstance(x, list | tuple | dict | str | bytes) or x is None:
        raise user_error(
            DropmaskTypeError,
            f"{name} must be an array, got a {type(x).__name__}",
            f"Convert it first, e.g. {name}=jnp.asarray({name}).",
            caller=caller,
        )
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def check_floating(x: Any, *, caller: str, hint: str = "", allow_complex: bool = False) -> None:
    """Raises DtypeError unless ``x`` has a floating (or, if allowed, complex) dtype."""
    dtype = jnp.result_type(x)
    if jnp.issubdtype(dtype, jnp.floating):
        return
    if allow_complex and jnp.issubdtype(dtype, jnp.complexfloating):
        return
    kind = "floating-point or complex" if allow_complex else "floating-point"
    raise user_error(
        DtypeError,
        f"{caller} expects a {kind} array, got dtype {dtype}",
        f"Cast it first, e.g. x.astype(jnp.float32){hint}.",
        caller=None,
    )


def check_scalar(
    value: Any,
    *,
    caller: str,
    name: str,
    fix: str = "",
    error: type[Exception] = DropmaskTypeError,
) -> None:
    """Raises ``error`` unless ``value`` is 0-d; ``fix`` ends the message."""
    if np.ndim(value) != 0:
        raise error(f"{caller}: {name} must be a scalar, got shape {np.shape(value)}.{fix}")


def check_shape(shape: Any, *, caller: str, name: str = "shape") -> tuple[int, ...]:
    """A static shape as a tuple of non-negative ints; no silent truncation of floats."""
    dims: tuple[Any, ...] | None = None
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        dims = (shape,)
    elif not isinstance(shape, bool):
        try:
            dims = tuple(shape)
        except TypeError:
            dims = None
    if dims is None or any(
        isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in dims
    ):
        raise user_error(
            DropmaskTypeError,
            f"{name} must be a tuple of non-negative Python ints (a static array shape), got "
            f"{shape!r}",
            f"Pass e.g. {name}=x.shape or {name}=(2, 3).",
            caller=caller,
        )
    return tuple(int(d) for d in dims)


def as_dims(value: Any, *, caller: str | None, name: str = "broadcast_dims") -> tuple[int, ...]:
    """An int or an iterable of ints (tuple, list, range, NumPy array) as a tuple of ints,
    as Flax accepts for ``broadcast_dims``; not yet checked against an input's rank."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        return (int(value),)
    dims: tuple[Any, ...] | None = None
    if isinstance(value, np.ndarray):
        dims = tuple(value.ravel().tolist())
    elif value is not None and not isinstance(value, str | bytes | bool | float):
        try:
            dims = tuple(value)
        except TypeError:
            dims = None
    if dims is None:
        raise user_error(
            DropmaskTypeError,
            f"{name} must be an int or a sequence of ints, got {value!r} of type "
            f"{type(value).__name__}",
            f"Pass {name}=() for none, or e.g. {name}=(1,).",
            caller=caller,
        )
    for axis in dims:
        if not isinstance(axis, int | np.integer) or isinstance(axis, bool):
            raise user_error(
                DropmaskTypeError,
                f"{name} must contain ints, got {axis!r} in {value!r}",
                f"Pass e.g. {name}=(1,).",
                caller=caller,
            )
    return tuple(int(a) for a in dims)


def normalize_axes(
    axes: Any, ndim: int, *, name: str, caller: str | None = None, allow_repeats: bool = False
) -> tuple[int, ...]:
    """Maps possibly-negative axes into ``range(ndim)``; rejects out-of-range axes.

    ``axes`` is read by :func:`as_dims`. Repeats are an error unless ``allow_repeats``
    (then they are merged, as Flax does for ``broadcast_dims``).
    """
    dims = as_dims(axes, caller=caller, name=name)
    out = []
    for axis in dims:
        if ndim == 0:
            raise user_error(
                AxisError,
                f"{name} names axis {axis}, but the input is 0-d (a scalar) and has no axes",
                f"Pass {name}=() for a scalar, or reshape the input first.",
                caller=caller,
            )
        if not -ndim <= axis < ndim:
            raise user_error(
                AxisError,
                f"{name} contains axis {axis}, but the input has {ndim} dimensions, so axes "
                f"must be in [{-ndim}, {ndim - 1}]",
                caller=caller,
            )
        out.append(axis % ndim)
    if len(set(out)) != len(out):
        if allow_repeats:
            return tuple(sorted(set(out)))
        raise user_error(
            AxisError,
            f"{name} repeats an axis: {dims!r} (normalized {tuple(out)!r})",
            "Name each axis once.",
            caller=caller,
        )
    return tuple(out)


def normalize_broadcast_dims(broadcast_dims: Any, ndim: int, *, caller: str) -> tuple[int, ...]:
    """``broadcast_dims`` as Flax reads it: an int or ints, negative allowed, repeats merged."""
    return normalize_axes(
        broadcast_dims, ndim, name="broadcast_dims", caller=caller, allow_repeats=True
    )


def check_int(
    value: Any,
    *,
    caller: str,
    name: str,
    minimum: int | None = None,
    shape: bool = False,
    why: str = "",
    fix: str = "",
) -> int:
    """``value`` as an int: a Python or NumPy int (a bool is none), at least ``minimum``
    when given. ``shape``: the int fixes an array shape (``max_len``), so it must be
    static, which the message says. ``why`` follows "a Python int" and ``fix`` ends the
    message on a wrong type.

    Raises:
      DropmaskTypeError: ``value`` is not an int.
      DropmaskValueError: ``value`` is below ``minimum``.
    """
    if shape:
        why, fix = " (it fixes an array shape)", f"Pass a static value, e.g. {name}=128."
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise user_error(
            DropmaskTypeError,
            f"{name} must be a Python int{why}, got {type(value).__name__}",
            fix,
            caller=caller,
        )
    if minimum is not None and value < minimum:
        raise user_error(
            DropmaskValueError, f"{name} must be >= {minimum}, got {value}", caller=caller
        )
    return int(value)


def check_int_at_least(
    value: Any, minimum: int, *, caller: str, name: str, why: str = "", fix: str = ""
) -> int:
    """``value`` as an int, unless it is no int (a bool is none) or is below ``minimum``;
    ``why`` follows the bound in the message and ``fix`` ends it.

    The check of a count read from a config or a command (``steps``, ``keep``, ``ddof``):
    a wrong type and a wrong value are one mistake there, a :class:`DropmaskValueError`
    that names the bound. Arguments of the array API use :func:`check_int`.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise user_error(
            DropmaskValueError,
            f"{name} must be an int >= {minimum}{why}, got {value!r}",
            fix,
            caller=caller,
        )
    return int(value)


def check_choice(
    value: Any, choices: tuple[Any, ...], *, caller: str | None, name: str, fix: str = ""
) -> None:
    """Raises DropmaskValueError unless ``value`` is one of ``choices``; ``fix`` ends the
    message."""
    if value not in choices:
        raise user_error(
            DropmaskValueError,
            f"{name} must be one of {choices}, got {value!r}",
            fix,
            caller=caller,
        )


def check_callable(value: Any, *, caller: str, name: str, what: str, fix: str) -> None:
    """Raises DropmaskTypeError unless ``value`` is callable: ``what`` says how it is
    called (e.g. "callable as f(x, key)") and ``fix`` ends the message."""
    if not callable(value):
        raise user_error(
            DropmaskTypeError,
            f"{name} must be {what}, got {type(value).__name__}",
            fix,
            caller=caller,
        )


def check_instance(
    value: Any, types: type | tuple[type, ...], *, caller: str, name: str, what: str, fix: str
) -> None:
    """Raises DropmaskTypeError unless ``value`` is an instance of ``types``: ``what``
    names them for the user (e.g. "an nnx.Module") and ``fix`` ends the message."""
    if not isinstance(value, types):
        raise user_error(
            DropmaskTypeError,
            f"{name} must be {what}, got {type(value).__name__}",
            fix,
            caller=caller,
        )


def _leaf_text(leaf: Any) -> str:
    return f"{jnp.result_type(leaf)}{tuple(np.shape(leaf))}"


def check_grads(grads: Any, params: Any, *, caller: str) -> None:
    """Raises DropmaskValueError unless ``grads`` has the pytree structure of ``params``
    and each leaf its parameter's shape and dtype (static information: also under
    ``jit``), naming the first leaf that differs by its path. Without it a stack of
    gradients broadcasts into the parameters, and another tree fails inside optax."""
    fix = (
        "Pass the gradients of state.params themselves, jax.grad(loss_fn)(state.params): "
        "average a stack of gradients over its leading axis, and cast gradients of another "
        "dtype to their parameters' first."
    )
    leaves, treedef = jax.tree.flatten(grads)
    param_leaves, params_def = jax.tree.flatten(params)
    if treedef != params_def:
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(grads)]
        param_paths = [
            jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)
        ]
        missing = [p for p in param_paths if p not in set(paths)]
        extra = [p for p in paths if p not in set(param_paths)]
        differences = " and ".join(
            f"{what} {', '.join(found[:3])}{' and more' if len(found) > 3 else ''}"
            for what, found in (("lacks", missing), ("has", extra))
            if found
        )
        got = (
            f"a tree that {differences}"
            if differences
            else f"the same leaves in another kind of tree, a {type(grads).__name__}"
        )
        raise user_error(
            DropmaskValueError,
            f"grads must have the pytree structure of params, got {got}",
            fix,
            caller=caller,
        )
    for index, (leaf, param) in enumerate(zip(leaves, param_leaves, strict=True)):
        if np.shape(leaf) != np.shape(param) or jnp.result_type(leaf) != jnp.result_type(param):
            path, _ = jax.tree_util.tree_leaves_with_path(params)[index]
            raise user_error(
                DropmaskValueError,
                f"grads must have the shape and dtype of each parameter, got "
                f"{_leaf_text(leaf)} at {jax.tree_util.keystr(path)}, where params has "
                f"{_leaf_text(param)}",
                fix,
                caller=caller,
            )


def check_ndim(
    shape: Sequence[int],
    *,
    caller: str,
    name: str,
    layout: str,
    minimum: int,
    maximum: int | None = None,
    fix: str = "",
) -> None:
    """Raises DropmaskValueError unless ``len(shape)`` is in ``[minimum, maximum]``
    (no upper bound when ``maximum`` is None); ``layout`` describes the expected axes
    (e.g. "[batch, time, ...] (at least 2-d)") and ``fix`` ends the message."""
    ndim = len(shape)
    if ndim < minimum or (maximum is not None and ndim > maximum):
        raise user_error(
            DropmaskValueError,
            f"{name} must be {layout}, got shape {tuple(shape)}",
            fix,
            caller=caller,
        )


def check_shape_is(
    shape: Sequence[int],
    expected: Sequence[int],
    *,
    caller: str,
    name: str,
    layout: str,
    fix: str = "",
) -> None:
    """Raises MaskShapeError unless ``shape`` is exactly ``expected`` (no broadcasting);
    ``layout`` names its axes (e.g. "bool[batch, time]"), ``fix`` ends the message."""
    if tuple(shape) != tuple(expected):
        raise user_error(
            MaskShapeError,
            f"{name} must be {layout} = {tuple(expected)}, got shape {tuple(shape)}",
            fix,
            caller=caller,
        )


def check_window(window: Any, *, caller: str, fix: str = "") -> tuple[int, int]:
    """``(left, right)`` of a sliding window given as that pair or as one int for both;
    ``fix`` ends the message of a pair of the wrong length."""
    if isinstance(window, tuple | list):
        if len(window) != 2:
            raise user_error(
                DropmaskValueError,
                f"window must be an int or (left, right), got {window!r}",
                fix,
                caller=caller,
            )
        left, right = window
    else:
        left = right = window
    left = check_int(left, name="window[0] (left)", caller=caller, minimum=0, shape=True)
    right = check_int(right, name="window[1] (right)", caller=caller, minimum=0, shape=True)
    return left, right


def check_bool_mask(mask: Any, *, caller: str, name: str = "mask") -> jax.Array:
    """Returns ``mask`` as a jax bool array; rejects other dtypes with the fix."""
    dtype = jnp.result_type(mask)
    if dtype != jnp.bool_:
        raise user_error(
            DtypeError,
            f"{name} must be boolean (True = valid), got dtype {dtype}",
            "Convert it first: dropmask.from_flax_mask for 0/1 float masks, dropmask.from_bias "
            f"for additive biases, or `{name} != 0`.",
            caller=caller,
        )
    return jnp.asarray(mask)


_TRAILING_HINT = "For x: [batch, time, features] and a [batch, time] mask, pass mask[..., None]."


def check_broadcastable(
    shape: Sequence[int],
    target: Sequence[int],
    *,
    caller: str,
    name: str,
    hint: str = _TRAILING_HINT,
) -> None:
    """Raises MaskShapeError unless ``shape`` broadcasts to exactly ``target``."""
    shape, target = tuple(shape), tuple(target)
    ok = len(shape) <= len(target)
    if ok:
        for s, t in zip(shape[::-1], target[::-1], strict=False):
            ok = ok and s in (1, t)
    if not ok:
        raise user_error(
            MaskShapeError,
            f"{name} of shape {shape} does not broadcast to shape {target} (NumPy rules: "
            "trailing axes are aligned and must match or be 1)",
            hint,
            caller=caller,
        )


def check_integer_dtype(x: jax.Array, *, caller: str, name: str) -> None:
    """Raises DtypeError unless ``x`` holds integers."""
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise user_error(
            DtypeError,
            f"{name} must be integers, got dtype {x.dtype}",
            f"Cast with {name}.astype(jnp.int32).",
            caller=caller,
        )


def check_names(value: Any, *, caller: str, name: str, example: str) -> tuple[str, ...]:
    """One name or a tuple (or list) of names as a tuple of str.

    A lone string is one name, never its characters (``tuple("hi")`` would be
    ``('h', 'i')``).

    Raises:
      DropmaskTypeError: anything else, or a non-string among the names.
    """
    if isinstance(value, str):
        return (value,)
    names = tuple(value) if isinstance(value, tuple | list) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise user_error(
            DropmaskTypeError,
            f"{name} must be a name or a tuple of names (str), got {value!r}",
            f"Pass e.g. {name}={example}.",
            caller=caller,
        )
    return names


def check_lengths(lengths: Any, max_len: int, *, caller: str, name: str = "lengths") -> jax.Array:
    """Validates integer ``lengths`` in ``[0, max_len]`` (values checked when concrete)."""
    arr = jnp.asarray(lengths)
    check_integer_dtype(arr, caller=caller, name=name)
    if is_concrete(lengths) and arr.size:
        host = np.asarray(lengths)
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi > max_len:
            raise user_error(
                DropmaskValueError,
                f"{name} must be in [0, {max_len}] (the padded length), got values in [{lo}, {hi}]",
                "Pad to a longer max_len or truncate the sequences first "
                "(dropmask.pad_sequences(..., truncate='right')).",
                caller=caller,
            )
    return arr


def check_label_range(
    labels: jax.Array, counted: Any, classes: int, *, caller: str, what: str = "counted examples"
) -> None:
    """Class ids of counted positions must lie in ``[0, classes)``.

    Known values (``labels`` and ``counted`` concrete) are checked now; traced ones at
    run time under ``checkify.checkify(f, errors=checkify.user_checks)`` only, so the
    caller must also make an out-of-range counted label NaN in its result rather than
    clip it to a class. ``counted``: bool broadcastable to ``labels``, or None (all).

    Raises:
      DropmaskValueError: a known counted label is out of range.
    """
    fix = "Mask out ignored ones (e.g. label -100) with mask=labels >= 0."
    concrete = is_concrete(labels) and (counted is None or is_concrete(counted))
    if concrete:
        host = np.asarray(labels)
        if counted is not None:
            host = host[np.broadcast_to(np.asarray(counted), host.shape)]
        if host.size and (host.min() < 0 or host.max() >= classes):
            raise user_error(
                DropmaskValueError,
                f"labels of {what} must be in [0, {classes}), got values in "
                f"[{host.min()}, {host.max()}]",
                fix,
                caller=caller,
            )
        return
    in_range = (labels >= 0) & (labels < classes)
    if counted is not None:
        in_range = in_range | ~counted
    checkify.debug_check(
        jnp.all(in_range),
        f"{caller}: labels of {what} must be in [0, {classes}), got one outside. {fix}",
    )
