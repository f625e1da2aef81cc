"""``swap_dropout``: a built NNX model's Flax dropout replaced by dropmask's, in place.

Each ``flax.nnx.Dropout`` (or a subclass that only changes the constructor, as
MaxText's does) becomes a :class:`dropmask.nnx.Dropout` holding the very same random
stream object (an ``RngStream``, or the ``Rngs`` such a subclass keeps), so the model's
state (its paths, shapes and values) is what it was: ``split_rngs``, ``StateAxes``,
stacked layers' leading key axes and checkpoints of the state all carry over. Only the
graph's static part changes. Shared references stay shared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
from flax import nnx

from .._checks import check_impl, check_instance, is_concrete
from .._errors import DropmaskTypeError, DropmaskValueError, user_error
from .._layer_specs import swapped_attention_fn
from .._random import DEFAULT_IMPL, Impl

__all__ = ["Replaced", "swap_dropout"]

_CALLER = "dropmask.nnx.swap_dropout"
# What nnx.Dropout keeps; a subclass keeping more (or calling differently) is not swapped.
_DROPOUT_FIELDS = frozenset({"rate", "broadcast_dims", "deterministic", "rng_collection", "rngs"})


@dataclasses.dataclass(frozen=True)
class Replaced:
    """One thing :func:`swap_dropout` changed.

    Attributes:
      path: where it sits in the model, e.g. ``'blocks/0/dropout'`` (a shared module:
        its first path).
      kind: ``'dropout'`` (the module became :class:`dropmask.nnx.Dropout`) or
        ``'attention'`` (its ``attention_fn`` became :func:`dropmask.dot_product_attention`;
        with ``impl="flax"``, a new object calling Flax's own).
      module: the original module's class name.

    Example:
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> dnnx.swap_dropout(nnx.Sequential(nnx.Dropout(0.1, rngs=nnx.Rngs(0))))
      (Replaced(path='layers/0', kind='dropout', module='Dropout'),)
    """

    path: str
    kind: str
    module: str


def _path(parts: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in parts)


def _children(node: Any) -> Iterator[tuple[Any, Any]]:
    """``(key, child)`` for each direct child of a module or container of the graph."""
    if isinstance(node, nnx.Module):
        yield from nnx.iter_children(node)
    elif isinstance(node, list | tuple):
        yield from enumerate(node)
    elif isinstance(node, dict):
        yield from node.items()


def _own_fields(module: nnx.Dropout) -> set[str]:
    return {name for name in vars(module) if not name.startswith("_")}


def _check_dropout(module: nnx.Dropout, path: str) -> None:
    """Refuses a subclass whose swap would change what it does or what state it has."""
    cls = type(module)
    where = f"{path or 'the model'} ({cls.__name__})"
    if cls.__call__ is not nnx.Dropout.__call__:
        raise user_error(
            DropmaskTypeError,
            f"{where} must call as flax.nnx.Dropout does, got a subclass with its own __call__",
            "Replace it with dropmask.nnx.Dropout in the model.",
            caller=_CALLER,
        )
    extra = _own_fields(module) - _DROPOUT_FIELDS
    if extra:
        raise user_error(
            DropmaskTypeError,
            f"{where} must hold only flax.nnx.Dropout's fields, got also {sorted(extra)}",
            "Replace it with dropmask.nnx.Dropout in the model.",
            caller=_CALLER,
        )


def _replacement(old: nnx.Dropout, impl: Impl) -> nnx.Module:
    # The layers' package imports this module: its Dropout is taken when a swap runs.
    from . import Dropout

    new = Dropout(
        old.rate,
        broadcast_dims=old.broadcast_dims,
        deterministic=old.deterministic,
        rng_collection=old.rng_collection,
        rngs=None,
        impl=impl,
    )
    new.rngs = old.rngs  # the same stream object: state and sharing unchanged
    return new


def _default_attention(node: Any) -> bool:
    return (
        isinstance(node, nnx.MultiHeadAttention)
        and vars(node).get("attention_fn") is nnx.dot_product_attention
    )


def _check_not_traced(model: nnx.Module) -> None:
    if not all(is_concrete(x) for x in jax.tree.leaves(nnx.state(model))):
        raise user_error(
            DropmaskValueError,
            "model must be concrete, got one whose state is traced (inside jit, grad, vmap or "
            "scan)",
            "Swap the model once, eagerly, before the step.",
            caller=_CALLER,
        )


def swap_dropout(
    model: nnx.Module, impl: Impl = DEFAULT_IMPL, *, attention: bool = False
) -> tuple[Replaced, ...]:
    """Replaces, in place, every ``flax.nnx.Dropout`` of ``model`` by dropmask's.

    Each ``nnx.Dropout`` (and each subclass that changes only the constructor, as
    MaxText's, which keeps an ``nnx.Rngs``) becomes :class:`dropmask.nnx.Dropout` with
    its ``rate``, ``broadcast_dims``, ``deterministic``, ``rng_collection`` and the very
    same random stream: ``nnx.state(model)`` keeps its paths, shapes and values, so
    ``split_rngs``, ``StateAxes``, ``train()`` / ``eval()``, ``nnx.view``, stacked
    layers and checkpoints of the state work as before. With ``impl="flax"`` every
    output and gradient is bit-identical to the unswapped model's (a swapped attention
    module then calls Flax's own ``dot_product_attention``: only the routing is
    proven). Run it once, eagerly, after building (or restoring) the model and before
    the train step.

    Args:
      model: the model, changed in place.
      impl: the mask generator of the new layers, as in :class:`Dropout`.
      attention: also give every ``flax.nnx.MultiHeadAttention`` whose
        ``attention_fn`` is Flax's default :func:`dropmask.dot_product_attention`
        (with the same ``impl``). With ``impl="fast"`` it differs from Flax's in one
        place: a query with no valid key (a fully padded row) attends to nothing, so
        the module outputs its output projection's bias there (Flax: the projected
        mean of the values); every other output and gradient, without dropout, is
        Flax's within float rounding. With dropout the masks differ.

    Returns:
      What was replaced, in the order ``nnx.iter_graph`` visits it; empty when
      nothing was.

    Raises:
      DropmaskTypeError: ``model`` is not an ``nnx.Module``, or a dropout subclass
        has its own ``__call__`` or fields (nothing is changed then).
      DropmaskValueError: ``model`` is traced (inside ``jit``, ``grad``, ...).

    Example:
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> class MLP(nnx.Module):
      ...     def __init__(self, rngs):
      ...         self.linear = nnx.Linear(4, 8, rngs=rngs)
      ...         self.dropout = nnx.Dropout(0.5, rngs=rngs)
      >>> model = MLP(nnx.Rngs(0, dropout=1))
      >>> [r.path for r in dnnx.swap_dropout(model)]
      ['dropout']
      >>> type(model.dropout).__module__
      'dropmask.nnx'
    """
    check_instance(
        model,
        nnx.Module,
        caller=_CALLER,
        name="model",
        what="an nnx.Module",
        fix="For Linen, wrap the call in dropmask.linen.swap_dropout().",
    )
    check_impl(impl, caller=_CALLER)
    check_instance(
        attention, bool, caller=_CALLER, name="attention", what="a bool", fix="Pass True or False."
    )
    _check_not_traced(model)
    if isinstance(model, nnx.Dropout):
        raise user_error(
            DropmaskTypeError,
            f"model must hold its dropout layers, got a {type(model).__name__} itself",
            "Build dropmask.nnx.Dropout directly.",
            caller=_CALLER,
        )
    nodes = [(parts, node) for parts, node in nnx.iter_graph(model)]
    for parts, node in nodes:
        if isinstance(node, tuple) and any(isinstance(c, nnx.Dropout) for c in node):
            raise user_error(
                DropmaskTypeError,
                f"{_path(parts)} must be a list to swap the dropout layers it holds, got a tuple",
                "Hold them in an nnx.List.",
                caller=_CALLER,
            )
    dropouts = {
        id(node): (_path(parts), node) for parts, node in nodes if isinstance(node, nnx.Dropout)
    }
    for path, node in dropouts.values():
        _check_dropout(node, path)  # all checked before anything changes
    new = {key: _replacement(node, impl) for key, (_, node) in dropouts.items()}
    done: list[Replaced] = []
    for parts, node in nodes:
        if id(node) in dropouts:  # iter_graph visits a shared node once
            done.append(Replaced(_path(parts), "dropout", type(node).__name__))
        if attention and _default_attention(node):
            node.attention_fn = swapped_attention_fn(impl, nnx.dot_product_attention)
            done.append(Replaced(_path(parts), "attention", type(node).__name__))
        for key, child in list(_children(node)):
            if id(child) in new and isinstance(child, nnx.Dropout):
                if hasattr(type(node), "__setitem__"):
                    node[key] = new[id(child)]
                else:
                    setattr(node, key, new[id(child)])
    return tuple(done)
