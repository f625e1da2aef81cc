"""Exceptions and the boundary checks that raise them.

Every check runs on static (Python-side) information only, before any array work,
so a bad call fails at trace time with a message that says what was expected,
what was given, and how to fix it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "AxisError",
    "DropmaskError",
    "DropmaskTypeError",
    "DropmaskValueError",
    "DtypeError",
    "MaskShapeError",
    "MissingKeyError",
    "RateError",
]


class DropmaskError(Exception):
    """Base of every error dropmask raises on user input.

    Each concrete error also subclasses the built-in type users already catch
    (``ValueError`` or ``TypeError``), so ``except ValueError`` keeps working.
    """


class DropmaskValueError(DropmaskError, ValueError):
    """An argument of the right type with a value dropmask cannot use."""


class DropmaskTypeError(DropmaskError, TypeError):
    """An argument of a type dropmask cannot use."""


class RateError(DropmaskValueError):
    """A dropout rate outside ``[0, 1]`` (or NaN)."""


class AxisError(DropmaskValueError):
    """An axis out of range for the array it refers to, or repeated."""


class DtypeError(DropmaskTypeError):
    """An array of the wrong dtype kind (e.g. integers where floats are needed)."""


class MissingKeyError(DropmaskValueError):
    """Randomness was needed (training mode) but no PRNG key or stream was given."""


class MaskShapeError(DropmaskValueError):
    """A mask whose shape cannot be broadcast against the data it masks."""


def concrete_value(x: Any) -> float | None:
    """Returns ``x`` as a Python float when it is known at trace time, else None."""
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, int | float | np.number):
        return float(x)
    if isinstance(x, np.ndarray) and x.shape == ():
        return float(x)
    if isinstance(x, jax.Array) and x.shape == ():
        try:
            return float(x)
        except jax.errors.ConcretizationTypeError:  # a tracer: known only at run time
            return None
    return None


def check_rate(rate: Any, *, name: str = "rate", allow_one: bool = True) -> float | None:
    """Validates a dropout rate; returns it as a float when static, None when traced.

    Raises:
      RateError: a static rate outside ``[0, 1]`` (``[0, 1)`` when ``allow_one`` is
        False) or NaN.
      TypeError: a rate that is not a scalar.
    """
    if hasattr(rate, "shape") and tuple(rate.shape) != ():
        raise TypeError(f"{name} must be a scalar, got an array of shape {tuple(rate.shape)}.")
    value = concrete_value(rate)
    if value is None:
        return None
    upper = "1]" if allow_one else "1)"
    if math.isnan(value) or value < 0.0 or value > 1.0 or (not allow_one and value == 1.0):
        raise RateError(
            f"{name} must be in [0, {upper} (the probability of dropping), got {value!r}. "
            f"To keep a fraction p of the units, pass {name}=1 - p."
        )
    return value


def normalize_axes(axes: Sequence[int], ndim: int, *, name: str) -> tuple[int, ...]:
    """Maps possibly-negative axes into ``range(ndim)``; rejects out-of-range or repeats."""
    if isinstance(axes, int):
        axes = (axes,)
    out = []
    for axis in axes:
        if not isinstance(axis, int | np.integer) or isinstance(axis, bool):
            raise TypeError(f"{name} must contain ints, got {axis!r} in {tuple(axes)!r}.")
        if not -ndim <= axis < ndim:
            raise AxisError(
                f"{name} contains axis {axis}, but the input has {ndim} dimensions, so axes "
                f"must be in [{-ndim}, {ndim - 1}]."
            )
        out.append(int(axis) % ndim)
    if len(set(out)) != len(out):
        raise AxisError(f"{name} repeats an axis: {tuple(axes)!r} (normalized {tuple(out)!r}).")
    return tuple(out)


def check_floating(x: Any, *, fn: str, hint: str = "") -> None:
    """Raises DtypeError unless ``x`` has a floating dtype."""
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise DtypeError(
            f"{fn} expects a floating-point array, got dtype {dtype}. "
            f"Cast it first, e.g. x.astype(jnp.float32){hint}."
        )


def check_key(key: Any, *, fn: str, stream: str | None = None) -> None:
    """Raises MissingKeyError when a PRNG key is needed but absent."""
    if key is not None:
        return
    if stream is None:
        raise MissingKeyError(
            f"{fn} is in training mode (deterministic=False) and needs a PRNG key, got "
            f"key=None. Pass key=jax.random.key(0) (or a key split from yours), or set "
            f"deterministic=True for evaluation."
        )
    raise MissingKeyError(
        f"{fn} is in training mode (deterministic=False) and draws from the PRNG stream "
        f"{stream!r}, but no key was provided for it. Pass one to apply, e.g. "
        f"model.apply(variables, x, rngs={{{stream!r}: jax.random.key(0)}}), or run in "
        f"evaluation mode with deterministic=True."
    )
