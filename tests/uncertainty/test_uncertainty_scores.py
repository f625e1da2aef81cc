"""Predictive summaries and calibration scores: hand values, a NumPy reference,
one-hot inputs, padding excluded, jit/vmap/grad, f32 and bf16."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from tests.covering import covering

import dropmask
from dropmask import uncertainty as unc

# --- a NumPy reference, float64 ---------------------------------------------------------


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _entropy(p: np.ndarray) -> np.ndarray:
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)


def _reference(samples: np.ndarray, labels: np.ndarray, bins: int = 15) -> dict[str, object]:
    p = _softmax(samples.astype(np.float64))
    mean = p.mean(0)
    conf, pred = mean.max(-1), mean.argmax(-1)
    index = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        sel = index == b
        if sel.any():
            ece += sel.mean() * abs((pred[sel] == labels[sel]).mean() - conf[sel].mean())
    onehot = np.eye(p.shape[-1])[labels]
    return {
        "mean": mean,
        "variance": p.var(0),
        "predictive_entropy": _entropy(mean),
        "expected_entropy": _entropy(p).mean(0),
        "mutual_information": _entropy(mean) - _entropy(p).mean(0),
        "nll": -np.log(np.take_along_axis(mean, labels[..., None], -1)).mean(),
        "brier": np.sum((mean - onehot) ** 2, -1).mean(),
        "ece": ece,
    }


def _ours(samples: jax.Array, labels: jax.Array, bins: int = 15) -> dict[str, jax.Array]:
    log_p = unc.predictive_log_probs(samples)
    return {
        "mean": unc.predictive_mean(samples),
        "variance": unc.predictive_variance(samples),
        "predictive_entropy": unc.predictive_entropy(samples),
        "expected_entropy": unc.expected_entropy(samples),
        "mutual_information": unc.mutual_information(samples),
        "nll": unc.nll(log_p, labels),
        "brier": unc.brier_score(log_p, labels),
        "ece": unc.expected_calibration_error(log_p, labels, num_bins=bins),
    }


_ours_jit = jax.jit(_ours)

# The summaries of K samples that return one array in the input's dtype.
SUMMARIES = (
    unc.predictive_log_probs,
    unc.predictive_mean,
    unc.predictive_variance,
    unc.predictive_entropy,
    unc.expected_entropy,
    unc.mutual_information,
)


# Two shapes (one compilation each); the values vary.
@settings(max_examples=12)
@given(
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([(1, 7, 2), (5, 16, 6)]),
    scale=st.sampled_from([0.1, 1.0, 5.0]),
)
def test_matches_numpy_reference_on_random_inputs(
    seed: int, shape: tuple[int, int, int], scale: float
) -> None:
    rng = np.random.default_rng(seed)
    samples = (scale * rng.standard_normal(shape)).astype(np.float32)
    labels = rng.integers(0, shape[-1], shape[1])
    want = _reference(samples, labels)
    got = _ours_jit(jnp.asarray(samples), jnp.asarray(labels, jnp.int32))
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(got[name]), value, rtol=2e-5, atol=2e-6, err_msg=name)


def test_hand_computed_values() -> None:
    disagree = jnp.log(jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
    assert float(unc.predictive_entropy(disagree)[0]) == pytest.approx(math.log(2), abs=1e-6)
    assert float(unc.expected_entropy(disagree)[0]) == 0.0
    assert float(unc.mutual_information(disagree)[0]) == pytest.approx(math.log(2), abs=1e-6)
    flat = jnp.zeros((3, 1, 4))  # every sample uniform: all entropy, no disagreement
    assert float(unc.predictive_entropy(flat)[0]) == pytest.approx(math.log(4), abs=1e-6)
    assert float(unc.mutual_information(flat)[0]) == pytest.approx(0.0, abs=1e-6)
    # Probabilities 0.9/0.1 with labels 0, 1: NLL (-log .9 - log .1) / 2, Brier
    # (2 * .01 + 2 * .81) / 2, ECE |0.5 - 0.9| (one bin holds both).
    log_p = jnp.log(jnp.array([[0.9, 0.1], [0.9, 0.1]]))
    labels = jnp.array([0, 1])
    assert float(unc.nll(log_p, labels)) == pytest.approx(
        -(math.log(0.9) + math.log(0.1)) / 2, rel=1e-6
    )
    assert float(unc.brier_score(log_p, labels)) == pytest.approx(0.82, rel=1e-6)
    assert float(unc.expected_calibration_error(log_p, labels)) == pytest.approx(0.4, rel=1e-6)
    mean, var = unc.regression_moments(jnp.array([[1.0, 0.0], [2.0, 0.0], [6.0, 0.0]]))
    np.testing.assert_allclose(mean, [3.0, 0.0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(var, [14.0 / 3.0, 0.0], rtol=1e-6, atol=0)


def test_confidence_on_a_bin_edge_goes_to_the_lower_bin() -> None:
    # 0.6 with 5 bins lies in (0.4, 0.6], bin 2; 0.61 in bin 3.
    log_p = jnp.log(jnp.array([[0.6, 0.4], [0.61, 0.39]]))
    r = unc.reliability(log_p, jnp.array([0, 0]), num_bins=5)
    np.testing.assert_array_equal(r.counts, [0, 0, 1, 1, 0])
    np.testing.assert_allclose(r.edges, np.linspace(0, 1, 6), rtol=0, atol=1e-7)


@pytest.mark.parametrize("kind", ["exact", "near"])
def test_one_hot_inputs_are_nan_free_with_finite_gradients(kind: str) -> None:
    onehot = jnp.eye(3)[jnp.array([[0, 1], [0, 0], [2, 1]])]  # [K=3, n=2, classes=3]
    samples = jnp.log(onehot) if kind == "exact" else 50.0 * onehot
    labels = jnp.array([0, 1])
    summaries = [
        unc.predictive_entropy,
        unc.expected_entropy,
        unc.mutual_information,
        unc.predictive_variance,
    ]
    for fn in summaries:
        assert bool(jnp.isfinite(fn(samples)).all()), fn.__name__
        grad = jax.grad(lambda s, fn=fn: fn(s).sum())(samples)
        assert bool(jnp.isfinite(grad).all()), fn.__name__
    log_p = unc.predictive_log_probs(samples)
    for fn in (unc.nll, unc.brier_score, unc.expected_calibration_error):
        assert bool(jnp.isfinite(fn(log_p, labels))), fn.__name__
        grad = jax.grad(lambda s, fn=fn: fn(unc.predictive_log_probs(s), labels))(samples)
        assert bool(jnp.isfinite(grad).all()), fn.__name__
    # Sample 1 and 3 disagree on example 0 and 2 of 3 samples agree on example 1.
    want = _reference(np.asarray(50.0 * onehot), np.asarray(labels))
    np.testing.assert_allclose(
        unc.mutual_information(samples), want["mutual_information"], rtol=1e-5, atol=1e-6
    )


def test_padding_is_excluded_whatever_it_holds() -> None:
    rng = np.random.default_rng(0)
    lengths = np.array([5, 2, 0, 3])
    logits = rng.standard_normal((4, 5, 6)).astype(np.float32)
    labels = rng.integers(0, 6, (4, 5)).astype(np.int32)
    valid = np.asarray(dropmask.sequence_mask(jnp.asarray(lengths), 5))
    garbage = np.where(valid[..., None], logits, np.nan).astype(np.float32)
    bad_labels = np.where(valid, labels, 99).astype(np.int32)  # out of range on padding
    flat_logits = np.concatenate([logits[b, :t] for b, t in enumerate(lengths)])
    flat_labels = np.concatenate([labels[b, :t] for b, t in enumerate(lengths)])
    for fn in (unc.nll, unc.brier_score, unc.expected_calibration_error):
        padded = fn(jnp.asarray(garbage), jnp.asarray(bad_labels), mask=jnp.asarray(valid))
        sliced = fn(jnp.asarray(flat_logits), jnp.asarray(flat_labels))
        np.testing.assert_allclose(padded, sliced, rtol=1e-6, atol=1e-7, err_msg=fn.__name__)
    # Gradients reach only valid positions (finite garbage: the values above saw NaN).
    finite_garbage = jnp.asarray(np.where(valid[..., None], logits, 1e4).astype(np.float32))
    grad = jax.grad(lambda x: unc.nll(x, jnp.asarray(labels), mask=jnp.asarray(valid)))(
        finite_garbage
    )
    assert bool(jnp.isfinite(grad).all())
    np.testing.assert_array_equal(np.asarray(grad)[~valid], 0.0)


# Fast: bfloat16, the dtype a function could lose on the way; float32 (slow) is the
# dtype every other test here computes in.
@pytest.mark.parametrize("dtype", covering([jnp.float32, jnp.bfloat16], [jnp.bfloat16]))
def test_dtypes_jit_and_vmap(dtype: jnp.dtype) -> None:
    samples = jax.random.normal(jax.random.key(0), (4, 3, 5)).astype(dtype)
    labels = jnp.array([0, 4, 2])
    # jit may fuse differently: one rounding step of the dtype.
    tol = 1e-6 if dtype == jnp.float32 else 1e-2

    def close(a: jax.Array, b: jax.Array) -> None:
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol
        )

    for fn in SUMMARIES:
        out = fn(samples)
        assert out.dtype == dtype, fn.__name__
        close(jax.jit(fn)(samples), out)
    log_p = unc.predictive_log_probs(samples)
    for fn in (unc.nll, unc.brier_score, unc.expected_calibration_error):
        out = fn(log_p, labels)
        assert out.dtype == dtype, fn.__name__
        close(jax.jit(fn)(log_p, labels), out)
        # vmap over a batch of models equals each model's score.
        batched = jax.vmap(fn)(jnp.stack([log_p, log_p[::-1]]), jnp.stack([labels, labels[::-1]]))
        close(batched[1], out)
    mean, var = unc.regression_moments(samples)
    assert mean.dtype == var.dtype == dtype


_LABELS, _VALID = jnp.zeros(3, jnp.int32), jnp.ones(3, bool)


@pytest.mark.parametrize(
    "call",
    [
        *SUMMARIES,
        unc.regression_moments,
        lambda log_p: unc.nll(log_p, _LABELS, mask=_VALID),
        lambda log_p: unc.brier_score(log_p, _LABELS),
        lambda log_p: unc.expected_calibration_error(log_p, _LABELS, num_bins=4),
        lambda log_p: unc.reliability(log_p, _LABELS, num_bins=4),
    ],
)
def test_each_function_is_one_jitted_computation(call) -> None:
    # Called eagerly, a function compiles one program, not one per operation.
    jaxpr = jax.make_jaxpr(call)(jnp.zeros((3, 4)))
    assert [e.primitive.name for e in jaxpr.eqns] == ["jit"]


def test_nll_gradient_matches_finite_differences() -> None:
    samples = jax.random.normal(jax.random.key(1), (3, 2, 4))
    labels = jnp.array([1, 3])
    check_grads(  # jit: the numerical check evaluates the function many times
        jax.jit(lambda s: unc.nll(unc.predictive_log_probs(s), labels)),
        (samples,),
        order=1,
        atol=1e-2,
        rtol=1e-2,
    )
    check_grads(jax.jit(unc.mutual_information), (samples,), order=1, atol=1e-2, rtol=1e-2)


def test_reliability_diagram_draws_the_non_empty_bins() -> None:
    pytest.importorskip("matplotlib")
    log_p = jnp.log(jnp.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4]]))
    ax = unc.reliability_diagram(log_p, jnp.array([0, 1, 0]), num_bins=5, label="model")
    assert len(ax.patches) == 2
    assert "ECE 0.400" in ax.get_legend().get_texts()[0].get_text()


def test_errors_are_one_line_with_the_fix() -> None:
    samples = jnp.zeros((2, 3, 4))
    with pytest.raises(dropmask.DropmaskValueError, match=r"\[samples, \.\.\., classes\]"):
        unc.mutual_information(jnp.zeros(4))
    with pytest.raises(dropmask.DtypeError, match="floating-point"):
        unc.predictive_entropy(jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(dropmask.DropmaskValueError, match="predictive_log_probs"):
        unc.nll(samples, jnp.zeros(3, jnp.int32))
    with pytest.raises(dropmask.DtypeError, match="labels must be integers"):
        unc.nll(samples[0], jnp.zeros(3))
    with pytest.raises(dropmask.DtypeError, match="mask must be boolean"):
        unc.brier_score(samples[0], jnp.zeros(3, jnp.int32), mask=jnp.ones(3))
    with pytest.raises(dropmask.MaskShapeError, match="does not broadcast"):
        unc.brier_score(samples[0], jnp.zeros(3, jnp.int32), mask=jnp.ones(2, bool))
    with pytest.raises(dropmask.DropmaskValueError, match="num_bins must be >= 1"):
        unc.expected_calibration_error(samples[0], jnp.zeros(3, jnp.int32), num_bins=0)
