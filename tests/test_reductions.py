"""Masked reductions: values and gradients against the sliced, unpadded computation."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.experimental import checkify
from jax.test_util import check_grads

import dropmask as dm

# A few fixed shapes keep the compilation count (and the test time) bounded while
# lengths, holes, junk and values vary freely.
SHAPES = [(1, 1), (3, 5), (2, 8)]
JUNK = np.array([np.nan, np.inf, -np.inf, 3e38], dtype=np.float32)


@st.composite
def padded(draw):
    """``(x, mask)``: f32 [batch, time] with NaN/inf/huge junk in every masked slot."""
    b, t = draw(st.sampled_from(SHAPES))
    lengths = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        mask = np.arange(t) < np.array(lengths)[:, None]  # right padding, lengths 0..t
    else:
        mask = rng.random((b, t)) < 0.6  # arbitrary holes
        mask[rng.integers(b)] = False  # at least one empty row
    x = (rng.normal(size=(b, t)) * 3).astype(np.float32)
    x = np.where(mask, x, rng.choice(JUNK, size=(b, t)))
    return x, mask


def _rows(x, mask):
    return [x[i][mask[i]].astype(np.float64) for i in range(x.shape[0])]


def _lse(v):
    top = v.max()
    return np.log(np.exp(v - top).sum()) + top


def _softmax(v):
    e = np.exp(v - v.max())
    return e / e.sum()


# name -> (fn over the last axis, numpy reference on the valid values of a row, empty value)
ROW_REDUCTIONS = {
    "sum": (dm.masked_sum, np.sum, 0.0),
    "mean": (dm.masked_mean, np.mean, 0.0),
    "var": (dm.masked_var, np.var, 0.0),
    "std": (dm.masked_std, np.std, 0.0),
    "max": (dm.masked_max, np.max, 0.0),
    "min": (dm.masked_min, np.min, 0.0),
    "logsumexp": (dm.masked_logsumexp, _lse, -np.inf),
}


@jax.jit
def _all_reductions(x, mask):
    rows = {k: f(x, mask, axis=-1) for k, (f, _, _) in ROW_REDUCTIONS.items()}
    return rows, dm.masked_softmax(x, mask), dm.masked_log_softmax(x, mask)


@given(padded())
def test_reductions_equal_the_sliced_computation(data):
    x, mask = data
    rows = _rows(x, mask)
    results, soft, log_soft = _all_reductions(x, mask)
    for name, (_, ref, empty) in ROW_REDUCTIONS.items():
        got = np.asarray(results[name])
        want = np.array([ref(r) if r.size else empty for r in rows])
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=name)
    for i, r in enumerate(rows):
        want = np.zeros(x.shape[1])
        want[mask[i]] = _softmax(r) if r.size else []
        np.testing.assert_allclose(soft[i], want, rtol=1e-5, atol=1e-6)
        want_log = np.zeros(x.shape[1])
        want_log[mask[i]] = np.log(_softmax(r)) if r.size else []
        np.testing.assert_allclose(log_soft[i], want_log, rtol=1e-5, atol=1e-5)


def _weighted(fn, w):
    return lambda x, m: jnp.sum(fn(x, m) * w)


@jax.jit
def _all_grads(x, mask):
    """``{name: (value, grad)}`` of a random weighting of every masked function."""
    rng = np.random.default_rng(0)
    w_row = jnp.asarray(rng.normal(size=x.shape[:1]), jnp.float32)
    w_full = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    fns = {k: (functools.partial(f, axis=-1), w_row) for k, (f, _, _) in ROW_REDUCTIONS.items()}
    # -inf (log 0) on empty rows would make the weighted sum -inf + inf.
    fns["logsumexp"] = (functools.partial(dm.masked_logsumexp, axis=-1, fill=0.0), w_row)
    fns["softmax"] = (dm.masked_softmax, w_full)
    fns["log_softmax"] = (dm.masked_log_softmax, w_full)
    return {
        k: jax.value_and_grad(lambda v, f=f, w=w: jnp.sum(f(v, mask) * w))(x)
        for k, (f, w) in fns.items()
    }


@given(padded())
def test_gradients_ignore_junk_and_are_zero_where_masked(data):
    x, mask = data
    clean = np.where(mask, x, 0).astype(np.float32)
    with jax.debug_nans(True):
        results = _all_grads(x, mask)
    results_clean = _all_grads(clean, mask)
    for name, (value, grad) in results.items():
        value_clean, grad_clean = results_clean[name]
        grad = np.asarray(grad)
        assert np.isfinite(grad).all(), name
        assert (grad[~mask] == 0).all(), name
        # Masked slots never influence anything: junk or zeros give identical results.
        np.testing.assert_array_equal(grad, np.asarray(grad_clean), err_msg=name)
        np.testing.assert_array_equal(np.asarray(value), np.asarray(value_clean), err_msg=name)


@jax.jit
def _ours_and_reference_grads(clean, mask):
    """Gradients of dropmask and of JAX's ``where=`` reductions on finite data."""
    nonempty = mask.any(-1)
    pairs = {
        "sum": (dm.masked_sum, lambda v: jnp.sum(v, axis=-1, where=mask)),
        "mean": (dm.masked_mean, lambda v: jnp.mean(v, axis=-1, where=mask)),
        "logsumexp": (dm.masked_logsumexp, lambda v: jax.nn.logsumexp(v, axis=-1, where=mask)),
        "softmax": (
            lambda v, m, axis: dm.masked_softmax(v, m, axis)[:, 0],
            lambda v: jax.nn.softmax(v, where=mask)[:, 0],
        ),
    }
    out = {}
    for name, (ours, ref) in pairs.items():

        def total(v, f):
            return jnp.sum(jnp.where(nonempty, f(v), 0))

        got = jax.grad(total)(clean, lambda v, ours=ours: ours(v, mask, axis=-1))
        want = jax.grad(total)(clean, ref)
        out[name] = (got, jnp.where(mask & nonempty[:, None], want, 0))
    return out


