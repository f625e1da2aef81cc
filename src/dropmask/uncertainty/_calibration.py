"""Scores of a predictive distribution against labels: NLL, Brier score, calibration.

Every function takes ``logits: [..., classes]`` of one distribution per example: a
deterministic model's logits, or :func:`predictive_log_probs` of K samples (a
log-probability is a logit; the input is normalised with ``log_softmax``, which leaves
log-probabilities unchanged). ``labels: int[...]`` and an optional boolean ``mask``
broadcastable to ``labels`` (True = valid): padded positions are excluded through the
library's masked reductions, whatever their logits hold, in value and gradient. A
counted example whose logits hold NaN or +inf makes every score NaN (ECE too: its
confidence is NaN), as the summaries do; -inf is a zero probability. Labels of counted
examples must be in ``[0, classes)``: known ones are checked before any work, traced
ones make the score NaN (an error under ``checkify.checkify(f,
errors=checkify.user_checks)``). Each function checks its inputs, then runs one jitted
computation (one program per shape when called eagerly).

Expected calibration error (Guo et al., 2017), top-label, equal-width bins: an example
with confidence ``c = max_j p_j`` falls in bin ``b`` when ``b / B < c <= (b + 1) / B``
(``B = num_bins``, 15 by default); ``ECE = sum_b (n_b / n) |accuracy_b - confidence_b|``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (
    check_array,
    check_bool_mask,
    check_broadcastable,
    check_floating,
    check_int,
    check_integer_dtype,
    check_label_range,
)
from .._errors import DropmaskValueError, user_error
from .._optional import require
from .._reductions import masked_mean, masked_sum
from ._summaries import log_softmax

__all__ = [
    "Reliability",
    "brier_score",
    "expected_calibration_error",
    "nll",
    "reliability",
    "reliability_diagram",
]


def _inputs(logits: Any, labels: Any, mask: Any, caller: str) -> tuple[jax.Array, jax.Array, Any]:
    """``(logits, labels, mask or None)``, checked; the jitted cores below take them."""
    x = check_array(logits, caller=caller, name="logits")
    check_floating(x, caller=caller)
    y = check_array(labels, caller=caller, name="labels")
    check_integer_dtype(y, caller=caller, name="labels")
    if x.ndim < 1 or x.shape[:-1] != y.shape:
        raise user_error(
            DropmaskValueError,
            f"logits must be labels.shape + (classes,), got logits {x.shape} and labels {y.shape}",
            "For K samples pass uncertainty.predictive_log_probs(samples).",
            caller=caller,
        )
    m = None
    if mask is not None:
        m = check_bool_mask(mask, caller=caller)
        check_broadcastable(m.shape, y.shape, caller=caller, name="mask", hint="")
    check_label_range(y, m, x.shape[-1], caller=caller)
    return x, y, m


def _normalised(x: jax.Array, y: jax.Array, m: Any) -> tuple[jax.Array, jax.Array]:
    """``(log_p, mask)``: ``log_p`` in float32 or wider, the mask at ``labels``' shape.

    A masked example's logits are replaced by zeros before the softmax (the "double
    where"), so whatever they hold reaches neither the value nor the gradient. A counted
    example whose label is outside ``[0, classes)`` (possible only when traced: known
    labels are checked first) gets NaN log-probabilities, never a clipped class.
    """
    m = jnp.ones(y.shape, bool) if m is None else jnp.broadcast_to(m, y.shape)
    x = jnp.where(m[..., None], x, jnp.zeros((), x.dtype))
    log_p = log_softmax(x)
    in_range = (y >= 0) & (y < x.shape[-1])
    return jnp.where((m & ~in_range)[..., None], jnp.nan, log_p), m


def _label_log_p(log_p: jax.Array, labels: jax.Array) -> jax.Array:
    # Out-of-range labels already made their row NaN (see _normalised); the clip only
    # keeps the gather in bounds.
    index = jnp.clip(labels, 0, log_p.shape[-1] - 1)[..., None]
    return jnp.take_along_axis(log_p, index, axis=-1)[..., 0]


def nll(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    """Mean negative log-likelihood of the labels, ``-mean log p(label)``, over valid examples.

    Args:
      logits: floating ``[..., classes]``.
      labels: integer ``[...]`` in ``[0, classes)`` where counted.
      mask: optional ``bool`` broadcastable to ``labels``; True = counted.

    Returns:
      A scalar in ``logits``' dtype (0 with no valid example; ``inf`` if a counted
      label has probability exactly 0; NaN if a counted example's logits hold NaN or
      +inf, or, traced, its label is out of range).

    Raises:
      DropmaskValueError: a known counted label outside ``[0, classes)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[0.5, 0.5], [0.9, 0.1], [0.3, 0.7]]))
      >>> round(float(uncertainty.nll(logits, jnp.array([0, 0, 1]),
      ...                             mask=jnp.array([True, True, False]))), 4)
      0.3993
    """
    return _nll(*_inputs(logits, labels, mask, "uncertainty.nll"))


@jax.jit
def _nll(x: jax.Array, y: jax.Array, m: Any) -> jax.Array:
    log_p, m = _normalised(x, y, m)
    return masked_mean(-_label_log_p(log_p, y), m).astype(x.dtype)


def brier_score(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    """Mean over valid examples of ``sum_j (p_j - onehot(label)_j)^2``, in ``[0, 2]``.

    Args:
      logits: floating ``[..., classes]``.
      labels: integer ``[...]`` in ``[0, classes)`` where counted.
      mask: optional ``bool`` broadcastable to ``labels``.

    Returns:
      A scalar in ``logits``' dtype (NaN as for :func:`nll`).

    Raises:
      DropmaskValueError: a known counted label outside ``[0, classes)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[0.5, 0.5], [1.0, 0.0]]))
      >>> uncertainty.brier_score(logits, jnp.array([0, 1])).tolist()  # (0.5 + 2) / 2
      1.25
    """
    return _brier_score(*_inputs(logits, labels, mask, "uncertainty.brier_score"))


@jax.jit
def _brier_score(x: jax.Array, y: jax.Array, m: Any) -> jax.Array:
    log_p, m = _normalised(x, y, m)
    onehot = jax.nn.one_hot(y, log_p.shape[-1], dtype=log_p.dtype)
    per_example = jnp.sum(jnp.square(jnp.exp(log_p) - onehot), axis=-1)
    return masked_mean(per_example, m).astype(x.dtype)


class Reliability(NamedTuple):
    """Per confidence bin, what the reliability diagram and ECE are made of.

    Attributes:
      edges: ``float32[num_bins + 1]``, ``0, 1/B, ..., 1``.
      confidence: ``float32[num_bins]`` mean confidence of the bin's examples (0 if empty).
      accuracy: ``float32[num_bins]`` their accuracy (0 if empty).
      counts: ``float32[num_bins]`` how many valid examples fell in the bin.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[0.9, 0.1], [0.6, 0.4]]))
      >>> r = uncertainty.reliability(logits, jnp.array([0, 1]), num_bins=2)
      >>> r.edges.tolist(), r.confidence.tolist(), r.counts.tolist()
      ([0.0, 0.5, 1.0], [0.0, 0.75], [0.0, 2.0])
    """

    edges: jax.Array
    confidence: jax.Array
    accuracy: jax.Array
    counts: jax.Array


def _bin_sums(
    x: jax.Array, y: jax.Array, m: Any, num_bins: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per bin: count, summed confidence and summed correctness of the valid examples."""
    log_p, m = _normalised(x, y, m)
    confidence = jnp.exp(jnp.max(log_p, axis=-1))
    correct = (jnp.argmax(log_p, axis=-1) == y).astype(confidence.dtype)
    index = jnp.clip(jnp.ceil(confidence * num_bins).astype(jnp.int32) - 1, 0, num_bins - 1)
    in_bin = jax.nn.one_hot(index, num_bins, dtype=jnp.bool_) & m[..., None]
    axes = tuple(range(y.ndim))
    count = jnp.sum(in_bin, axis=axes, dtype=confidence.dtype)
    conf_sum = masked_sum(jnp.broadcast_to(confidence[..., None], in_bin.shape), in_bin, axes)
    correct_sum = masked_sum(jnp.broadcast_to(correct[..., None], in_bin.shape), in_bin, axes)
    return count, conf_sum, correct_sum


