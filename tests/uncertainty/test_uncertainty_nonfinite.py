"""Non-finite samples and bad labels: every summary and score against a NumPy reference.

A NaN or +inf anywhere in a counted sample makes that example's summaries NaN, and
every score that counts it; a -inf log-probability is a zero probability. Labels of
counted examples outside ``[0, classes)`` are refused when known, NaN (an error under
``checkify``) when traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

import dropmask
from dropmask import uncertainty as unc

_K, _N, _C = 3, 4, 3


def _np_log_softmax(x: np.ndarray) -> np.ndarray:
    # NaN anywhere in a row, +inf (inf - inf) or a row of -inf make the whole row NaN.
    with np.errstate(invalid="ignore", over="ignore"):
        top = x.max(-1, keepdims=True)
        shifted = x - top
        return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _np_entropy(log_p: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        terms = np.where(log_p == -np.inf, 0.0, -np.exp(log_p) * log_p)
    return terms.sum(-1)


def _np_reference(samples: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> dict:
    """float64 summaries of ``samples: [K, N, C]`` and scores of their mean over ``valid``."""
    log_p = _np_log_softmax(samples.astype(np.float64))
    p = np.exp(log_p)
    with np.errstate(invalid="ignore"):
        log_mean = np.logaddexp.reduce(log_p, axis=0) - np.log(samples.shape[0])
    mean = np.exp(log_mean)
    total, each = _np_entropy(log_mean), _np_entropy(log_p).mean(0)
    counted = log_mean[valid]
    label_p = np.take_along_axis(mean[valid], labels[valid][:, None], -1)[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        nll = -np.log(label_p).mean() if label_p.size else 0.0
    onehot = np.eye(samples.shape[-1])[labels[valid]]
    brier = ((mean[valid] - onehot) ** 2).sum(-1).mean() if label_p.size else 0.0
    # ECE: NaN when a counted confidence is NaN (the binning is checked elsewhere).
    ece_nan = bool(np.isnan(counted).any())
    with np.errstate(invalid="ignore"):
        variance = p.var(0)
    return {
        "log_probs": log_mean,
        "mean": mean,
        "variance": variance,
        "predictive_entropy": total,
        "expected_entropy": each,
        "mutual_information": np.maximum(total - each, 0.0),
        "nll": nll,
        "brier": brier,
        "ece_nan": ece_nan,
    }


@jax.jit
def _ours(samples: jax.Array, labels: jax.Array, valid: jax.Array) -> dict:
    log_p = unc.predictive_log_probs(samples)
    return {
        "log_probs": log_p,
        "mean": unc.predictive_mean(samples),
        "variance": unc.predictive_variance(samples),
        "predictive_entropy": unc.predictive_entropy(samples),
        "expected_entropy": unc.expected_entropy(samples),
        "mutual_information": unc.mutual_information(samples),
        "nll": unc.nll(log_p, labels, mask=valid),
        "brier": unc.brier_score(log_p, labels, mask=valid),
        "ece": unc.expected_calibration_error(log_p, labels, mask=valid),
    }


_SPECIAL = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1e30, -1e30])


@st.composite
def _samples(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = (3.0 * rng.standard_normal((_K, _N, _C))).astype(np.float32)
    for _ in range(draw(st.integers(0, 4))):
        k, n, c = (draw(st.integers(0, d - 1)) for d in (_K, _N, _C))
        x[k, n, c] = draw(_SPECIAL)
    labels = rng.integers(0, _C, _N).astype(np.int32)
    valid = np.asarray(draw(st.lists(st.booleans(), min_size=_N, max_size=_N)))
    return x, labels, valid


def _check_against_reference(x: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> None:
    want = _np_reference(x, labels, valid)
    got = _ours(jnp.asarray(x), jnp.asarray(labels), jnp.asarray(valid))
    for name in (
        "log_probs",
        "mean",
        "variance",
        "predictive_entropy",
        "expected_entropy",
        "mutual_information",
        "nll",
        "brier",
    ):
        np.testing.assert_allclose(
            np.asarray(got[name], np.float64), want[name], rtol=2e-5, atol=2e-6, err_msg=name
        )
    assert bool(jnp.isnan(got["ece"])) == want["ece_nan"], "ece"


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(_samples())
def test_summaries_and_scores_match_numpy_with_non_finite_samples(case) -> None:
    _check_against_reference(*case)


@pytest.mark.slow
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_samples())
def test_summaries_and_scores_match_numpy_with_non_finite_samples_many(case) -> None:
    _check_against_reference(*case)


def test_one_nan_sample_among_k_makes_every_summary_nan() -> None:
    x = np.zeros((3, 1, 3), np.float32)
    for bad in (np.nan, np.inf):
        x[1, 0, 2] = bad
        for fn in (
            unc.predictive_log_probs,
            unc.predictive_mean,
            unc.predictive_variance,
            unc.predictive_entropy,
            unc.expected_entropy,
            unc.mutual_information,
        ):
            assert bool(jnp.isnan(fn(jnp.asarray(x))).all()), (fn.__name__, bad)
        log_p = unc.predictive_log_probs(jnp.asarray(x))
        for score in (unc.nll, unc.brier_score, unc.expected_calibration_error):
            assert bool(jnp.isnan(score(log_p, jnp.array([0])))), (score.__name__, bad)


def test_minus_inf_is_a_zero_probability() -> None:
    log_p = jnp.log(jnp.array([[[1.0, 0.0]], [[0.5, 0.5]]]))
    np.testing.assert_allclose(unc.predictive_mean(log_p), [[0.75, 0.25]], rtol=1e-6)
    assert bool(jnp.isfinite(unc.mutual_information(log_p)).all())


@pytest.mark.parametrize("score", [unc.nll, unc.brier_score, unc.expected_calibration_error])
def test_labels_out_of_range_are_refused_when_known(score) -> None:
    log_p = jnp.log(jnp.full((2, 3), 1 / 3))
    for bad in (5, -1):
        with pytest.raises(dropmask.DropmaskValueError, match=r"labels .* in \[0, 3\)") as info:
            score(log_p, jnp.array([0, bad]))
        assert "\n" not in str(info.value)
    # A masked label may hold anything.
    score(log_p, jnp.array([0, 5]), mask=jnp.array([True, False]))


@pytest.mark.parametrize("score", [unc.nll, unc.brier_score])
def test_traced_labels_out_of_range_give_nan_and_a_checkify_error(score) -> None:
    log_p = jnp.log(jnp.full((2, 3), 1 / 3))
    assert bool(jnp.isnan(jax.jit(score)(log_p, jnp.array([0, 5]))))
    assert bool(jnp.isfinite(jax.jit(score)(log_p, jnp.array([0, 2]))))
    checked = checkify.checkify(jax.jit(score), errors=checkify.user_checks)
    err, _ = checked(log_p, jnp.array([0, -1]))
    with pytest.raises(checkify.JaxRuntimeError, match=r"labels .* in \[0, 3\)"):
        err.throw()
    err, _ = checked(log_p, jnp.array([0, 2]))
    err.throw()


def test_a_masked_nan_row_leaves_the_gradient_finite() -> None:
    logits = jnp.array([[0.0, 1.0, 2.0], [jnp.nan, 0.0, 0.0]])
    labels, mask = jnp.array([1, 0]), jnp.array([True, False])
    for score in (unc.nll, unc.brier_score):
        grad = jax.grad(lambda x, score=score: score(x, labels, mask=mask))(logits)
        assert bool(jnp.isfinite(grad).all()), score.__name__
        np.testing.assert_array_equal(np.asarray(grad)[1], 0.0)