@given(padded())
def test_gradients_match_jax_on_clean_nonempty_rows(data):
    x, mask = data
    clean = np.where(mask, x, 0).astype(np.float32)
    for name, (got, want) in _ours_and_reference_grads(clean, mask).items():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


# ----------------------------------------------------- the worked masking examples


PADDED = jnp.array([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]])


def test_worked_masked_sum_and_mean():
    mask = PADDED != 0
    assert dm.masked_sum(PADDED, mask, axis=-1).tolist() == [6, 9, 30]
    assert dm.masked_sum(PADDED.astype(jnp.float32), mask, axis=-1).tolist() == [6.0, 9.0, 30.0]
    np.testing.assert_allclose(dm.masked_mean(PADDED, mask, axis=-1), [2.0, 4.5, 7.5], rtol=0)
    assert dm.masked_mean(PADDED, mask, axis=-1).dtype == jnp.float32


def test_worked_attention_scores_softmax():
    mask = PADDED != 0
    scores = jax.random.normal(jax.random.key(0), (3, 4))
    weights = dm.masked_softmax(scores, mask)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert (weights[~mask] == 0).all()
    # The recipe's -1e9 fill agrees wherever a row has a valid element.
    recipe = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    np.testing.assert_allclose(weights, recipe, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------- the anchors' failures


def test_empty_row_where_anchors_return_nan_or_uniform():
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    mask = jnp.array([[True, True], [False, False]])
    assert np.isnan(jax.nn.softmax(jnp.where(mask, x, -jnp.inf))[1]).all()
    np.testing.assert_allclose(jax.nn.softmax(jnp.where(mask, x, jnp.finfo(x.dtype).min))[1], 0.5)
    assert np.isnan(jnp.mean(x, axis=-1, where=mask)[1])
    assert dm.masked_softmax(x, mask)[1].tolist() == [0.0, 0.0]
    assert dm.masked_mean(x, mask, axis=-1)[1] == 0.0
    # The classic leak: NaN in a padded slot reaches the gradient through `where`.
    junk = x.at[1, 0].set(jnp.nan)
    leak = jax.grad(lambda v: jnp.sum(jnp.where(mask, jnp.square(v), 0)))
    assert np.isnan(leak(junk)).any()
    ours = jax.grad(lambda v: jnp.sum(dm.masked_sum(jnp.square(jnp.where(mask, v, 0)), mask)))(junk)
    assert np.isfinite(ours).all()


EMPTY_CONTRACT = [
    ("masked_sum", {}, 0.0),
    ("masked_mean", {}, 0.0),
    ("masked_mean", {"fill": -1.0}, -1.0),
    ("masked_var", {}, 0.0),
    ("masked_var", {"fill": 7.0}, 7.0),
    ("masked_std", {}, 0.0),
    ("masked_max", {}, 0.0),
    ("masked_max", {"fill": -5.0}, -5.0),
    ("masked_min", {"fill": 5.0}, 5.0),
    ("masked_logsumexp", {}, -np.inf),
    ("masked_logsumexp", {"fill": 0.0}, 0.0),
]


@pytest.mark.parametrize(("name", "kwargs", "expected"), EMPTY_CONTRACT)
def test_empty_row_contract(name, kwargs, expected):
    fn = getattr(dm, name)
    x = jnp.array([[jnp.nan, jnp.inf, 1.0]])
    mask = jnp.zeros((1, 3), bool)
    assert fn(x, mask, axis=-1, **kwargs).tolist() == [expected]
    with jax.debug_nans(True):
        grad = jax.jit(
            jax.grad(lambda v: jnp.sum(jnp.where(True, fn(v, mask, axis=-1, **kwargs), 0)))
        )(x)
    assert grad.tolist() == [[0.0, 0.0, 0.0]]


def test_empty_row_contract_softmax_family():
    x = jnp.array([[jnp.nan, -jnp.inf]])
    mask = jnp.zeros((1, 2), bool)
    assert dm.masked_softmax(x, mask).tolist() == [[0.0, 0.0]]
    assert dm.masked_log_softmax(x, mask).tolist() == [[0.0, 0.0]]
    assert dm.masked_log_softmax(x, mask, fill=-jnp.inf).tolist() == [[-np.inf, -np.inf]]
    for fn in (dm.masked_softmax, dm.masked_log_softmax):
        with jax.debug_nans(True):
            grad = jax.jit(jax.grad(lambda v, fn=fn: jnp.sum(fn(v, mask))))(x)
        assert grad.tolist() == [[0.0, 0.0]]


def test_valid_nan_propagates():
    x = jnp.array([jnp.nan, 1.0])
    mask = jnp.array([True, True])
    for fn in (dm.masked_sum, dm.masked_mean, dm.masked_max, dm.masked_logsumexp):
        assert np.isnan(fn(x, mask)), fn.__name__
    assert np.isnan(dm.masked_softmax(x, mask)).all()


def test_valid_infinities():
    mask = jnp.array([True, True, False])
    assert dm.masked_logsumexp(jnp.array([-jnp.inf, -jnp.inf, 5.0]), mask) == -jnp.inf
    assert dm.masked_logsumexp(jnp.array([jnp.inf, 0.0, 5.0]), mask) == jnp.inf
    assert dm.masked_max(jnp.array([-jnp.inf, -jnp.inf, 5.0]), mask) == -jnp.inf
    soft = dm.masked_softmax(jnp.array([-jnp.inf, 0.0, jnp.nan]), mask)
    assert soft.tolist() == [0.0, 1.0, 0.0]


# ----------------------------------------------------------------- axes, dtypes, transforms


@functools.partial(jax.jit, static_argnames="axis")
def _axis_variants(x, mask, axis):
    return (
        dm.masked_sum(x, mask, axis=axis, keepdims=True),
        dm.masked_mean(x, mask, axis=axis),
        dm.masked_var(x, mask, axis=axis, ddof=1),
    )


def test_axes_keepdims_and_broadcast_mask():
    x = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    mask = np.array([True, False, True, True])  # broadcasts over [2, 3, 4]
    full = np.broadcast_to(mask, x.shape)
    for axis in (None, -1, (0, 2), (0, 1)):
        total, mean, var = _axis_variants(x, mask, axis)
        np.testing.assert_array_equal(total, np.sum(x, axis=axis, keepdims=True, where=full))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy: empty slices are NaN
            want_mean = np.mean(x, axis=axis, where=full)
            want_var = np.var(x, axis=axis, where=full, ddof=1)
        np.testing.assert_allclose(mean, np.nan_to_num(want_mean, nan=0.0), rtol=1e-6)
        np.testing.assert_allclose(var, np.nan_to_num(want_var, nan=0.0), rtol=1e-5)
    soft = dm.masked_softmax(x, mask[None, None], axis=(1, 2))
    np.testing.assert_allclose(soft.sum((1, 2)), 1.0, rtol=1e-6)
    assert dm.masked_max(x, None, axis=1).shape == (2, 4)


def test_ddof_leaves_too_few_elements_undefined():
    x = jnp.array([[1.0, 2.0], [3.0, 0.0]])
    mask = jnp.array([[True, True], [True, False]])
    got = dm.masked_var(x, mask, axis=-1, ddof=1, fill=-1.0)
    np.testing.assert_allclose(got, [0.5, -1.0], rtol=1e-6)
    np.testing.assert_allclose(dm.masked_std(x, mask, axis=-1, ddof=1), [0.5**0.5, 0.0], rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_reduced_in_f32_and_returned_in_input_dtype(dtype):
    rng = np.random.default_rng(0)
    # A large mean with a small spread: E[x^2] - E[x]^2 in 16 bits would be noise.
    x = jnp.asarray(1000.0 + rng.normal(size=(4, 2048)), dtype)
    mask = jnp.asarray(rng.random((4, 2048)) < 0.7)
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    m = np.asarray(mask)
    want_var = np.array([x64[i][m[i]].var() for i in range(4)])
    want_mean = np.array([x64[i][m[i]].mean() for i in range(4)])
    for name in (
        "masked_sum",
        "masked_mean",
        "masked_var",
        "masked_std",
        "masked_max",
        "masked_logsumexp",
    ):
        assert getattr(dm, name)(x, mask, axis=-1).dtype == dtype, name
    for fn in (dm.masked_softmax, dm.masked_log_softmax):
        assert fn(x, mask).dtype == dtype
    np.testing.assert_allclose(
        dm.masked_var(x, mask, axis=-1).astype(jnp.float32), want_var, rtol=2e-2
    )
    np.testing.assert_allclose(
        dm.masked_mean(x, mask, axis=-1).astype(jnp.float32), want_mean, rtol=4e-3
    )
    soft = dm.masked_softmax(x, mask).astype(jnp.float32)
    np.testing.assert_allclose(soft.sum(-1), 1.0, rtol=2e-2)


def test_jit_vmap_grad_agree():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    mask = jnp.asarray(rng.random((3, 5)) < 0.5).at[0].set(False)

    @jax.jit
    def both(x, mask):
        fns = (dm.masked_mean, dm.masked_var, dm.masked_logsumexp, dm.masked_max)
        batched = [fn(x, mask, axis=-1) for fn in fns]
        mapped = [jax.vmap(lambda r, m, fn=fn: fn(r, m))(x, mask) for fn in fns]
        grad = jax.grad(lambda v: dm.masked_std(v, mask, axis=-1).sum())(x)
        return batched, mapped, grad

    batched, mapped, grad = both(x, mask)
    for b, m in zip(batched, mapped, strict=True):
        np.testing.assert_allclose(m, b, rtol=1e-6)
    np.testing.assert_allclose(batched[1], dm.masked_var(x, mask, axis=-1), rtol=1e-6)
    assert jnp.isfinite(grad).all()


def test_check_grads_on_smooth_reductions():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)
    mask = jnp.array([[True, True, False, True], [True, False, False, False]])
    for fn in (dm.masked_mean, dm.masked_var, dm.masked_logsumexp):
        check_grads(  # jit: the numerical check evaluates the function many times
            jax.jit(lambda v, fn=fn: fn(v, mask, axis=-1)),
            (x,),
            order=1,
            modes=["rev"],
            atol=2e-2,
            rtol=2e-2,
        )
    check_grads(
        jax.jit(lambda v: dm.masked_softmax(v, mask)),
        (x,),
        order=1,
        modes=["rev"],
        atol=2e-2,
        rtol=2e-2,
    )


def test_gradients_in_float64_including_second_order():
    """The custom softmax derivative is itself differentiable; attention checks exactly."""
    with jax.enable_x64(True):
        x = jnp.array([[0.3, -1.2, 2.0, 0.5], [1.0, 2.0, 3.0, 4.0]], jnp.float64)
        mask = jnp.array([[True, True, False, True], [False] * 4])
        softmax = jax.jit(lambda v: dm.masked_softmax(v, mask))
        check_grads(softmax, (x,), order=2, modes=["rev"])
        q = jax.random.normal(jax.random.key(0), (1, 3, 2, 4), jnp.float64)
        causal_pad = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
        attend = jax.jit(lambda q: dm.dot_product_attention(q, q, q, mask=causal_pad))
        check_grads(attend, (q,), order=1, modes=["rev"])


# ----------------------------------------------------------------- cross-entropy


CE = jax.jit(dm.masked_cross_entropy, static_argnames="reduction")
OPTAX_CE = jax.jit(optax.softmax_cross_entropy_with_integer_labels)


def _token_data(seed=0, b=3, t=5, c=7):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(b, t, c)).astype(np.float32)
    lengths = np.array([t, 2, 0][:b])
    mask = np.arange(t) < lengths[:, None]
    labels = np.where(mask, rng.integers(0, c, size=(b, t)), -100)
    logits = np.where(mask[..., None], logits, np.nan)
    return logits, labels, mask