def expected_calibration_error(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
    num_bins: int = 15,
) -> jax.Array:
    """Top-label expected calibration error over ``num_bins`` equal-width bins.

    Args:
      logits: floating ``[..., classes]``.
      labels: integer ``[...]``.
      mask: optional ``bool`` broadcastable to ``labels``.
      num_bins: a Python int ``>= 1``; bin ``b`` holds confidences in
        ``(b / num_bins, (b + 1) / num_bins]``.

    Returns:
      A scalar in ``[0, 1]``, in ``logits``' dtype (0 with no valid example).

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> # Confidence 0.9 on both, one right: |0.5 - 0.9| = 0.4.
      >>> logits = jnp.log(jnp.array([[0.9, 0.1], [0.9, 0.1]]))
      >>> round(float(uncertainty.expected_calibration_error(logits, jnp.array([0, 1]))), 4)
      0.4
    """
    caller = "uncertainty.expected_calibration_error"
    num_bins = check_int(num_bins, name="num_bins", caller=caller, minimum=1, shape=True)
    return _expected_calibration_error(*_inputs(logits, labels, mask, caller), num_bins)


@functools.partial(jax.jit, static_argnums=3)
def _expected_calibration_error(x: jax.Array, y: jax.Array, m: Any, num_bins: int) -> jax.Array:
    count, conf_sum, correct_sum = _bin_sums(x, y, m, num_bins)
    total = jnp.maximum(jnp.sum(count), 1.0)
    return (jnp.sum(jnp.abs(correct_sum - conf_sum)) / total).astype(x.dtype)


