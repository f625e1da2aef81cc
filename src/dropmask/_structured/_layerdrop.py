"""LayerDrop: a whole layer skipped for the whole batch (Fan et al., 2019).

One decision per call, drawn through the one mask entry point, picks a branch of
``lax.cond``: a skipped layer costs nothing (its branch is not run), forward or
backward. Under ``vmap`` over keys ``lax.cond`` becomes a select and both branches run;
inside ``nn.scan`` / ``nnx.scan`` each layer draws from its own key, so layers are
skipped independently. At inference the paper prunes layers instead:
:func:`kept_layers` names the ones to keep.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from .._checks import check_callable, check_int, check_key, check_rate, concrete_value
from .._errors import DropmaskValueError, user_error
from .._random import draw, flags_only, probability

__all__ = [
    "check_returns_inputs",
    "keep_layer",
    "kept_layers",
    "layer_drop",
    "layer_drop_module",
]

T = TypeVar("T")


def keep_layer(rate: Any, key: Any, *, caller: str) -> jax.Array:
    """``bool[]``: whether the layer runs this call (True with probability ``1 - rate``).

    ``rate`` is validated by the caller. A traced ``rate`` outside ``[0, 1]`` runs
    nothing, as ``keep_mask`` keeps nothing there (an error under ``checkify``); what a
    skipped layer returns then is :func:`_skipped`'s.
    """
    check_key(key, caller=caller)
    p = probability(rate, None if isinstance(rate, jax.Array) else float(rate), keep=True,
                    caller=caller)  # fmt: skip
    return draw(key, (), p, "fast", flags_only, caller=caller)


def _skipped(inputs: Any, rate: Any) -> Any:
    """What a skipped layer returns: ``inputs``. For a run-time ``rate`` outside ``[0,
    1]`` (or NaN), NaN in each floating leaf instead, as :func:`dropmask.dropout` and
    the rest of the family give there; a leaf that cannot hold NaN (integers) is
    returned as it is. A static ``rate`` was checked: the inputs themselves."""
    if not isinstance(rate, jax.Array):
        return inputs
    r = jnp.asarray(rate, jnp.float32)

    def nan_where_floating(tree: Any) -> Any:
        # From the leaf, not a broadcast constant (see _dropout.dropped_value).
        return jax.tree.map(
            lambda t: t * jnp.array(jnp.nan, t.dtype) if jnp.issubdtype(t.dtype, jnp.inexact)
            else t,
            tree,
        )  # fmt: skip

    return lax.cond((r >= 0) & (r <= 1), lambda t: t, nan_where_floating, inputs)


def check_returns_inputs(inputs: Any, outputs: Any, *, caller: str) -> None:
    """Raises unless ``outputs`` (arrays or shape structs) have the structure, shapes and
    dtypes of ``inputs``: a skipped layer returns its inputs, so a layer that changes them
    cannot be skipped."""
    given = jax.eval_shape(lambda t: t, inputs)
    out = jax.eval_shape(lambda t: t, outputs)
    if jax.tree.structure(out) != jax.tree.structure(given) or any(
        (a.shape, a.dtype) != (b.shape, b.dtype)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(given), strict=True)
    ):
        raise user_error(
            DropmaskValueError,
            "layer must return what it is given (a skipped layer returns its inputs), got "
            f"inputs {given} and outputs {out}",
            "Wrap the layer so that it maps the residual stream to itself.",
            caller=caller,
        )


def _check_layer(layer: Any, caller: str) -> None:
    check_callable(
        layer,
        caller=caller,
        name="layer",
        what="a callable (inputs -> outputs of the same shape)",
        fix="Pass e.g. lambda h: block(h, mask).",
    )


def layer_drop(
    layer: Callable[[T], T],
    inputs: T,
    rate: float | jax.Array,
    key: Any = None,
    *,
    deterministic: bool = False,
) -> T:
    """``layer(inputs)``, or ``inputs`` itself with probability ``rate``, for the whole batch.

    A skipped layer is not computed (``lax.cond``). The layer is the whole residual
    block, ``x -> x + f(x)``, so that skipping it leaves the residual stream as it was;
    nothing is rescaled, as in the paper.

    Args:
      layer: ``inputs -> outputs`` with the structure, shapes and dtypes of ``inputs``.
      inputs: an array or a pytree of arrays, e.g. ``x: [batch, time, features]``.
      rate: probability of skipping the layer (a Python float or a JAX scalar). A
        traced rate outside ``[0, 1]`` (or NaN) gives NaN in every floating output, as
        dropout does, without running the layer; an error under
        ``checkify.checkify(f, errors=checkify.user_checks)``.
      key: PRNG key (needed in training mode).
      deterministic: if True, run the layer.

    Returns:
      ``layer(inputs)`` or ``inputs``.

    Raises:
      DropmaskTypeError: ``layer`` is not callable.
      DropmaskValueError: ``layer``'s outputs differ from ``inputs`` in structure, shape
        or dtype, at any rate and in evaluation too (a layer that only works unskipped
        would fail the first time it is skipped).
      DropmaskError: the rate and key errors of :func:`dropmask.dropout`.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> x = jnp.ones((2, 3))
      >>> y = dropmask.layer_drop(lambda h: h + 1.0, x, 0.5, jax.random.key(0))
      >>> bool((y == x).all() or (y == x + 1.0).all())
      True
    """
    caller = "layer_drop"
    _check_layer(layer, caller)
    value = check_rate(rate, caller=caller)
    if deterministic or value == 0.0:
        if key is not None:
            check_key(key, caller=caller)
        outputs = layer(inputs)
        check_returns_inputs(inputs, outputs, caller=caller)
        return outputs
    check_key(key, caller=caller)
    check_returns_inputs(inputs, jax.eval_shape(layer, inputs), caller=caller)
    if value == 1.0:
        return inputs
    keep = keep_layer(rate, key, caller=caller)
    return lax.cond(keep, layer, lambda t: _skipped(t, rate), inputs)


def layer_drop_module(
    layer: Any,
    inputs: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    rate: Any,
    key: Any,
    deterministic: bool,
    cond: Callable[..., Any],
    *,
    caller: str,
    eval_shape: Callable[..., Any] | None = None,
) -> Any:
    """The call of a Linen or NNX ``LayerDrop``: ``layer(inputs, *args, **kwargs)``, or
    ``inputs`` (:func:`_skipped`'s, for a run-time rate).

    ``key`` is None when the layer's front end draws nothing (evaluation, or a rate of 0
    or 1); else one decision is drawn and ``cond`` (``nn.cond`` or ``nnx.cond``, which
    take the module as their first operand) runs one branch. Wherever the layer runs,
    its outputs must match ``inputs`` (:func:`check_returns_inputs`), in every mode; at
    rate 1 ``eval_shape`` (``nnx.eval_shape``) gives them without running it, and None
    leaves the check to the front end (Linen's ``init`` runs the layer at every rate).
    """

    def run(module: Any, x: Any, *a: Any) -> Any:
        # Checked where the layer is traced, also inside cond's branch, before cond
        # compares its branches' types (whose error would not name LayerDrop).
        out = module(x, *a, **kwargs)
        check_returns_inputs(x, out, caller=caller)
        return out

    if key is None:
        if deterministic or concrete_value(rate) != 1.0:
            return run(layer, inputs, *args)
        if eval_shape is not None:
            shapes = eval_shape(lambda m, x, *a: m(x, *a, **kwargs), layer, inputs, *args)
            check_returns_inputs(inputs, shapes, caller=caller)
        return inputs
    keep = keep_layer(rate, key, caller=caller)
    return cond(keep, run, lambda module, x, *a: _skipped(x, rate), layer, inputs, *args)


def kept_layers(num_layers: int, rate: float) -> tuple[int, ...]:
    """The layers to keep when pruning a model trained with LayerDrop at ``rate``.

    Up to ``rate = 0.5``, the paper's "every other" rule: with ``k = floor(1 / rate)``,
    drop the layers at depth ``d = k, 2k, ...`` (counting from 1) and keep the rest; at
    ``rate = 0.5`` that keeps layers 0, 2, 4, ... (fairseq's ``--encoder-layers-to-keep
    0,2,4``). Above 0.5 that rule would remove every layer; instead ``num_layers * (1 -
    rate)`` layers (rounded, halves up) are kept, at least one, evenly spaced from layer
    0 (layer ``floor(i * num_layers / kept)`` for ``i < kept``). A pruned model always
    keeps at least one layer.

    Args:
      num_layers: the model's depth.
      rate: the pruning rate in ``(0, 1)``: the fraction of layers to remove.

    Returns:
      Indices (from 0) of the layers to keep, ascending, never empty.

    Raises:
      DropmaskValueError: ``num_layers < 1`` or ``rate`` not in ``(0, 1)``.

    Example:
      >>> import dropmask
      >>> dropmask.kept_layers(6, 0.5), dropmask.kept_layers(8, 0.25)
      ((0, 2, 4), (0, 1, 2, 4, 5, 6))
      >>> dropmask.kept_layers(6, 0.75), dropmask.kept_layers(2, 0.9)
      ((0, 3), (0,))
    """
    caller = "kept_layers"
    check_int(num_layers, name="num_layers", caller=caller, minimum=1, shape=True)
    value = check_rate(rate, caller=caller)
    if value is None or not 0.0 < value < 1.0:
        raise user_error(
            DropmaskValueError,
            "rate must be a Python float in (0, 1) (the fraction of layers to prune), got "
            f"{rate!r}",
            "Pass e.g. rate=0.5 to keep every other layer.",
            caller=caller,
        )
    if value <= 0.5:
        every = math.floor(1.0 / value + 1e-9)
        return tuple(i for i in range(num_layers) if (i + 1) % every)
    kept = max(1, math.floor(num_layers * (1.0 - value) + 0.5))
    return tuple(i * num_layers // kept for i in range(kept))
