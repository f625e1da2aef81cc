"""The exceptions dropmask raises on user input, one class per failure kind.

Every class derives from :class:`DropmaskError` and from the built-in type users already
catch (``ValueError`` or ``TypeError``). The checks that raise them live in ``_checks``.
"""

from __future__ import annotations

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
