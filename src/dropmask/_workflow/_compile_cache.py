"""Runs of one config share each jitted step's compilation, whatever their seed.

A jitted ``train_step(state, batch)`` compiles once per distinct *static* part of
``state``: the fields that are not arrays (``apply_fn``, ``tx``), which JAX compares by
equality. Two calls of ``optax.adam(1e-3)`` return transformations made of different
closures, and two Linen modules built alike give bound ``apply`` methods that compare
unequal, so two runs that each build their model and optimizer compile the same
program twice. :meth:`Example.build_state`, which the loop builds every state with,
therefore keeps, per process, the static part of the first state built for each
config (its per-run entries left out) and gives it to every later state of that
config: a second seed, or a resumed run, reuses the compilation.

This relies on the :class:`~dropmask.training.Example` contract that ``create_state``
builds its ``apply_fn``, ``tx`` and any other static field from the config alone,
never from the entries in :data:`PER_RUN_ENTRIES` (``seed`` among them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from .._errors import DropmaskValueError, user_error
from ._entries import PER_RUN_ENTRIES

__all__ = ["config_key", "share_static_fields"]


@dataclasses.dataclass(frozen=True)
class _FirstState:
    """What the cache keeps of the first state of a config: no arrays, only structure."""

    treedef: Any
    layout: tuple[tuple[str, tuple[int, ...], str], ...]


# One per process, as JAX's own compilation cache: (create_state, config) -> first state.
_FIRST: dict[tuple[Callable[..., Any], Hashable], _FirstState] = {}


def _frozen(value: Any) -> Hashable:
    """A hashable stand-in for a config value that keeps its type (``(1,)`` is not ``[1]``)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


def config_key(config: ml_collections.ConfigDict) -> Hashable:
    """The config with :data:`PER_RUN_ENTRIES` left out, as a dictionary key."""
    entries = config.to_dict()
    return _frozen({k: v for k, v in entries.items() if k not in PER_RUN_ENTRIES})


def _layout(leaves: list[tuple[Any, Any]]) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    return tuple(
        (jax.tree_util.keystr(path), tuple(np.shape(x)), str(getattr(x, "dtype", type(x))))
        for path, x in leaves
    )


def _root_type(treedef: Any) -> type | None:
    data = treedef.node_data()
    return None if data is None else data[0]


def share_static_fields(
    create_state: Callable[..., Any], config: ml_collections.ConfigDict, state: Any, name: str
) -> Any:
    """``state`` with the static fields of the first state built for ``config``.

    The first state of a config (:data:`PER_RUN_ENTRIES` left out) is returned as it
    is and remembered; a later one gets its ``apply_fn``, ``tx`` and every other
    non-pytree field, and keeps its own arrays (parameters, optimizer state, key,
    step), so that jitted functions of the state hit their compilation cache.

    Args:
      create_state: the example's ``create_state``, which built ``state``.
      config: the run's config.
      state: the state ``create_state`` returned (a pytree).
      name: the example's name, for the message.

    Returns:
      A state equal to ``state`` in every array.

    Raises:
      DropmaskValueError: ``state`` differs from the first state of the same config
        in its structure, or in the shape or dtype of an array: ``create_state`` then
        builds its model or optimizer from something besides the config (a
        per-run entry such as ``seed``, or a global), which the sharing would hide.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    layout = _layout(leaves)
    first = _FIRST.setdefault((create_state, config_key(config)), _FirstState(treedef, layout))
    if first.treedef == treedef:
        return state
    if first.layout != layout or _root_type(treedef) is not _root_type(first.treedef):
        where = next(
            (
                f"{a[0]} is {a[2]}{list(a[1])}, then {b[2]}{list(b[1])}"
                for a, b in zip(first.layout, layout, strict=False)
                if a != b
            ),
            f"{len(first.layout)} arrays, then {len(layout)}",
        )
        raise user_error(
            DropmaskValueError,
            f"example {name!r} built two different states for one config ({where})",
            "create_state must build its model and optimizer from the config alone, not from a "
            f"per-run entry ({', '.join(PER_RUN_ENTRIES)}) nor from a global: runs of one config "
            "share the first state's apply_fn and tx, and so one compilation. Make that setting "
            "a config entry.",
            caller="train",
        )
    return jax.tree_util.tree_unflatten(first.treedef, [x for _, x in leaves])
