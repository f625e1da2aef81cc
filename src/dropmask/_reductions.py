"""NaN-safe masked reductions, softmax and cross-entropy.

The contract, for values and gradients alike:

* Masked elements never influence a result, whatever they hold (NaN, inf).
  Every function first replaces masked elements with a harmless value
  (``jnp.where(mask, x, safe)``) and masks again after any op whose derivative
  could be non-finite there: the "double where" pattern, so gradients at masked
  positions are exactly 0 and ``jax_debug_nans`` stays quiet.
* A row with no valid element returns a documented value, never NaN, with finite
  (zero) gradients: sum -> 0; mean, var, std, max, min -> ``fill`` (default 0);
  logsumexp -> ``fill`` (default -inf, i.e. log 0); softmax -> all zeros;
  log_softmax -> ``fill`` (default 0) at every masked position.
* float16 / bfloat16 inputs are reduced in float32 and returned in the input dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._checks import (
    check_choice,
    check_int_at_least,
    check_label_range,
    check_scalar,
    normalize_axes,
)
from ._errors import AxisError, DropmaskValueError, DtypeError, MaskShapeError, user_error
from ._masks import as_array, broadcast_mask
from ._random import loop_zero, sharded_as

__all__ = [
    "masked_cross_entropy",
    "masked_log_softmax",
    "masked_logsumexp",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_softmax",
    "masked_std",
    "masked_sum",
    "masked_var",
]

Axis = int | Sequence[int] | None


# ----------------------------------------------------------------- boundary checks


def _check_dtype(x: jax.Array, caller: str, *, integers: bool) -> None:
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    integer = jnp.issubdtype(x.dtype, jnp.integer)
    if floating or (integers and integer):
        return
    kinds = "a floating or integer" if integers else "a floating-point"
    raise user_error(
        DtypeError,
        f"{caller} expects {kinds} array, got dtype {x.dtype}",
        "Cast it first, e.g. x.astype(jnp.float32).",
        caller=None,
    )


def _axes(axis: Axis, ndim: int, caller: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, Sequence) else (axis,)
    if ndim == 0 and len(axes):
        raise user_error(
            AxisError,
            f"x is 0-d (a scalar), so it has no axis {axis!r} to reduce",
            "Pass axis=None (or axis=()) to reduce a scalar, or give x a dimension.",
            caller=caller,
        )
    return normalize_axes(axes, ndim, name=f"{caller}: axis")


def _check_complex(x: jax.Array, caller: str, *, complex_ok: bool) -> bool:
    """True for a complex ``x`` the caller supports; raises for the others.

    The generic dtype message would suggest a cast to float32, which silently drops
    the imaginary part.
    """
    if not jnp.issubdtype(x.dtype, jnp.complexfloating):
        return False
    if complex_ok:
        return True
    raise user_error(
        DtypeError,
        f"{caller} needs real values, got dtype {x.dtype}",
        "Reduce a real view explicitly, e.g. jnp.abs(x) or x.real (masked_sum and masked_mean "
        "accept complex x).",
        caller=None,
    )


def _prepare(
    x: Any,
    mask: Any,
    axis: Axis,
    caller: str,
    *,
    integers: bool = False,
    complex_ok: bool = False,
) -> tuple[jax.Array, jax.Array, tuple[int, ...]]:
    x = as_array(x)
    if not _check_complex(x, caller, complex_ok=complex_ok):
        _check_dtype(x, caller, integers=integers)
    axes = _axes(axis, x.ndim, caller)
    if isinstance(mask, list | tuple):  # like x, a nested list is read as an array
        mask = np.asarray(mask)
    m = broadcast_mask(mask, x.shape, caller=caller)
    # Tied to x: a mask that is the same for every step of a differentiated scan (a
    # batch's padding, in a scan over layers) is not computed whole before the loop.
    return x, m | (loop_zero(jnp.real(x)) != 0), axes


def fill_where(m: jax.Array, x: jax.Array, value: Any) -> jax.Array:
    """``jnp.where(m, x, value)`` in ``x``'s dtype for a scalar ``value``, the fill built
    from the mask (``m``'s False is 0): not a broadcast constant, which a differentiated
    scan would compute whole before its loop (``loop_zero``). Its derivative is the same
    select of the tangents, so no zero tangent of ``x``'s size is built either."""
    value = jnp.asarray(value, x.dtype)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return _filled(m, x, value)
    return _fill_differentiable(m, x, value)


def _filled(m: jax.Array, x: jax.Array, value: jax.Array) -> jax.Array:
    m = sharded_as(m, x)
    return jnp.where(m, x, m.astype(x.dtype) + value)


@jax.custom_jvp
def _fill_differentiable(m: jax.Array, x: jax.Array, value: jax.Array) -> jax.Array:
    return _filled(m, x, value)


@_fill_differentiable.defjvp
def _fill_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[jax.Array, jax.Array]:
    m, x, value = primals
    _, dx, dvalue = tangents
    return _filled(m, x, value), _filled(m, dx, dvalue)


def _check_fill(fill: Any, caller: str) -> None:
    check_scalar(fill, caller=caller, name="fill")


def compute_dtype(dtype: Any) -> Any:
    """The dtype a floating reduction runs in: float32 for 16-bit floats."""
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.float32
    return dtype


def _result_float(dtype: Any) -> Any:
    """Mean-like results: inexact dtypes are kept, integers give the default float."""
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.result_type(float)


def _squeeze(a: jax.Array, axes: tuple[int, ...], keepdims: bool) -> jax.Array:
    return a if keepdims else jnp.squeeze(a, axes)


# ----------------------------------------------------------------- sum, mean, var, std


def masked_sum(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = None,
    *,
    keepdims: bool = False,
) -> jax.Array:
    """Sum of the valid elements of ``x``.

    Args:
      x: floating, complex or integer ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to reduce; None reduces all.
      keepdims: keep reduced axes with size 1.

    Returns:
      The sum over valid elements, 0 for a row with none. Floats and complex keep
      their dtype (16-bit floats accumulate in float32); integers follow ``jnp.sum``.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.array([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]])
      >>> dropmask.masked_sum(x, x != 0, axis=-1).tolist()
      [6, 9, 30]
    """
    x, m, axes = _prepare(x, mask, axis, "masked_sum", integers=True, complex_ok=True)
    xs = fill_where(m, x, 0)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.sum(xs, axis=axes, keepdims=keepdims)
    acc = compute_dtype(x.dtype)
    return jnp.sum(xs.astype(acc), axis=axes, keepdims=keepdims).astype(x.dtype)


def masked_mean(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = None,
    *,
    keepdims: bool = False,
    fill: jax.typing.ArrayLike = 0.0,
) -> jax.Array:
    """Mean of the valid elements of ``x``; ``fill`` for a row with none.

    Unlike ``jnp.mean(x, where=mask)`` an empty row is not NaN, and its gradient is 0.

    Args:
      x: floating, complex or integer ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to reduce; None reduces all.
      keepdims: keep reduced axes with size 1.
      fill: scalar returned for a row with no valid element.

    Returns:
      The masked mean, in ``x``'s dtype (the default float for integer ``x``).

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.array([[1, 2, 3, 0], [4, 5, 0, 0], [0, 0, 0, 0]])
      >>> dropmask.masked_mean(x, x != 0, axis=-1).tolist()
      [2.0, 4.5, 0.0]
    """
    x, m, axes = _prepare(x, mask, axis, "masked_mean", integers=True, complex_ok=True)
    _check_fill(fill, "masked_mean")
    out_dtype = _result_float(x.dtype)
    acc = compute_dtype(out_dtype)
    total = jnp.sum(fill_where(m, x, 0).astype(acc), axis=axes, keepdims=keepdims)
    count = jnp.sum(m, axis=axes, keepdims=keepdims, dtype=jnp.zeros((), acc).real.dtype)
    mean = total / jnp.maximum(count, 1)
    return jnp.where(count > 0, mean, jnp.asarray(fill, acc)).astype(out_dtype)


def _masked_var(
    x: Any, mask: Any, axis: Axis, keepdims: bool, ddof: Any, caller: str
) -> tuple[jax.Array, jax.Array, Any]:
    """Returns ``(var, defined, out_dtype)``, var in the compute dtype, 0 where undefined."""
    x, m, axes = _prepare(x, mask, axis, caller, integers=True)
    check_int_at_least(ddof, 0, caller=caller, name="ddof")
    out_dtype = _result_float(x.dtype)
    acc = compute_dtype(out_dtype)
    xs = fill_where(m, x, 0).astype(acc)
    count = jnp.sum(m, axis=axes, keepdims=True, dtype=acc)
    mean = jnp.sum(xs, axis=axes, keepdims=True) / jnp.maximum(count, 1)
    # Two-pass (centred) form: no catastrophic cancellation, unlike E[x^2] - E[x]^2.
    centred = fill_where(m, xs - mean, 0)
    sq = jnp.sum(centred * centred, axis=axes, keepdims=keepdims)
    denom = _squeeze(count, axes, keepdims) - ddof
    defined = denom > 0
    var = jnp.where(defined, sq / jnp.where(defined, denom, 1), 0)
    return var, defined, out_dtype


def masked_var(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = None,
    *,
    keepdims: bool = False,
    ddof: int = 0,
    fill: jax.typing.ArrayLike = 0.0,
) -> jax.Array:
    """Variance of the valid elements; ``fill`` where fewer than ``ddof + 1`` are valid.

    Args:
      x: floating or integer ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to reduce; None reduces all.
      keepdims: keep reduced axes with size 1.
      ddof: delta degrees of freedom; the divisor is ``count - ddof``.
      fill: scalar returned where the variance is undefined (``count <= ddof``).

    Returns:
      The masked variance in ``x``'s dtype (default float for integers).

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.array([[1.0, 3.0, 99.0], [5.0, 0.0, 0.0]])
      >>> dropmask.masked_var(x, jnp.array([[1, 1, 0], [0, 0, 0]], bool), axis=1).tolist()
      [1.0, 0.0]
    """
    _check_fill(fill, "masked_var")
    var, defined, out_dtype = _masked_var(x, mask, axis, keepdims, ddof, "masked_var")
    return jnp.where(defined, var, jnp.asarray(fill, var.dtype)).astype(out_dtype)


def masked_std(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = None,
    *,
    keepdims: bool = False,
    ddof: int = 0,
    fill: jax.typing.ArrayLike = 0.0,
) -> jax.Array:
    """Standard deviation of the valid elements; ``fill`` where it is undefined.

    The gradient at zero variance (a constant row) is taken to be 0 rather than the
    infinite derivative of ``sqrt`` at 0.

    Args:
      x: floating or integer ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to reduce; None reduces all.
      keepdims: keep reduced axes with size 1.
      ddof: delta degrees of freedom.
      fill: scalar returned where fewer than ``ddof + 1`` elements are valid.

    Returns:
      The masked standard deviation in ``x``'s dtype (default float for integers).

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.array([2.0, 4.0, jnp.nan])
      >>> float(dropmask.masked_std(x, jnp.array([True, True, False])))
      1.0
    """
    _check_fill(fill, "masked_std")
    var, defined, out_dtype = _masked_var(x, mask, axis, keepdims, ddof, "masked_std")
    positive = var > 0
    std = jnp.where(positive, jnp.sqrt(jnp.where(positive, var, 1)), 0)
    return jnp.where(defined, std, jnp.asarray(fill, std.dtype)).astype(out_dtype)


# ----------------------------------------------------------------- max, min


def _masked_extreme(
    x: Any, mask: Any, axis: Axis, keepdims: bool, fill: Any, caller: str, *, is_max: bool
) -> jax.Array:
    x, m, axes = _prepare(x, mask, axis, caller, integers=True)
    _check_fill(fill, caller)
    if jnp.issubdtype(x.dtype, jnp.integer):
        if not jnp.issubdtype(jnp.result_type(fill), jnp.integer):
            raise user_error(
                DtypeError,
                f"x has integer dtype {x.dtype}, so fill must be an int, got {fill!r}",
                caller=caller,
            )
        info = np.iinfo(x.dtype)
        if not info.min <= int(np.asarray(fill)) <= info.max:
            raise user_error(
                DropmaskValueError,
                f"fill={fill!r} cannot be stored in x's dtype {x.dtype} (integers in [{info.min}"
                f", {info.max}])",
                "Pick a fill in that range, or cast x first.",
                caller=caller,
            )
        neutral = info.min if is_max else info.max
    else:
        neutral = -np.inf if is_max else np.inf
    xs = fill_where(m, x, neutral)
    reduce = jnp.max if is_max else jnp.min
    # `initial` lets a zero-length axis reduce to the neutral value (then `fill`).
    out = reduce(xs, axis=axes, keepdims=keepdims, initial=neutral)
    anyvalid = jnp.any(m, axis=axes, keepdims=keepdims)
    return jnp.where(anyvalid, out, jnp.asarray(fill, x.dtype))


def masked_max(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = None,
    *,
    keepdims: bool = False,
    fill: jax.typing.ArrayLike = 0,
) -> jax.Array:
    """Maximum of the valid elements; ``fill`` for a row with none.

    Args:
      x: floating or integer ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to reduce; None reduces all.
      keepdims: keep reduced axes with size 1.
      fill: scalar for an empty row (default 0, so that max-pooling an empty
        sequence gives zeros, not -inf); an int for integer ``x``.

    Returns:
      The masked maximum in ``x``'s dtype. Ties share the gradient, as in ``jnp.max``.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.array([[1.0, jnp.inf], [2.0, 3.0]])
      >>> dropmask.masked_max(x, jnp.array([[True, False], [False, False]]), axis=1).tolist()
      [1.0, 0.0]
    """
    return _masked_extreme(x, mask, axis, keepdims, fill, "masked_max", is_max=True)


def masked_min(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = None,
    *,
    keepdims: bool = False,
    fill: jax.typing.ArrayLike = 0,
) -> jax.Array:
    """Minimum of the valid elements; ``fill`` for a row with none.

    Args:
      x: floating or integer ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to reduce; None reduces all.
      keepdims: keep reduced axes with size 1.
      fill: scalar for an empty row (default 0); an int for integer ``x``.

    Returns:
      The masked minimum in ``x``'s dtype.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> float(dropmask.masked_min(jnp.array([4.0, -jnp.inf]), jnp.array([True, False])))
      4.0
    """
    return _masked_extreme(x, mask, axis, keepdims, fill, "masked_min", is_max=False)


# ----------------------------------------------------------------- log-sum-exp family


def shifted_exp(
    x: jax.Array, m: jax.Array, axes: tuple[int, ...]
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(x - shift, exp(x - shift), sum exp, shift)`` over valid elements, in f32+.

    ``shift`` is the valid maximum (0 where it is not finite).

    Masked elements are set to the shift before ``exp`` so both the value and the
    derivative there are finite, then zeroed. The shift is a constant for autodiff
    (the result does not depend on it).
    """
    xz = fill_where(m, x, 0).astype(compute_dtype(x.dtype))
    top = jnp.max(fill_where(m, xz, -jnp.inf), axis=axes, keepdims=True, initial=-jnp.inf)
    shift = lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0))
    shifted = fill_where(m, xz - shift, 0)  # the shift is finite, and xz is 0 where masked
    e = fill_where(m, jnp.exp(shifted), 0)
    return shifted, e, jnp.sum(e, axis=axes, keepdims=True), shift


def safe_denominator(s: jax.Array) -> jax.Array:
    # `s == 0` (not `s > 0`) so that a NaN from a *valid* element still propagates.
    return jnp.where(s == 0, 1, s)


def softmax_core(x: jax.Array, m: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """Masked softmax without boundary checks, in the compute dtype (shared with attention)."""
    return _softmax_masked(x, m, axes)


def softmax_tangent(y: jax.Array, t: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    # The closed form y * (t - <y, t>), as jax.nn.softmax uses: one fused pass in the
    # backward instead of differentiating exp, sum and divide separately. y is exactly
    # 0 at masked positions (and on emptied rows), so they get 0 from finite tangents
    # without a where over the tangent: transposed, this keeps y and nothing else
    # (no mask, no zeros instantiated for a where's unused branch).
    t = t.astype(y.dtype)
    return y * (t - jnp.sum(y * t, axis=axes, keepdims=True))


def zero_masked(x: jax.Array, m: jax.Array, zero: Any = None) -> jax.Array:
    """Masked elements set to 0 before the cast to the compute dtype (no NaN passed on);
    ``zero`` is the 0 to write (:func:`loop_zero`), a constant by default."""
    if zero is None:
        return fill_where(m, x, 0).astype(compute_dtype(x.dtype))
    return jnp.where(m, x, zero.astype(x.dtype)).astype(compute_dtype(x.dtype))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _softmax_masked(x: jax.Array, m: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    _, e, s, _ = shifted_exp(zero_masked(x, m), m, axes)
    return e / safe_denominator(s)


@_softmax_masked.defjvp
def _softmax_jvp(
    axes: tuple[int, ...], primals: tuple[jax.Array, jax.Array], tangents: tuple[Any, Any]
) -> tuple[jax.Array, jax.Array]:
    x, m = primals
    y = _softmax_masked(x, m, axes)
    return y, softmax_tangent(y, tangents[0], axes)


def masked_logsumexp(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = None,
    *,
    keepdims: bool = False,
    fill: jax.typing.ArrayLike = -np.inf,
) -> jax.Array:
    """``log(sum(exp(x)))`` over valid elements; ``fill`` (default -inf) for an empty row.

    Args:
      x: floating ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to reduce; None reduces all.
      keepdims: keep reduced axes with size 1.
      fill: scalar for a row with no valid element; -inf is the exact ``log(0)``.

    Returns:
      The masked log-sum-exp in ``x``'s dtype; its gradient is
      ``masked_softmax(x, mask)`` (0 on an empty row).

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.array([0.0, 0.0, jnp.nan])
      >>> round(float(dropmask.masked_logsumexp(x, jnp.array([True, True, False]))), 4)
      0.6931
    """
    x, m, axes = _prepare(x, mask, axis, "masked_logsumexp")
    _check_fill(fill, "masked_logsumexp")
    _, _, s, shift = shifted_exp(x, m, axes)
    nonzero = s != 0
    lse = jnp.log(jnp.where(nonzero, s, 1)) + shift
    anyvalid = jnp.any(m, axis=axes, keepdims=True)
    empty_value = jnp.where(anyvalid, -jnp.inf, jnp.asarray(fill, s.dtype))
    out = jnp.where(nonzero, lse, empty_value)
    return _squeeze(out, axes, keepdims).astype(x.dtype)


def masked_softmax(
    x: jax.typing.ArrayLike, mask: jax.typing.ArrayLike | None, axis: Axis = -1
) -> jax.Array:
    """Softmax over valid elements; masked positions and empty rows are exactly 0.

    Unlike ``jax.nn.softmax(jnp.where(mask, x, -jnp.inf))`` an all-masked row is all
    zeros (not NaN) and, unlike a ``finfo.min`` fill, not a uniform average.

    Args:
      x: floating ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to normalise over.

    Returns:
      An array like ``x`` that sums to 1 over ``axis`` on rows with a valid element.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> x = jnp.zeros((2, 2))
      >>> dropmask.masked_softmax(x, jnp.array([[True, True], [False, False]])).tolist()
      [[0.5, 0.5], [0.0, 0.0]]
    """
    x, m, axes = _prepare(x, mask, axis, "masked_softmax")
    return softmax_core(x, m, axes).astype(x.dtype)


def masked_log_softmax(
    x: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None,
    axis: Axis = -1,
    *,
    fill: jax.typing.ArrayLike = 0.0,
) -> jax.Array:
    """Log-softmax over valid elements; ``fill`` (default 0) at masked positions.

    The default fill is 0 rather than ``log 0 = -inf`` so that products such as
    ``p * log_p`` stay finite, in value and in gradient, at masked positions.

    Args:
      x: floating ``[...]``.
      mask: ``bool``, broadcastable to ``x``; True = valid. None means all valid.
      axis: axis or axes to normalise over.
      fill: scalar written at masked positions (and so across empty rows).

    Returns:
      An array like ``x``.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> y = dropmask.masked_log_softmax(jnp.zeros(3), jnp.array([True, True, False]))
      >>> [round(v, 4) for v in y.tolist()]
      [-0.6931, -0.6931, 0.0]
    """
    x, m, axes = _prepare(x, mask, axis, "masked_log_softmax")
    _check_fill(fill, "masked_log_softmax")
    shifted, _, s, _ = shifted_exp(x, m, axes)
    out = fill_where(m, shifted - jnp.log(safe_denominator(s)), fill)
    return out.astype(x.dtype)


# ----------------------------------------------------------------- cross-entropy


def masked_cross_entropy(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike | None = None,
    *,
    reduction: Literal["mean", "sum", "none"] = "mean",
) -> jax.Array:
    """Softmax cross-entropy averaged over valid tokens only.

    Args:
      logits: floating ``[..., num_classes]``.
      labels: integer class ids ``[...]``, or floating class probabilities
        ``[..., num_classes]``. Labels of masked tokens are ignored (any value,
        e.g. -100 or a pad id).
      mask: ``bool``, broadcastable to ``logits.shape[:-1]``; True = a token that
        counts. None means all tokens count.
      reduction: ``"mean"`` (sum over valid tokens / their number; 0 if there are
        none), ``"sum"``, or ``"none"`` (per-token losses ``[...]``, 0 where masked).

    Returns:
      A scalar (or ``[...]`` for ``"none"``) in ``logits``' dtype. Gradients at
      masked tokens are exactly 0. A traced label outside ``[0, num_classes)`` on a
      valid token gives NaN, not a silently clipped class.

    Raises:
      ValueError: a concrete valid label out of range, or an unknown ``reduction``.
      MaskShapeError: ``labels`` or ``mask`` do not fit ``logits``.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> logits = jnp.array([[0.0, 0.0], [jnp.nan, 0.0]])
      >>> float(dropmask.masked_cross_entropy(logits, jnp.array([0, -100]),
      ...                                     jnp.array([True, False])))  # log 2
      0.6931471824645996
    """
    caller = "masked_cross_entropy"
    logits = as_array(logits)
    labels = as_array(labels)
    _check_complex(logits, caller, complex_ok=False)
    _check_dtype(logits, caller, integers=False)
    if isinstance(mask, list | tuple):  # like labels, a nested list is read as an array
        mask = np.asarray(mask)
    check_choice(reduction, ("mean", "sum", "none"), caller=caller, name="reduction")
    if logits.ndim == 0:
        raise user_error(
            MaskShapeError,
            "logits need a class axis [..., num_classes], got a scalar",
            caller=caller,
        )
    batch, classes = logits.shape[:-1], logits.shape[-1]
    sparse = jnp.issubdtype(labels.dtype, jnp.integer)
    expected = batch if sparse else logits.shape
    if not sparse and not jnp.issubdtype(labels.dtype, jnp.floating):
        raise user_error(
            DtypeError,
            f"labels must be integer ids or float probabilities, got {labels.dtype}",
            caller=caller,
        )
    if labels.shape != expected:
        kind = "integer labels [...]" if sparse else "probability labels [..., num_classes]"
        raise user_error(
            MaskShapeError,
            f"{kind} must have shape {expected} for logits {logits.shape}, got {labels.shape}",
            caller=caller,
        )
    tok = broadcast_mask(mask, batch, caller=caller)
    if sparse:
        check_label_range(
            labels, None if mask is None else tok, classes, caller=caller, what="valid tokens"
        )
    # Tied to the logits before the broadcast, as _prepare ties a mask.
    row = jnp.broadcast_to(tok[..., None] | (loop_zero(logits) != 0), logits.shape)
    shifted, _, s, _ = shifted_exp(logits, row, (logits.ndim - 1,))
    log_z = jnp.log(safe_denominator(s))
    if sparse:
        in_range = (labels >= 0) & (labels < classes)
        safe = jnp.where(tok & in_range, labels, 0)[..., None]
        per_token = (log_z - jnp.take_along_axis(shifted, safe, axis=-1))[..., 0]
        per_token = jnp.where(tok & ~in_range, np.nan, per_token)
    else:
        probs = fill_where(row, labels, 0).astype(shifted.dtype)
        per_token = -jnp.sum(probs * (shifted - log_z), axis=-1)
    per_token = jnp.where(tok, per_token, 0)
    if reduction == "none":
        return per_token.astype(logits.dtype)
    total = jnp.sum(per_token)
    if reduction == "sum":
        return total.astype(logits.dtype)
    count = jnp.sum(tok, dtype=total.dtype)
    return (total / jnp.maximum(count, 1)).astype(logits.dtype)
