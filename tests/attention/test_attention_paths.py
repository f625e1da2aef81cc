"""One function however it is computed: the dense, blockwise and Pallas (interpreted)
attention paths against each other on adversarial inputs, values and gradients.

Hypothesis draws the inputs: NaN, +inf and -inf in ``q``, ``k``, ``v`` and the bias,
masked rows and fully masked rows, scales whose scores overflow float16 (and float32),
in float32, bfloat16 and float16. Every path must put NaN in the same places, in the
output and in the gradients, and agree elsewhere to the dtype's round-off (see
``docs/attention.md``, "Non-finite inputs and overflow").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dropmask as dm
from dropmask import testing
from dropmask._attention import _flash_dropout as fd

B, LQ, LK, H, KV_HEADS, D = 2, 5, 7, 2, 1, 4  # grouped-query: two query heads per key head
# Blockwise tiles that do not divide the lengths; Pallas's smallest tiles.
# "tpu": algorithm="pallas" inside testing.tpu_kernels(), the Pallas TPU kernels in
# Pallas's TPU interpreter, at their smallest tiles; "tpu, stored": the same with the
# dropout flags drawn once into bits whatever they take (at these sizes the kernels
# would draw them in each kernel).
TILES = {
    "dense": {},
    "blockwise": {"block_q": 2, "block_k": 3},
    "pallas": {},
    "tpu": {"block_q": 16, "block_k": 128},
    "tpu, stored": {"block_q": 16, "block_k": 128},
}
TPU_PATHS = ("tpu", "tpu, stored")
# Per dtype, the relative round-off the paths may differ by (16-bit outputs and
# weights are rounded once on one path and not on another).
TOL = {"float32": 2e-5, "bfloat16": 3e-2, "float16": 4e-3}
# 1: ordinary; 300: scores around 1e5, beyond float16's 65504; 1e20: every product
# of a query and a key entry overflows float32 (+-inf, NaN where they meet).
SCALES = (1.0, 300.0, 1e20)
_SPECIALS = (np.nan, np.inf, -np.inf)


def _loss(algorithm, options, q, k, v, bias, mask, key):
    kw = dict(options)
    if key is not None:  # every path draws the same mask from one key
        kw.update(key=key, deterministic=False)
    # The TPU kernels take no dense mask: with key_padding, ``mask`` is a kv_mask.
    masks = {"kv_mask": mask} if kw.pop("key_padding", False) else {"mask": mask}
    out = dm.dot_product_attention(
        q,
        k,
        v,
        bias=bias,
        algorithm="pallas" if algorithm in TPU_PATHS else algorithm,
        **TILES[algorithm],
        **masks,
        **kw,
    )
    weights = jax.lax.broadcasted_iota(jnp.float32, out.shape, out.ndim - 1) + 1.0
    return jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights), out


@functools.partial(jax.jit, static_argnames=("algorithm", "options"))
def _run(algorithm, options, q, k, v, bias, mask, key):
    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    grad = jax.grad(functools.partial(_loss, algorithm, options), argnums, has_aux=True)
    grads, out = grad(q, k, v, bias, mask, key)
    return out, grads


def _values(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    # Magnitudes in [0.5, 1.5) * scale: at 1e20 every product of two entries overflows,
    # whatever order a path sums them in.
    sign = rng.choice([-1.0, 1.0], size=shape)
    return sign * (0.5 + rng.random(shape)) * scale


@st.composite
def _cases(draw: st.DrawFn, *, bias: bool) -> dict:
    dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    scale = draw(st.sampled_from(SCALES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = {
        "q": _values(rng, (B, LQ, H, D), scale),
        "k": _values(rng, (B, LK, KV_HEADS, D), scale),
        "v": _values(rng, (B, LK, KV_HEADS, D), 1.0),
    }
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(arrays)))
        index = tuple(draw(st.integers(0, n - 1)) for n in arrays[name].shape)
        arrays[name][index] = draw(st.sampled_from(_SPECIALS))
    mask = rng.random((B, 1, LQ, LK)) < draw(st.sampled_from([0.3, 0.7, 1.0]))
    for _ in range(draw(st.integers(0, 2))):  # queries with no valid key at all
        mask[draw(st.integers(0, B - 1)), 0, draw(st.integers(0, LQ - 1))] = False
    with np.errstate(over="ignore"):  # 1e20 is inf in float16: a non-finite input
        out = {name: jnp.asarray(x.astype(jnp.dtype(dtype))) for name, x in arrays.items()}
    out["mask"] = jnp.asarray(mask)
    out["bias"] = None
    if bias:
        b = rng.normal(size=(B, H, LQ, LK)) * draw(st.sampled_from([1.0, 1e5]))
        for _ in range(draw(st.integers(0, 3))):
            index = tuple(draw(st.integers(0, n - 1)) for n in b.shape)
            b[index] = draw(st.sampled_from(_SPECIALS))
        out["bias"] = jnp.asarray(b, jnp.float32)
    out["options"] = (("is_causal", draw(st.booleans())),)
    out["key"] = None
    if draw(st.booleans()):
        out["options"] += (("dropout_rate", 0.3),)
        out["key"] = jax.random.key(draw(st.integers(0, 2**32 - 1)))
    return out


def _largest(*arrays) -> float:
    """The largest finite magnitude among ``arrays`` (at most 1e3: beyond, every score
    overflows, and what is finite is exact)."""
    finite = [np.abs(a[np.isfinite(a)]) for a in map(lambda x: np.asarray(x, np.float64), arrays)]
    return min(1e3, max([1.0] + [float(f.max()) for f in finite if f.size]))


def _same(got, want, tol: float, what: str, size: float = 1.0) -> None:
    """Same NaN and inf places, and finite values within ``tol`` of the larger of
    ``want`` and ``size`` (the magnitude the round-off is relative to)."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN places")
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=f"{what}: infinities")
    if finite.any():
        size = max(size, float(np.abs(want[finite]).max()))
        np.testing.assert_allclose(
            got[finite], want[finite], rtol=tol, atol=tol * size, err_msg=what
        )