def test_cross_entropy_is_the_mean_over_valid_tokens_only():
    logits, labels, mask = _token_data()
    loss = CE(logits, labels, mask)
    valid = OPTAX_CE(logits[mask], labels[mask])
    np.testing.assert_allclose(loss, valid.mean(), rtol=1e-6)
    np.testing.assert_allclose(CE(logits, labels, mask, reduction="sum"), valid.sum(), rtol=1e-6)
    per_token = np.asarray(CE(logits, labels, mask, reduction="none"))
    np.testing.assert_allclose(per_token[mask], valid, rtol=1e-6)
    assert (per_token[~mask] == 0).all()
    # The Flax seq2seq example's loss averages over padding too (with finite padding).
    finite = np.where(mask[..., None], logits, 0.0)
    padded_mean = OPTAX_CE(finite, np.maximum(labels, 0)).mean()
    assert abs(float(padded_mean) - float(loss)) > 1e-3


def test_cross_entropy_gradients():
    logits, labels, mask = _token_data()
    with jax.debug_nans(True):
        grad = jax.jit(jax.grad(dm.masked_cross_entropy))(logits, labels, mask)
    grad = np.asarray(grad)
    assert np.isfinite(grad).all()
    assert (grad[~mask] == 0).all()
    want = jax.grad(
        lambda v: optax.softmax_cross_entropy_with_integer_labels(v, labels[mask]).mean()
    )(logits[mask])
    np.testing.assert_allclose(grad[mask], want, rtol=1e-5, atol=1e-7)


