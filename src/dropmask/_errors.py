"""The exceptions dropmask raises on user input, one class per failure kind.

Every class derives from :class:`DropmaskError` and from the built-in type users already
catch (``ValueError`` or ``TypeError``). :func:`user_error` writes every message in one
form, ``"caller: name must be X, got Y. Fix."``; the checks that raise them live in
``_checks``.

Here too is how a message learns whom to name: :func:`named` (a decorator on a public
function) and :func:`naming` (a layer's call) set the name that :func:`call_name` gives
the checks, so that no signature carries it, and may name the rate the call draws with
as the user passed it (``zoneout=`` of ``MaskedRNN``, ``dropout_rate=`` of attention),
which :func:`rate_name` gives the rate's checks. The outermost name wins: a layer that
calls :func:`dropmask.dropout`, or a public function that calls another, reports under
the name the user called, and its argument's name. A named call that runs the user's
code runs it :func:`unnamed`: a callback's own calls name themselves.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

__all__ = [
    "AxisError",
    "DropmaskError",
    "DropmaskTypeError",
    "DropmaskValueError",
    "DtypeError",
    "MaskShapeError",
    "MissingKeyError",
    "RateError",
    "call_name",
    "named",
    "naming",
    "rate_name",
    "unnamed",
    "user_error",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_E = TypeVar("_E", bound=Exception)

# The name of the public function or layer the user called; None outside any. Read at
# trace time only, so it adds nothing to a traced program.
_CALL_NAME: ContextVar[str | None] = ContextVar("dropmask_call_name", default=None)
# The name of the rate argument that call draws with, as the user passed it; None: "rate".
_RATE_NAME: ContextVar[str | None] = ContextVar("dropmask_rate_name", default=None)


def call_name() -> str:
    """The name errors give the current call: the outermost :func:`named` or
    :func:`naming` around it (``"dropmask"`` outside any)."""
    return _CALL_NAME.get() or "dropmask"


def rate_name() -> str:
    """The name errors give the rate the current call draws with: the outermost
    :func:`named` or :func:`naming` around it that names one (``"rate"`` where none
    does)."""
    return _RATE_NAME.get() or "rate"


@contextlib.contextmanager
def naming(name: str, *, rate: str | None = None) -> Iterator[None]:
    """Within: errors name ``name``, and the rate ``rate`` when given, unless an
    enclosing call has named itself, or a rate."""
    tokens = []
    if _CALL_NAME.get() is None:
        tokens.append((_CALL_NAME, _CALL_NAME.set(name)))
    if rate is not None and _RATE_NAME.get() is None:
        tokens.append((_RATE_NAME, _RATE_NAME.set(rate)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def named(name: str, *, rate: str | None = None) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorates a public function so that errors raised in its call name ``name`` (and
    its rate ``rate``), as :func:`naming` does; its signature, docstring and
    ``__module__`` stay those of the function."""

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with naming(name, rate=rate):
                return fn(*args, **kwargs)

        return call

    return decorate


def unnamed(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn``, a callback of the user's, run outside any name: the dropmask calls it
    makes name themselves, not the call that runs it."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        name, rate = _CALL_NAME.set(None), _RATE_NAME.set(None)
        try:
            return fn(*args, **kwargs)
        finally:
            _RATE_NAME.reset(rate)
            _CALL_NAME.reset(name)

    return call


class DropmaskError(Exception):
    """Base of every error dropmask raises on user input.

    Each concrete error also subclasses the built-in type users already catch
    (``ValueError`` or ``TypeError``), so ``except ValueError`` keeps working.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> try:
      ...     dropmask.dropout(jnp.ones(3), 1.5, jax.random.key(0))
      ... except dropmask.DropmaskError as err:  # every user error
      ...     print(str(err).split(". ")[0])
      dropout: rate must be in [0, 1] (the probability of dropping), got 1.5
    """


class DropmaskValueError(DropmaskError, ValueError):
    """An argument of the right type with a value dropmask cannot use.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> q, k = jnp.ones((1, 2, 1, 4)), jnp.ones((1, 2, 1, 5))
      >>> try:
      ...     dropmask.dot_product_attention(q, k, k)
      ... except dropmask.DropmaskValueError as err:  # a ValueError too
      ...     print(err)
      dot_product_attention: q and k depths must match, got 4 and 5.
    """


class DropmaskTypeError(DropmaskError, TypeError):
    """An argument of a type dropmask cannot use.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> try:
      ...     dropmask.dropout(jnp.ones(3), 0.5, 123)
      ... except dropmask.DropmaskTypeError as err:  # a TypeError too
      ...     print(str(err).split(", got")[0])
      dropout: key must be one PRNG key (jax.random.key(seed), or a raw uint32[2] key)
    """


class RateError(DropmaskValueError):
    """A dropout rate outside ``[0, 1]`` (or NaN).

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> try:
      ...     dropmask.dropout(jnp.ones(3), 1.5, jax.random.key(0))
      ... except dropmask.RateError as err:  # a ValueError too
      ...     print(str(err).split(". ")[0])
      dropout: rate must be in [0, 1] (the probability of dropping), got 1.5
    """


class AxisError(DropmaskValueError):
    """An axis out of range for the array it refers to, or repeated.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> try:
      ...     dropmask.dropout(jnp.ones(3), 0.5, jax.random.key(0), broadcast_dims=2)
      ... except dropmask.AxisError as err:  # a ValueError too
      ...     print(str(err).split(", but")[0])
      dropout: broadcast_dims contains axis 2
    """


class DtypeError(DropmaskTypeError):
    """An array of the wrong dtype kind (e.g. integers where floats are needed).

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> try:
      ...     dropmask.dropout(jnp.arange(3), 0.5, jax.random.key(0))
      ... except dropmask.DtypeError as err:  # a TypeError too
      ...     print(str(err).split(". ")[0])
      dropout expects a floating-point or complex array, got dtype int32
    """


class MissingKeyError(DropmaskValueError):
    """Randomness was needed (training mode) but no PRNG key or stream was given.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> try:
      ...     dropmask.dropout(jnp.ones(3), 0.5)
      ... except dropmask.MissingKeyError as err:  # a ValueError too
      ...     print(str(err).split(". ")[0])
      dropout is in training mode (deterministic=False) and needs a PRNG key, got key=None
    """


class MaskShapeError(DropmaskValueError):
    """A mask whose shape cannot be broadcast against the data it masks.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> try:
      ...     dropmask.masked_mean(jnp.ones((2, 3)), jnp.ones(4, bool))
      ... except dropmask.MaskShapeError as err:  # a ValueError too
      ...     print(str(err).split(" (NumPy")[0])
      masked_mean: mask of shape (4,) does not broadcast to shape (2, 3)
    """


def user_error(kind: type[_E], message: str, fix: str = "", *, caller: str | None) -> _E:
    """The error for a user's mistake, its message in the one form of the library:
    ``"{caller}: {message}. {fix}"``.

    Args:
      kind: the exception class (a :class:`DropmaskError`, or one that wraps it).
      message: what is wrong, without the closing period; usually
        ``"{name} must be <expected>, got <given>"``.
      fix: what to pass instead, as whole sentences (surrounding spaces are dropped);
        empty when the expected value says it.
      caller: the public function, layer or command the user called (e.g.
        :func:`call_name`); None or empty where the message names it itself.

    Returns:
      The exception, for ``raise`` at the call site.
    """
    text = f"{caller}: {message}." if caller else f"{message}."
    fix = fix.strip()
    return kind(f"{text} {fix}" if fix else text)
