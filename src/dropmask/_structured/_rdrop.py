"""R-Drop: two dropout passes kept consistent by a symmetric KL term (Liang et al., 2021).

The loss is ``CE(a) + CE(b) + alpha * KL_sym(a, b)`` for the outputs ``a``, ``b`` of two
passes with different dropout masks. :func:`r_drop_passes` runs both passes as one
batched computation (``vmap`` over two keys, so each pass draws exactly the masks it
would alone); :func:`symmetric_kl` is the consistency term, over valid positions only:
padded positions may hold anything, NaN included, and give neither a value nor a
gradient (the masked log-softmax and mean).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from .._checks import (
    check_array,
    check_bool_mask,
    check_broadcastable,
    check_callable,
    check_floating,
    check_key,
)
from .._errors import MaskShapeError, user_error
from .._reductions import masked_log_softmax, masked_mean

__all__ = ["r_drop_passes", "symmetric_kl"]

T = TypeVar("T")


def symmetric_kl(
    logits_a: jax.typing.ArrayLike,
    logits_b: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    """``(KL(p_a || p_b) + KL(p_b || p_a)) / 2`` per position, averaged over valid ones.

    Args:
      logits_a: ``[..., classes]`` floating logits of the first pass.
      logits_b: the second pass's, the same shape.
      mask: ``bool[...]`` (``logits.shape[:-1]``, or broadcastable to it), True for
        a position that counts, e.g. ``dropmask.sequence_mask(lengths, time)``; None:
        every position counts.

    Returns:
      A float32 scalar (0 when no position is valid); values and gradients ignore
      masked positions, whatever they hold. A class whose logit is -inf in both passes
      adds 0 (finite value and gradients); -inf in one pass only gives +inf, the KL.

    Raises:
      DtypeError: the logits are not floating point.
      MaskShapeError: the logits differ in shape, or ``mask`` does not broadcast to
        their leading axes.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> a = jnp.array([[[0.0, 1.0], [jnp.nan, 0.0]]])
      >>> float(dropmask.symmetric_kl(a, a, mask=jnp.array([[True, False]])))
      0.0
    """
    caller = "symmetric_kl"
    a = check_array(logits_a, caller=caller, name="logits_a")
    b = check_array(logits_b, caller=caller, name="logits_b")
    check_floating(a, caller=caller)
    check_floating(b, caller=caller)
    if a.shape != b.shape or a.ndim < 1:
        raise user_error(
            MaskShapeError,
            f"logits_a and logits_b must have one shape [..., classes], got {a.shape} and "
            f"{b.shape}",
            caller=caller,
        )
    lead = a.shape[:-1]
    if mask is None:
        m = jnp.ones(lead, bool)
    else:
        m = check_bool_mask(mask, caller=caller)
        check_broadcastable(
            m.shape, lead, caller=caller, name="mask",
            hint="mask is logits.shape[:-1]: one flag per position, not per class.",
        )  # fmt: skip
        m = jnp.broadcast_to(m.reshape((1,) * (len(lead) - m.ndim) + m.shape), lead)
    full = m[..., None]
    a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
    log_a = masked_log_softmax(a32, full)
    log_b = masked_log_softmax(b32, full)
    # A class with probability 0 in both passes (logit -inf, e.g. a masked vocabulary
    # entry) adds 0; computed as is it would be 0 * (-inf - -inf) = NaN. Both logs are
    # replaced before the product, so that the gradient is 0 there too.
    absent = jnp.isneginf(log_a) & jnp.isneginf(log_b)
    log_a, log_b = jnp.where(absent, 0.0, log_a), jnp.where(absent, 0.0, log_b)
    per_class = (jnp.exp(log_a) - jnp.exp(log_b)) * (log_a - log_b)
    per_position = 0.5 * jnp.sum(jnp.where(full, per_class, 0.0), axis=-1)
    return masked_mean(per_position, m)


def r_drop_passes(apply: Callable[[Any], T], key: Any) -> tuple[T, T]:
    """Runs ``apply(key_a)`` and ``apply(key_b)`` as one batched computation.

    ``key_a, key_b = jax.random.split(key)``; both passes run under one ``vmap``, and
    give exactly what ``apply(key_a)`` and ``apply(key_b)`` give apart (dropmask's
    masks are the same under ``vmap``).

    Args:
      apply: ``key -> outputs``: the model in training mode with its dropout key,
        e.g. ``lambda k: model.apply(variables, x, rngs={"dropout": k})``.
      key: PRNG key the two passes' keys are split from.

    Returns:
      ``(outputs_a, outputs_b)``.

    Raises:
      DropmaskTypeError: ``apply`` is not callable.
      DropmaskError: the key errors of :func:`dropmask.dropout`.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> a, b = dropmask.r_drop_passes(
      ...     lambda k: dropmask.dropout(jnp.ones(64), 0.5, k), jax.random.key(0))
      >>> bool((a != b).any())
      True
    """
    caller = "r_drop_passes"
    check_callable(
        apply,
        caller=caller,
        name="apply",
        what="a callable key -> outputs",
        fix="Pass e.g. lambda k: model.apply(variables, x, rngs={'dropout': k}).",
    )
    check_key(key, caller=caller)
    both = jax.vmap(apply)(jax.random.split(key))
    first = jax.tree.map(lambda t: t[0], both)
    second = jax.tree.map(lambda t: t[1], both)
    return first, second