def test_cross_entropy_soft_labels_and_no_valid_token():
    logits, labels, mask = _token_data()
    probs = jax.nn.one_hot(np.maximum(labels, 0), 7)
    np.testing.assert_allclose(
        CE(logits, probs, mask),
        CE(logits, labels, mask),
        rtol=1e-6,
    )
    none = np.zeros_like(mask)
    assert CE(logits, labels, none) == 0.0
    with jax.debug_nans(True):
        grad = jax.jit(jax.grad(dm.masked_cross_entropy))(logits, labels, none)
    assert (np.asarray(grad) == 0).all()
    assert (
        dm.masked_cross_entropy(jnp.zeros((2, 3), jnp.bfloat16), jnp.array([0, 1])).dtype
        == jnp.bfloat16
    )


def test_cross_entropy_out_of_range_labels():
    logits = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"labels of valid tokens must be in \[0, 3\)"):
        dm.masked_cross_entropy(logits, jnp.array([0, 3]))
    # Traced labels cannot be checked up front: a bad valid label gives NaN, never a clipped class.
    loss = jax.jit(dm.masked_cross_entropy)(logits, jnp.array([0, 3]), jnp.array([True, True]))
    assert np.isnan(loss)
    ok = jax.jit(dm.masked_cross_entropy)(logits, jnp.array([0, 3]), jnp.array([True, False]))
    np.testing.assert_allclose(ok, np.log(3), rtol=1e-6)
    # Under checkify, as a traced dropout rate, it is an error naming the range.
    checked = checkify.checkify(jax.jit(dm.masked_cross_entropy), errors=checkify.user_checks)
    err, _ = checked(logits, jnp.array([0, 3]), jnp.array([True, True]))
    with pytest.raises(checkify.JaxRuntimeError, match=r"labels of valid tokens .* \[0, 3\)"):
        err.throw()
    checked(logits, jnp.array([0, 3]), jnp.array([True, False]))[0].throw()