@contextlib.contextmanager
def _way(path: str) -> Iterator[None]:
    """Where ``path`` runs: the TPU kernels, storing the flags for "tpu, stored"."""
    if path not in TPU_PATHS:
        yield
        return
    stores = fd.stores
    if path == "tpu, stored":
        fd.stores = lambda plan, interpret, rows, budget: stores(plan, interpret, rows, 2**62)
    try:
        with testing.tpu_kernels():
            yield
    finally:
        fd.stores = stores


def _check(case: dict, paths: tuple[str, ...]) -> None:
    args = (case["q"], case["k"], case["v"], case["bias"], case["mask"], case["key"])
    tol = TOL[str(case["q"].dtype)]
    want_out, want_grads = _run("dense", case["options"], *args)
    for path in paths:
        with _way(path):
            out, grads = _run(path, case["options"], *args)
        if path in TPU_PATHS:
            # Its dk/dv kernel computes the scores transposed (k q^T): the same products
            # summed in another order, so a weight may differ by the scores' round-off,
            # float32's epsilon times their bound, relative (at scale 300, about 1%).
            score_bound = _largest(case["q"]) * _largest(case["k"]) * D**0.5
            path_tol = max(tol, float(np.finfo(np.float32).eps) * score_bound)
        else:
            path_tol = tol
        assert out.dtype == want_out.dtype
        _same(out, want_out, path_tol, f"{path} output")
        # A gradient's round-off is the weights' times the other inputs (dq = ds @ k):
        # relative to the largest of them, and one more rounding step.
        size = _largest(case["q"], case["k"], case["v"])
        for name, g, w in zip("qkvb", grads, want_grads, strict=False):
            assert g.dtype == w.dtype
            _same(g, w, 4 * path_tol, f"{path} d{name}", size)


# The fast suite's sample; the slow marker's ``_many`` twins draw 1000 (50 for the TPU
# kernels) from the same strategies.
_FAST = settings(max_examples=3, suppress_health_check=[HealthCheck.too_slow])
_MANY = settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])


@_FAST
@given(_cases(bias=False))
def test_dense_blockwise_and_pallas_agree_on_adversarial_inputs(case):
    _check(case, ("blockwise", "pallas"))


@_FAST
@given(_cases(bias=True))
def test_dense_and_blockwise_agree_with_an_adversarial_bias(case):
    _check(case, ("blockwise",))


def _key_padding(case: dict) -> dict:
    """The case with its dense mask's first query row as each batch row's key padding."""
    options = (*case["options"], ("key_padding", True))
    return {**case, "mask": case["mask"][:, 0, 0, :], "options": options}


@settings(max_examples=3, suppress_health_check=[HealthCheck.too_slow])  # interpreted
@given(_cases(bias=False))
def test_dense_and_the_tpu_kernels_agree_on_adversarial_inputs(case):
    # float16 takes the blockwise path there: it is checked all the same.
    # The flags stored, as the kernels do at their default tiles; the 50 slow cases
    # draw them in each kernel.
    _check(_key_padding(case), ("blockwise", "tpu, stored"))


@pytest.mark.slow
@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(_cases(bias=False))
def test_dense_and_the_tpu_kernels_agree_on_adversarial_inputs_many(case):
    _check(_key_padding(case), ("tpu",))


@pytest.mark.slow
@_MANY
@given(_cases(bias=False))
def test_dense_blockwise_and_pallas_agree_on_adversarial_inputs_many(case):
    _check(case, ("blockwise", "pallas"))


@pytest.mark.slow
@_MANY
@given(_cases(bias=True))
def test_dense_and_blockwise_agree_with_an_adversarial_bias_many(case):
    _check(case, ("blockwise",))


def test_a_row_with_no_valid_key_is_zero_whatever_its_q_on_every_path():
    q = jnp.ones((1, 2, 1, 4)).at[0, 1, 0, 0].set(jnp.nan)
    k = v = jnp.ones((1, 3, 1, 4))
    mask = jnp.array([[True, True, True], [False, False, False]])
    for path in ("dense", "blockwise", "pallas"):
        out, (dq, dk, dv) = _run(path, (), q, k, v, None, mask, None)
        np.testing.assert_array_equal(np.asarray(out[0, 1]), 0.0, err_msg=path)
        for g in (dq, dk, dv):
            assert bool(jnp.isfinite(g).all()), path


def test_float16_scores_beyond_65504_are_finite_on_every_path():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(_values(rng, (1, 4, 1, 8), s), jnp.float16) for s in (300, 300, 1))
    want = dm.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)))
    for path in ("dense", "blockwise", "pallas"):
        out, grads = _run(path, (), q, k, v, None, None, None)
        assert bool(jnp.isfinite(out).all()), path
        assert all(bool(jnp.isfinite(g).all()) for g in grads), path
        np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=4e-3, atol=4e-3)
