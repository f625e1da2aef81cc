"""``swap_dropout``: Flax's Linen dropout routed through dropmask without editing a model.

Built on Flax's public ``nn.intercept_methods``. While a swap is active, each call of
``flax.linen.Dropout.__call__`` (the method itself, so a subclass that calls
``super().__call__`` is routed once, after its own code) runs a
:class:`dropmask.linen.Dropout` with the module's fields, bound to the module's own
scope: its ``make_rng`` draws the key Flax's would draw, at the same place, from the
same counter. With ``attention=True``, a ``MultiHeadDotProductAttention`` whose
``attention_fn`` is Flax's default runs as a clone of itself, bound to the same
scope, whose ``attention_fn`` is :func:`dropmask.dot_product_attention` (with
``impl="flax"``: Flax's own function, as a new object).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn

from .._checks import check_impl, check_instance
from .._layer_specs import swapped_attention_fn
from .._random import DEFAULT_IMPL, Impl

__all__ = ["swap_dropout", "swapped"]

_CALLER = "dropmask.linen.swap_dropout"
# The function behind Flax's wrapped ``Dropout.__call__``: what an interceptor's
# ``orig_method`` holds for that method, whichever subclass the module is.
_FLAX_DROPOUT_CALL = nn.Dropout.__call__.__wrapped__  # pyright: ignore[reportFunctionMemberAccess]


@dataclasses.dataclass(frozen=True, eq=False)  # each swap is itself, however configured
class _Swap:
    impl: Impl
    attention: bool


class _PerThread(threading.local):
    """A stack of this thread's own (Flax's interceptors are per thread too)."""

    def __init__(self) -> None:
        self.stack: list[Any] = []


_active = _PerThread()  # the swaps active in this thread, innermost last


def _is_flax_dropout_call(context: Any) -> bool:
    return getattr(context.orig_method, "func", None) is _FLAX_DROPOUT_CALL


def _is_default_attention(module: Any) -> bool:
    return (
        isinstance(module, nn.MultiHeadDotProductAttention)
        and module.attention_fn is nn.dot_product_attention
    )


def swapped(module: nn.Module) -> bool:
    """Whether a call of ``module`` made now runs through dropmask instead of Flax.

    True inside :func:`swap_dropout` for a ``flax.linen.Dropout`` (or subclass), and,
    with ``attention=True``, for a ``MultiHeadDotProductAttention`` with Flax's default
    ``attention_fn``. An interceptor of one's own (the audit's) asks this to observe
    the dropmask call that runs in its place, at the same path, rather than both.

    Example:
      >>> import flax.linen as nn
      >>> from dropmask import linen as dl
      >>> with dl.swap_dropout():
      ...     print(dl.swapped(nn.Dropout(0.1)), dl.swapped(nn.Dense(3)))
      True False
      >>> dl.swapped(nn.Dropout(0.1))  # no swap active
      False
    """
    if not _active.stack:
        return False
    swap = _active.stack[-1]
    return isinstance(module, nn.Dropout) or (swap.attention and _is_default_attention(module))


def _dropout(module: nn.Dropout, swap: _Swap, args: Any, kwargs: Any) -> Any:
    # The layers' package imports this module: its Dropout is taken when a call runs.
    from . import Dropout

    layer = Dropout(
        rate=module.rate,
        broadcast_dims=module.broadcast_dims,
        deterministic=module.deterministic,
        rng_collection=module.rng_collection,
        impl=swap.impl,
        parent=module.scope,  # pyright: ignore[reportArgumentType]  # Flax's bind does this
        name=module.name,
    )
    return layer(*args, **kwargs)


def _attention(module: nn.MultiHeadDotProductAttention, swap: _Swap, args: Any, kwargs: Any) -> Any:
    fn = swapped_attention_fn(swap.impl, nn.dot_product_attention)
    # Fields are frozen, so the module runs as a clone of itself that differs only in
    # attention_fn, bound to the module's scope: same parameters, same dropout key.
    clone = module.clone(parent=module.scope, attention_fn=fn)
    return clone(*args, **kwargs)


def _interceptor(swap: _Swap) -> Callable[..., Any]:
    def intercept(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        # Only the innermost swap routes; an outer one passes the call on, through any
        # interceptor registered in between, to it.
        if _active.stack and _active.stack[-1] is swap:
            if _is_flax_dropout_call(context):
                return _dropout(context.module, swap, args, kwargs)
            attention = context.method_name == "__call__" and _is_default_attention(context.module)
            if swap.attention and attention:
                return _attention(context.module, swap, args, kwargs)
        return next_fun(*args, **kwargs)

    return intercept


@contextlib.contextmanager
def _swapping(swap: _Swap) -> Iterator[None]:
    _active.stack.append(swap)
    try:
        with nn.intercept_methods(_interceptor(swap)):
            yield
    finally:
        _active.stack.remove(swap)


class _Switch(contextlib.ContextDecorator, contextlib.AbstractContextManager[None]):
    """What :func:`swap_dropout` returns. Each entry is a swap of its own, left by the
    matching exit, so one object may be entered again: nested, in turn, or by a
    decorated function that calls itself."""

    def __init__(self, impl: Impl, attention: bool) -> None:
        self._impl: Impl = impl
        self._attention = attention
        self._entries = _PerThread()  # this object's entries not yet left, innermost last

    def __enter__(self) -> None:
        entry = _swapping(_Swap(self._impl, self._attention))
        entry.__enter__()
        self._entries.stack.append(entry)

    def __exit__(self, *exc: Any) -> None:
        self._entries.stack.pop().__exit__(*exc)


def swap_dropout(
    impl: Impl = DEFAULT_IMPL, *, attention: bool = False
) -> contextlib.AbstractContextManager[None]:
    """Routes every ``flax.linen.Dropout`` call made while active through dropmask.

    A context manager, and a decorator too. Each call of ``flax.linen.Dropout`` (and
    of a subclass, once, where it calls ``super().__call__``) runs
    :class:`dropmask.linen.Dropout` with the module's ``rate``, ``broadcast_dims``,
    ``deterministic`` (merged with the call's as Flax does), ``rng_collection`` and the
    call's ``rng``; the key is drawn by the module's own ``make_rng`` where Flax draws
    it. With ``impl="flax"`` outputs and gradients are bit-identical to not swapping
    (a routed attention module then calls Flax's own ``dot_product_attention``: only
    the routing is proven). Routing happens when a model is traced: wrap the
    ``apply`` (or the jitted step's first call), not only a later call of a compiled
    function.

    Nested swaps: the innermost one decides. dropmask's own layers are not affected.
    One object may be entered again, nested or in turn (or by a decorated function
    that calls itself); each exit restores what its entry found.

    Args:
      impl: the mask generator of the routed layers, as in :class:`Dropout`.
      attention: also route ``flax.linen.MultiHeadDotProductAttention`` (and
        subclasses) whose ``attention_fn`` is Flax's default through
        :func:`dropmask.dot_product_attention`, with the module's ``dropout_rate``,
        ``broadcast_dropout`` and dropout key. With ``impl="fast"`` it differs from
        Flax's in one place: a query with no valid key (a fully padded row) attends
        to nothing, so the module outputs its output projection's bias there (Flax:
        the projected mean of the values); every other output and gradient, without
        dropout, is Flax's within float rounding. With dropout the masks differ.

    Example:
      >>> import flax.linen as nn, jax, jax.numpy as jnp
      >>> from dropmask import linen as dl
      >>> layer = nn.Dropout(0.5, deterministic=False)
      >>> with dl.swap_dropout(impl="flax"):
      ...     y = layer.apply({}, jnp.ones(4), rngs={"dropout": jax.random.key(0)})
      >>> bool((y == layer.apply({}, jnp.ones(4), rngs={"dropout": jax.random.key(0)})).all())
      True
    """
    check_impl(impl, caller=_CALLER)
    check_instance(
        attention, bool, caller=_CALLER, name="attention", what="a bool", fix="Pass True or False."
    )
    return _Switch(impl, attention)