# ----------------------------------------------------------------- errors


def test_errors():
    x = jnp.ones((2, 3))
    with pytest.raises(dm.DtypeError, match="mask must be boolean"):
        dm.masked_sum(x, jnp.ones((2, 3)))
    with pytest.raises(dm.MaskShapeError, match=r"pass mask\[\.\.\., None\]"):
        dm.masked_mean(jnp.ones((2, 3, 4)), jnp.ones((2, 3), bool))
    with pytest.raises(dm.AxisError, match="axis"):
        dm.masked_max(x, None, axis=2)
    with pytest.raises(dm.AxisError, match="repeats"):
        dm.masked_sum(x, None, axis=(1, -1))
    with pytest.raises(dm.DtypeError, match="floating-point"):
        dm.masked_softmax(jnp.ones(3, jnp.int32), None)
    with pytest.raises(dm.DtypeError, match="floating or integer"):
        dm.masked_sum(jnp.ones(3, bool), None)
    with pytest.raises(TypeError, match="fill must be a scalar"):
        dm.masked_mean(x, None, axis=0, fill=jnp.zeros(3))
    with pytest.raises(ValueError, match="ddof"):
        dm.masked_var(x, None, ddof=-1)
    with pytest.raises(dm.DtypeError, match="fill must be an int"):
        dm.masked_max(jnp.ones(3, jnp.int32), None, fill=0.5)
    with pytest.raises(ValueError, match="reduction"):
        dm.masked_cross_entropy(x, jnp.array([0, 1]), reduction="avg")
    with pytest.raises(dm.MaskShapeError, match="must have shape"):
        dm.masked_cross_entropy(x, jnp.array([0, 1, 2]))
    with pytest.raises(dm.MaskShapeError, match="class axis"):
        dm.masked_cross_entropy(jnp.float32(1.0), jnp.int32(0))
    with pytest.raises(dm.DtypeError, match="labels"):
        dm.masked_cross_entropy(x, jnp.ones((2, 3), bool))
    assert dm.masked_max(jnp.array([3, 1], jnp.int32), jnp.array([False, True])).tolist() == 1