def reliability(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
    num_bins: int = 15,
) -> Reliability:
    """Per-bin confidence, accuracy and count, binned as in :func:`expected_calibration_error`.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4]]))
      >>> r = uncertainty.reliability(logits, jnp.array([0, 1, 0]), num_bins=5)
      >>> r.counts.tolist(), r.accuracy.tolist()
      ([0.0, 0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 1.0, 0.0, 0.5])
    """
    caller = "uncertainty.reliability"
    num_bins = check_int(num_bins, name="num_bins", caller=caller, minimum=1, shape=True)
    return _reliability(*_inputs(logits, labels, mask, caller), num_bins)


@functools.partial(jax.jit, static_argnums=3)
def _reliability(x: jax.Array, y: jax.Array, m: Any, num_bins: int) -> Reliability:
    count, conf_sum, correct_sum = _bin_sums(x, y, m, num_bins)
    safe = jnp.maximum(count, 1.0)
    edges = jnp.linspace(0.0, 1.0, count.shape[0] + 1, dtype=count.dtype)
    return Reliability(edges, conf_sum / safe, correct_sum / safe, count)


def reliability_diagram(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
    num_bins: int = 15,
    ax: Any = None,
    label: str | None = None,
) -> Any:
    """Draws accuracy against confidence per bin (matplotlib, the ``train`` extra).

    Bars show each non-empty bin's accuracy; the diagonal is perfect calibration, and
    the legend carries the ECE. Call it again on the same ``ax`` to overlay models.

    Args:
      logits, labels, mask, num_bins: as in :func:`expected_calibration_error`.
      ax: a matplotlib ``Axes``; None creates a figure (without pyplot's global state).
      label: the legend's name for this model.

    Returns:
      The ``Axes`` drawn on (``ax.figure.savefig(path)`` writes it).

    Raises:
      DropmaskError: matplotlib is not installed (``pip install 'dropmask[train]'``).

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[0.9, 0.1], [0.6, 0.4]]))
      >>> ax = uncertainty.reliability_diagram(logits, jnp.array([0, 1]), num_bins=5)
      >>> ax.get_legend_handles_labels()[1]  # ax.figure.savefig(path) writes it
      ['ECE 0.350']
    """
    Figure = require("matplotlib.figure", caller="reliability_diagram").Figure

    r = reliability(logits, labels, mask=mask, num_bins=num_bins)
    ece = expected_calibration_error(logits, labels, mask=mask, num_bins=num_bins)
    if ax is None:
        ax = Figure(figsize=(4.2, 4.0), layout="constrained").subplots()
    edges, count = np.asarray(r.edges), np.asarray(r.counts)
    full = count > 0
    width = np.diff(edges)
    name = f"{label}: " if label else ""
    ax.bar(
        edges[:-1][full],
        np.asarray(r.accuracy)[full],
        width=width[full],
        align="edge",
        alpha=0.5,
        edgecolor="black",
        label=f"{name}ECE {float(ece):.3f}",
    )
    ax.plot([0, 1], [0, 1], color="gray", linestyle="--", linewidth=1)
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left")
    return ax
