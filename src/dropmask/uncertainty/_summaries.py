"""What K samples say: the predictive distribution and how uncertain it is.

Classifier summaries take ``logits: [K, ..., classes]``, the K samples' unnormalised
log-probabilities (sample axis first, classes last). Log-probabilities are logits
too, so a model that outputs probabilities ``p`` passes ``jnp.log(p)``; an exact zero
probability (``-inf``) is handled. A NaN or ``+inf`` anywhere in one sample of an
example makes that example's every summary NaN: nothing is silently left out of the
K (a sample of all ``-inf``, no class possible, is NaN too). Everything is computed
in log space in float32 (a 16-bit input is returned in its dtype), so one-hot and
near-one-hot predictions give finite values and finite gradients:

* predictive distribution ``p̄ = mean_k softmax(logits_k)``, as
  ``logsumexp_k log_softmax(logits_k) - log K``;
* predictive entropy ``H[p̄]``, expected entropy ``mean_k H[p_k]``, and their
  difference, the mutual information between the prediction and the dropout masks
  (BALD, Houlsby et al. 2011): high where the samples disagree.

Entropies are in nats. Each function checks its input, then runs one jitted
computation: called eagerly, it compiles one program per input shape and dtype, not
one per operation.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from .._checks import check_array, check_floating, check_ndim
from .._reductions import compute_dtype, masked_logsumexp, masked_sum

__all__ = [
    "expected_entropy",
    "mutual_information",
    "predictive_entropy",
    "predictive_log_probs",
    "predictive_mean",
    "predictive_variance",
    "regression_moments",
]


def _samples(logits: Any, caller: str, *, min_ndim: int = 2) -> jax.Array:
    x = check_array(logits, caller=caller, name="logits")
    check_floating(x, caller=caller)
    check_ndim(
        x.shape,
        caller=caller,
        name="logits",
        layout="[samples, ..., classes]",
        minimum=min_ndim,
        fix=" Stack the samples on axis 0, e.g. with uncertainty.sample_linen.",
    )
    return x


def log_softmax(x: jax.Array) -> jax.Array:
    """``log_softmax`` over the last axis in the compute dtype, exact for ``-inf`` entries."""
    return jax.nn.log_softmax(x.astype(compute_dtype(x.dtype)), axis=-1)


def _possible(log_p: jax.Array) -> jax.Array:
    """Where ``log_p`` is not ``-inf``: a zero probability is left out, a NaN is not."""
    return log_p != -jnp.inf


def entropy(log_p: jax.Array) -> jax.Array:
    """``-sum p log p`` over the last axis; a zero probability contributes exactly 0.

    ``log_p = -inf`` is replaced before the product and masked after it (the "double
    where"), so neither the value nor the gradient sees ``0 * inf``; a NaN stays.
    """
    possible = _possible(log_p)
    safe = jnp.where(possible, log_p, 0.0)
    # Negated before the sum: a certain row sums -0.0 terms to 0.0, not to -0.0.
    return masked_sum(-(jnp.exp(safe) * safe), possible, axis=-1)


def _mean_log_probs(log_p: jax.Array) -> jax.Array:
    return masked_logsumexp(log_p, _possible(log_p), axis=0) - math.log(log_p.shape[0])


def predictive_log_probs(logits: jax.typing.ArrayLike) -> jax.Array:
    """``log p̄``: the log of the mean of the samples' softmax.

    Args:
      logits: floating ``[K, ..., classes]``.

    Returns:
      ``[..., classes]`` log-probabilities (``-inf`` where every sample gives 0), in
      ``logits``' dtype. Pass them to :func:`nll`, :func:`brier_score` and
      :func:`expected_calibration_error`.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))  # two one-hot samples
      >>> jnp.exp(uncertainty.predictive_log_probs(logits)).tolist()
      [[0.5, 0.5]]
    """
    return _predictive_log_probs(_samples(logits, "uncertainty.predictive_log_probs"))


@jax.jit
def _predictive_log_probs(x: jax.Array) -> jax.Array:
    return _mean_log_probs(log_softmax(x)).astype(x.dtype)


def predictive_mean(logits: jax.typing.ArrayLike) -> jax.Array:
    """``p̄``: the mean of the samples' softmax, ``[..., classes]``.

    Args:
      logits: floating ``[K, ..., classes]``.

    Returns:
      Probabilities ``[..., classes]`` in ``logits``' dtype; for NLL and calibration
      pass :func:`predictive_log_probs` instead (exact in log space).

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))  # two samples
      >>> uncertainty.predictive_mean(logits).tolist()
      [[0.5, 0.5]]
    """
    return _predictive_mean(_samples(logits, "uncertainty.predictive_mean"))


@jax.jit
def _predictive_mean(x: jax.Array) -> jax.Array:
    return jnp.exp(_mean_log_probs(log_softmax(x))).astype(x.dtype)


def predictive_variance(logits: jax.typing.ArrayLike) -> jax.Array:
    """The variance over samples of each class probability, ``[..., classes]``.

    Args:
      logits: floating ``[K, ..., classes]``.

    Returns:
      ``mean_k (p_k - p̄)^2`` (``ddof=0``) in ``logits``' dtype.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
      >>> uncertainty.predictive_variance(logits).tolist()
      [[0.25, 0.25]]
    """
    return _predictive_variance(_samples(logits, "uncertainty.predictive_variance"))


@jax.jit
def _predictive_variance(x: jax.Array) -> jax.Array:
    p = jnp.exp(log_softmax(x))
    return jnp.mean(jnp.square(p - jnp.mean(p, axis=0, keepdims=True)), axis=0).astype(x.dtype)


def predictive_entropy(logits: jax.typing.ArrayLike) -> jax.Array:
    """``H[p̄]``, the entropy of the predictive distribution: total uncertainty.

    Args:
      logits: floating ``[K, ..., classes]``.

    Returns:
      ``[...]`` entropies in nats, in ``[0, log classes]``, in ``logits``' dtype.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
      >>> round(float(uncertainty.predictive_entropy(logits)[0]), 4)  # log 2
      0.6931
    """
    return _predictive_entropy(_samples(logits, "uncertainty.predictive_entropy"))


@jax.jit
def _predictive_entropy(x: jax.Array) -> jax.Array:
    return entropy(_mean_log_probs(log_softmax(x))).astype(x.dtype)


def expected_entropy(logits: jax.typing.ArrayLike) -> jax.Array:
    """``mean_k H[p_k]``, the samples' mean entropy: the uncertainty each sample keeps.

    Args:
      logits: floating ``[K, ..., classes]``.

    Returns:
      ``[...]`` entropies in nats, in ``logits``' dtype.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> logits = jnp.log(jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
      >>> uncertainty.expected_entropy(logits).tolist()  # each sample is certain
      [0.0]
    """
    return _expected_entropy(_samples(logits, "uncertainty.expected_entropy"))


@jax.jit
def _expected_entropy(x: jax.Array) -> jax.Array:
    return jnp.mean(entropy(log_softmax(x)), axis=0).astype(x.dtype)


def mutual_information(logits: jax.typing.ArrayLike) -> jax.Array:
    """``H[p̄] - mean_k H[p_k]``: how much the samples disagree (BALD).

    Zero when every sample predicts the same distribution, however flat; at most
    ``log classes``. Rounding can make the difference slightly negative; it is
    clipped at 0.

    Args:
      logits: floating ``[K, ..., classes]``.

    Returns:
      ``[...]`` in nats, in ``logits``' dtype.

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> disagree = jnp.log(jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
      >>> agree = jnp.zeros((2, 1, 2))  # both samples say [0.5, 0.5]
      >>> round(float(uncertainty.mutual_information(disagree)[0]), 4)
      0.6931
      >>> uncertainty.mutual_information(agree).tolist()
      [0.0]
    """
    return _mutual_information(_samples(logits, "uncertainty.mutual_information"))


@jax.jit
def _mutual_information(x: jax.Array) -> jax.Array:
    log_p = log_softmax(x)
    total = entropy(_mean_log_probs(log_p))
    return jnp.maximum(total - jnp.mean(entropy(log_p), axis=0), 0.0).astype(x.dtype)


def regression_moments(samples: jax.typing.ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Mean and variance over samples of a regression output.

    Args:
      samples: floating ``[K, ...]``.

    Returns:
      ``(mean, variance)``, each ``[...]`` in ``samples``' dtype; the variance is
      ``mean_k (y_k - mean)^2`` (``ddof=0``). Add the observation noise variance if
      the model has one (Gal and Ghahramani's ``tau^-1``).

    Example:
      >>> import jax.numpy as jnp
      >>> from dropmask import uncertainty
      >>> mean, var = uncertainty.regression_moments(jnp.array([[1.0], [3.0]]))
      >>> mean.tolist(), var.tolist()
      ([2.0], [1.0])
    """
    return _regression_moments(_samples(samples, "uncertainty.regression_moments", min_ndim=1))


@jax.jit
def _regression_moments(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    y = x.astype(compute_dtype(x.dtype))
    mean = jnp.mean(y, axis=0, keepdims=True)
    variance = jnp.mean(jnp.square(y - mean), axis=0)
    return mean[0].astype(x.dtype), variance.astype(x.dtype)