# --------------------------------------------------------------- adversarial inputs

ALL_REDUCTIONS = [
    dm.masked_sum,
    dm.masked_mean,
    dm.masked_var,
    dm.masked_std,
    dm.masked_max,
    dm.masked_min,
    dm.masked_logsumexp,
    dm.masked_softmax,
    dm.masked_log_softmax,
]


@pytest.mark.parametrize("fn", ALL_REDUCTIONS, ids=lambda f: f.__name__)
def test_scalar_input_with_an_axis_names_the_function_and_the_fix(fn):
    with pytest.raises(dm.AxisError, match=f"{fn.__name__}: x is 0-d .*axis=None"):
        fn(jnp.float32(2.0), None, axis=0)
    assert isinstance(dm.AxisError("x"), dm.DropmaskError)
    assert np.isfinite(fn(jnp.float32(2.0), None, axis=None))  # a scalar reduces with None
    with pytest.raises(dm.AxisError, match=f"{fn.__name__}: axis contains axis 3"):
        fn(jnp.ones((2, 2)), None, axis=3)


@pytest.mark.parametrize("fn", ALL_REDUCTIONS, ids=lambda f: f.__name__)
def test_zero_length_axis_is_an_empty_row(fn):
    x, mask = jnp.zeros((2, 0)), jnp.zeros((2, 0), bool)
    out = np.asarray(fn(x, mask, axis=-1))
    if fn in (dm.masked_softmax, dm.masked_log_softmax):
        assert out.shape == (2, 0)
    else:
        want = -np.inf if fn is dm.masked_logsumexp else 0.0
        np.testing.assert_array_equal(out, [want, want])
    assert np.asarray(fn(jnp.zeros((0, 3)), jnp.zeros((0, 3), bool), axis=-1)).shape[0] == 0


