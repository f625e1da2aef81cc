"""Per-step PRNG keys for training loops: one rule for every named stream.

Stream ``name`` at step ``step`` gets::

    fold_in(fold_in(key, stream_id(name)), step)

Each stream has its own root key (the stored key with the stream's id folded in), and
the step is folded into that root, so a stream's keys depend only on the stored key,
its name and the step. Adding or removing another stream (say ``'lstm'`` beside
``'dropout'``) never changes a stream's masks, and a step re-run or resumed from a
checkpoint draws exactly the same masks, because the stored key itself never changes.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

import jax

from .._errors import DropmaskTypeError, DropmaskValueError, user_error

__all__ = ["step_key", "step_rngs", "stream_id", "stream_key"]


class HasKeyAndStep(Protocol):
    """Anything with a PRNG ``key`` and an integer ``step``, e.g. a Flax ``TrainState``."""

    key: Any
    step: Any


def stream_id(name: str) -> int:
    """A stable 32-bit id for a PRNG stream name (CRC-32 of its UTF-8 bytes).

    Python's ``hash`` is salted per process, so it would give different keys on every
    run; CRC-32 is the same on every machine and Python version.

    Args:
      name: a stream name such as ``'dropout'``.

    Returns:
      An int in ``[0, 2**32)``, usable as ``jax.random.fold_in`` data.

    Raises:
      DropmaskTypeError: ``name`` is not a string.
      DropmaskValueError: ``name`` is empty or only whitespace (a typo that would
        silently be a stream of its own).

    Example:
      >>> stream_id("dropout") == stream_id("dropout") != stream_id("lstm")
      True
    """
    if not isinstance(name, str):
        raise user_error(
            DropmaskTypeError,
            f"name must be a str, got {type(name).__name__}: {name!r}",
            "Pass the stream's name, e.g. 'dropout'.",
            caller="stream_id",
        )
    if not name.strip():
        raise user_error(
            DropmaskValueError,
            f"name must be a non-empty stream name, got {name!r}",
            "Pass the stream your model draws from, e.g. 'dropout'.",
            caller="stream_id",
        )
    return zlib.crc32(name.encode("utf-8"))


def stream_key(key: jax.Array, step: Any, name: str) -> jax.Array:
    """The key of stream ``name`` at ``step``: ``fold_in(fold_in(key, stream_id(name)), step)``.

    This is the only place the rule lives; :func:`step_key`, :func:`step_rngs` and
    ``TrainState.rngs`` all call it.

    Args:
      key: the stored scalar PRNG key (typed, or a raw ``uint32[2]`` key).
      step: an int or int32 scalar, possibly traced inside ``jit``.
      name: the stream name, e.g. ``'dropout'``.

    Returns:
      A scalar PRNG key of the same kind as ``key``.

    Example:
      >>> import jax
      >>> key = jax.random.key(0)
      >>> k = stream_key(key, 3, "dropout")
      >>> manual = jax.random.fold_in(jax.random.fold_in(key, stream_id("dropout")), 3)
      >>> bool((jax.random.key_data(k) == jax.random.key_data(manual)).all())
      True
    """
    return jax.random.fold_in(jax.random.fold_in(key, stream_id(name)), step)


def step_key(state: HasKeyAndStep, stream: str = "dropout") -> jax.Array:
    """This step's key for one stream: ``step_rngs(state, stream)[stream]``.

    Works on any state with ``key`` and ``step`` fields, including the hand-written
    ``class TrainState(train_state.TrainState): key: jax.Array`` of the Flax guide.

    Args:
      state: holds ``key`` (a scalar PRNG key) and ``step`` (an int or int32 scalar,
        possibly traced inside ``jit``).
      stream: the stream name; ``'dropout'`` by default.

    Returns:
      A scalar PRNG key of the same kind as ``state.key``, different for every step
      and stream.

    Example:
      >>> import jax
      >>> from types import SimpleNamespace
      >>> state = SimpleNamespace(key=jax.random.key(0), step=1)
      >>> a, b = step_key(state), step_rngs(state, "dropout", "lstm")["dropout"]
      >>> bool((jax.random.key_data(a) == jax.random.key_data(b)).all())
      True
    """
    return stream_key(state.key, state.step, stream)


def step_rngs(state: HasKeyAndStep, *names: str) -> dict[str, jax.Array]:
    """Independent per-step keys for several named PRNG streams, ready for ``apply``.

    Stream ``name`` gets :func:`stream_key` ``(state.key, state.step, name)``. Keys
    depend only on the name, not on the order or on which other names are requested.

    Args:
      state: holds ``key`` and ``step`` (see :func:`step_key`).
      *names: stream names, e.g. ``'dropout'``, ``'lstm'``.

    Returns:
      ``{name: key}`` with one scalar key per distinct name, for
      ``module.apply(variables, x, rngs=step_rngs(state, 'dropout', 'lstm'))``.

    Raises:
      DropmaskValueError: no names were given, or two names share a stream id.
      DropmaskTypeError: a name is not a string.

    Example:
      >>> import jax
      >>> from types import SimpleNamespace
      >>> state = SimpleNamespace(key=jax.random.key(0), step=3)
      >>> rngs = step_rngs(state, "dropout", "lstm")
      >>> sorted(rngs)
      ['dropout', 'lstm']
      >>> d, l = (jax.random.key_data(rngs[n]) for n in ("dropout", "lstm"))
      >>> bool((d != l).any())
      True
    """
    if not names:
        raise user_error(
            DropmaskValueError,
            "step_rngs needs at least one stream name, got none",
            "Pass the streams your model draws from, e.g. step_rngs(state, 'dropout').",
            caller=None,
        )
    ids = {name: stream_id(name) for name in names}
    if len(set(ids.values())) != len(ids):
        raise user_error(
            DropmaskValueError,
            f"two stream names share a CRC-32 id: {ids}",
            "Rename one of them.",
            caller=None,
        )
    return {name: stream_key(state.key, state.step, name) for name in ids}
