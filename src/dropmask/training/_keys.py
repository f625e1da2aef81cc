"""Per-step PRNG keys for training loops: ``fold_in(key, step)``, per named stream.

Folding the step number into one stored key (rather than splitting and storing a
new key every step) keeps the key in the train state constant, so a step can be
re-run or resumed from a checkpoint and draw exactly the same masks.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

import jax

__all__ = ["step_key", "step_rngs", "stream_id"]


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
      TypeError: ``name`` is not a string.

    Example:
      >>> stream_id("dropout") == stream_id("dropout") != stream_id("lstm")
      True
    """
    if not isinstance(name, str):
        raise TypeError(f"a PRNG stream name must be a str, got {type(name).__name__}: {name!r}.")
    return zlib.crc32(name.encode("utf-8"))


def step_key(state: HasKeyAndStep) -> jax.Array:
    """The key for the current step: ``jax.random.fold_in(state.key, state.step)``.

    Works on any state with ``key`` and ``step`` fields, including the hand-written
    ``class TrainState(train_state.TrainState): key: jax.Array`` of the Flax guide.

    Args:
      state: holds ``key`` (a scalar PRNG key) and ``step`` (an int or int32 scalar,
        possibly traced inside ``jit``).

    Returns:
      A scalar PRNG key of the same kind as ``state.key``, different for every step.

    Example:
      >>> import jax
      >>> from types import SimpleNamespace
      >>> key = jax.random.key(0)
      >>> a = step_key(SimpleNamespace(key=key, step=0))
      >>> b = step_key(SimpleNamespace(key=key, step=1))
      >>> bool((jax.random.key_data(a) != jax.random.key_data(b)).any())
      True
    """
    return jax.random.fold_in(state.key, state.step)


def step_rngs(state: HasKeyAndStep, *names: str) -> dict[str, jax.Array]:
    """Independent per-step keys for several named PRNG streams, ready for ``apply``.

    Stream ``name`` gets ``fold_in(fold_in(state.key, stream_id(name)), state.step)``:
    each stream has its own root key, and the step is folded into it exactly as the
    Flax guide does for a single ``'dropout'`` key. Keys depend only on the name, not
    on the order or on which other names are requested.

    Args:
      state: holds ``key`` and ``step`` (see :func:`step_key`).
      *names: stream names, e.g. ``'dropout'``, ``'lstm'``.

    Returns:
      ``{name: key}`` with one scalar key per distinct name, for
      ``module.apply(variables, x, rngs=step_rngs(state, 'dropout', 'lstm'))``.

    Raises:
      ValueError: no names were given, or two names hash to the same stream id.
      TypeError: a name is not a string.

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
        raise ValueError(
            "step_rngs needs at least one stream name, got none. "
            "Pass the streams your model draws from, e.g. step_rngs(state, 'dropout')."
        )
    ids = {name: stream_id(name) for name in names}
    if len(set(ids.values())) != len(ids):
        raise ValueError(f"two stream names share a CRC-32 id: {ids}. Rename one of them.")
    return {
        name: jax.random.fold_in(jax.random.fold_in(state.key, sid), state.step)
        for name, sid in ids.items()
    }