def test_complex_sum_and_mean_and_clear_errors_elsewhere():
    x = jnp.array([[1 + 2j, 3 - 1j, jnp.nan], [0j, 0j, 0j]], jnp.complex64)
    mask = jnp.array([[True, True, False], [False, False, False]])
    np.testing.assert_allclose(dm.masked_sum(x, mask, axis=-1), [4 + 1j, 0], rtol=0, atol=0)
    mean = dm.masked_mean(x, mask, axis=-1)
    assert mean.dtype == jnp.complex64
    np.testing.assert_allclose(mean, [2 + 0.5j, 0], rtol=1e-7, atol=0)
    for fn in (dm.masked_max, dm.masked_var, dm.masked_logsumexp, dm.masked_softmax):
        with pytest.raises(dm.DtypeError, match=f"{fn.__name__} needs real values.*jnp.abs"):
            fn(x, mask, axis=-1)


def test_masks_given_as_lists_like_x():
    assert dm.masked_sum([1.0, 2.0, 4.0], [True, False, True]).tolist() == 5.0
    with pytest.raises(dm.DtypeError, match="mask must be boolean"):
        dm.masked_sum([1.0, 2.0], [1, 0])


def test_cross_entropy_and_integer_fill_edge_inputs():
    logits = jnp.zeros((2, 3))
    loss = dm.masked_cross_entropy(logits, jnp.array([0, 2]), [True, False])
    np.testing.assert_allclose(loss, np.log(3.0), rtol=1e-6, atol=0)
    with pytest.raises(dm.DtypeError, match="masked_cross_entropy needs real values"):
        dm.masked_cross_entropy(logits.astype(jnp.complex64), jnp.array([0, 2]))
    with pytest.raises(dm.DropmaskValueError, match=r"fill=-1 cannot be stored in x's dtype uint8"):
        dm.masked_max(jnp.array([1, 2], jnp.uint8), jnp.array([False, False]), fill=-1)
    empty = dm.masked_max(jnp.array([1, 2], jnp.uint8), jnp.array([False, False]), fill=7)
    assert empty.dtype == jnp.uint8 and int(empty) == 7
