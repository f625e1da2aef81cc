"""Pins the facts behind docs/select_vs_where.md (seed 000), so the document cannot rot.

The seed asks why Flax's dropout ends in ``lax.select(mask, x / keep, zeros_like(x))``
rather than ``jnp.where(mask, x / keep, 0)`` or ``mask * x / keep``. Each test states
one measured fact; if JAX or XLA changes it, the test fails and the document must be
updated with it. Nothing here times anything (speed lives in benchmarks/bench_select.py).
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

KEEP = 0.9
DTYPES = [jnp.float32, jnp.bfloat16]


def forms(keep=KEEP):
    """The seed's three spellings, verbatim (benchmarks/bench_select.py has the same)."""
    return {
        "select": lambda x, mask: lax.select(mask, x / keep, jnp.zeros_like(x)),
        "where": lambda x, mask: jnp.where(mask, x / keep, 0),
        "multiply": lambda x, mask: mask * x / keep,
    }


def fwd_bwd(form):
    def run(x, mask, g):
        y, vjp_fn = jax.vjp(lambda x: form(x, mask), x)
        return y, vjp_fn(g)[0]

    return run


_HLO_OP = re.compile(r"=\s*(?:\([^=]*?\)|\S+)\s+([a-z][a-z0-9-]*)\(")


def hlo_ops(text):
    """Opcode histogram of optimized HLO text, fusion bodies included."""
    found = (_HLO_OP.search(line) for line in text.splitlines() if "%" in line.split("=")[0])
    return collections.Counter(m.group(1) for m in found if m)


def normalized_hlo(text):
    """Optimized HLO instructions with names and metadata stripped."""
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("%", "ROOT %", "ENTRY")):
            line = re.sub(r",?\s*metadata=\{[^}]*\}", "", line)
            lines.append(re.sub(r"%[\w.-]+", "%v", line))
    return "\n".join(lines)


def _inputs(dtype, n=1 << 14, seed=0):
    kx, km, kg = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (n,), dtype)
    mask = jax.random.bernoulli(km, KEEP, (n,))
    g = jax.random.normal(kg, (n,), dtype)
    return x, mask, g


def _bits(a):
    arr = np.asarray(a)
    return arr.view({2: np.uint16, 4: np.uint32}[arr.dtype.itemsize])


def _compiled(fn, *args):
    return jax.jit(fn).lower(*args).compile().as_text()


# --- jnp.where is lax.select ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_where_lowers_to_select_n(dtype):
    x, mask, _ = _inputs(dtype, n=8)
    jaxpr = jax.make_jaxpr(forms()["where"])(x, mask)
    where_call = [e for e in jaxpr.eqns if e.primitive.name in ("pjit", "jit")]
    assert len(where_call) == 1
    inner = [e.primitive.name for e in where_call[0].params["jaxpr"].eqns]
    assert "select_n" in inner
    # The only convert is of the scalar 0 (weak-typed int literal), not of an array.
    for eqn in where_call[0].params["jaxpr"].eqns:
        if eqn.primitive.name == "convert_element_type":
            assert eqn.outvars[0].aval.shape == ()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_select_and_where_compile_to_identical_hlo(dtype, mode):
    x, mask, g = _inputs(dtype, n=256)
    texts = {}
    for name in ("select", "where"):
        fn = forms()[name] if mode == "fwd" else fwd_bwd(forms()[name])
        args = (x, mask) if mode == "fwd" else (x, mask, g)
        texts[name] = _compiled(fn, *args)
    assert normalized_hlo(texts["select"]) == normalized_hlo(texts["where"])
    assert hlo_ops(texts["select"]) == hlo_ops(texts["where"])


def test_f32_multiply_form_is_rewritten_to_select_by_xla():
    # XLA's simplifier turns convert(pred) * x into select(pred, x, 0) for f32 on CPU,
    # so the compiled multiply form contains a select and no float mask.
    x, mask, _ = _inputs(jnp.float32, n=256)
    ops = hlo_ops(_compiled(forms()["multiply"], x, mask))
    assert ops["select"] == 1
    assert ops["multiply"] == 1  # the 1/keep scaling only


def test_bf16_multiply_form_is_not_rewritten():
    x, mask, _ = _inputs(jnp.bfloat16, n=256)
    ops = hlo_ops(_compiled(forms()["multiply"], x, mask))
    assert ops["select"] == 0
    assert ops["multiply"] == 2  # mask * x, then * (1/keep)


# --- dtypes --------------------------------------------------------------------------


def test_where_with_python_zero_keeps_bf16():
    x = jnp.ones((4,), jnp.bfloat16)
    mask = jnp.ones((4,), bool)
    assert jnp.where(mask, x / KEEP, 0).dtype == jnp.bfloat16
    assert jnp.where(mask, x / KEEP, 0.0).dtype == jnp.bfloat16
    assert (mask * x / KEEP).dtype == jnp.bfloat16
    assert lax.select(mask, x / KEEP, jnp.zeros_like(x)).dtype == jnp.bfloat16


def test_where_with_strongly_typed_f32_zero_promotes():
    # The seed's promotion worry is real only for a *strongly* typed zero.
    x = jnp.ones((4,), jnp.bfloat16)
    mask = jnp.ones((4,), bool)
    assert jnp.where(mask, x, np.float32(0)).dtype == jnp.float32
    assert jnp.where(mask, x, jnp.float32(0)).dtype == jnp.float32


def test_python_float_keep_is_rounded_to_bf16():
    # x / 0.9 with bf16 x divides by bf16(0.9) = 0.8984375, in all three spellings.
    assert float(jnp.asarray(KEEP, jnp.bfloat16)) == 0.8984375
    x = jnp.ones((4,), jnp.bfloat16)
    assert float((x / KEEP)[0]) == float(jnp.bfloat16(1 / 0.8984375))


# --- exactness -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_select_and_where_are_bit_identical(dtype):
    x, mask, g = _inputs(dtype)
    y_s, dx_s = jax.jit(fwd_bwd(forms()["select"]))(x, mask, g)
    y_w, dx_w = jax.jit(fwd_bwd(forms()["where"]))(x, mask, g)
    np.testing.assert_array_equal(_bits(y_s), _bits(y_w))
    np.testing.assert_array_equal(_bits(dx_s), _bits(dx_w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_multiply_form_equal_in_value_for_finite_inputs(dtype):
    x, mask, g = _inputs(dtype)
    y_s, dx_s = jax.jit(fwd_bwd(forms()["select"]))(x, mask, g)
    y_m, dx_m = jax.jit(fwd_bwd(forms()["multiply"]))(x, mask, g)
    # assert_array_equal treats -0.0 == 0.0: equal values, not necessarily equal bits.
    np.testing.assert_array_equal(np.asarray(y_s, np.float32), np.asarray(y_m, np.float32))
    np.testing.assert_array_equal(np.asarray(dx_s, np.float32), np.asarray(dx_m, np.float32))


def test_bf16_multiply_form_gives_negative_zero_where_select_gives_zero():
    x, mask, _ = _inputs(jnp.bfloat16)
    y_s = np.asarray(jax.jit(forms()["select"])(x, mask), np.float32)
    y_m = np.asarray(jax.jit(forms()["multiply"])(x, mask), np.float32)
    dropped_negative = ~np.asarray(mask) & (np.asarray(x, np.float32) < 0)
    assert dropped_negative.any()
    assert not np.signbit(y_s[~np.asarray(mask)]).any()
    assert np.signbit(y_m[dropped_negative]).all()


# --- non-finite inputs at dropped positions ---------------------------------------------


def _specials(dtype):
    finfo = jnp.finfo(dtype)
    x = jnp.asarray([np.inf, -np.inf, np.nan, float(finfo.max), -3.0], dtype)
    return x, jnp.zeros((5,), bool)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["select", "where"])
def test_select_and_where_drop_inf_and_nan_to_exact_zero(dtype, name):
    x, mask = _specials(dtype)
    for fn in (forms()[name], jax.jit(forms()[name])):
        y = _bits(fn(x, mask))
        assert (y == 0).all()  # +0.0 bit pattern, no NaN, no -0.0


def test_bf16_multiply_form_leaks_nan_for_inf_and_nan_inputs():
    x, mask = _specials(jnp.bfloat16)
    for fn in (forms()["multiply"], jax.jit(forms()["multiply"])):
        y = np.asarray(fn(x, mask), np.float32)
        assert np.isnan(y[:3]).all()  # 0 * inf, 0 * -inf, 0 * nan
        assert y[3] == 0


def test_f32_multiply_form_answer_depends_on_the_compiler():
    # The same multiply, unfused (a float mask built first) follows IEEE and gives NaN;
    # the fused jnp expression is rewritten by XLA into a select and gives 0.
    x, mask = _specials(jnp.float32)
    fused = np.asarray(jax.jit(forms()["multiply"])(x, mask))
    assert (fused[:3] == 0).all()
    float_mask = jax.device_put(np.zeros(5, np.float32))
    unfused = np.asarray(jax.jit(lambda x, m: m * x / KEEP)(x, float_mask))
    assert np.isnan(unfused[:3]).all()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_finite_times_zero_is_exactly_zero(dtype):
    # The seed's "huge * 0 may give a tiny nonzero" is false under IEEE 754.
    finfo = jnp.finfo(dtype)
    values = jnp.asarray([finfo.max, -finfo.max, finfo.tiny, finfo.smallest_subnormal, 1.0], dtype)
    prod = np.asarray(values * jnp.zeros((), dtype), np.float32)
    assert (prod == 0).all()


# --- gradients ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["select", "where", "multiply"])
def test_gradient_is_mask_over_keep_for_finite_inputs(dtype, name):
    x, mask, g = _inputs(dtype)
    _, dx = jax.jit(fwd_bwd(forms()[name]))(x, mask, g)
    expected = jnp.where(mask, g / KEEP, 0)
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(expected, np.float32))


@pytest.mark.parametrize("name", ["select", "where", "multiply"])
def test_keep_zero_gives_nan_gradients_for_every_form(name):
    # Why Flax returns zeros_like(x) for rate == 1 before reaching the select: the
    # transpose of x / 0 multiplies the (zero) cotangent by 1/0.
    x, mask, g = _inputs(jnp.bfloat16)
    _, dx = jax.jit(fwd_bwd(forms(0.0)[name]))(x, jnp.zeros_like(mask), g)
    assert jnp.isnan(dx).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_keep_zero_forward_select_is_zero_multiply_is_nan(dtype):
    x, mask, _ = _inputs(dtype)
    none = jnp.zeros_like(mask)
    assert (jax.jit(forms(0.0)["select"])(x, none) == 0).all()
    assert jnp.isnan(jax.jit(forms(0.0)["multiply"])(x, none)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_inf_cotangent_at_dropped_positions(dtype):
    x, mask, g = _inputs(dtype)
    inf_ct = jnp.where(mask, g, jnp.inf)
    for name in ("select", "where"):
        _, dx = fwd_bwd(forms()[name])(x, mask, inf_ct)
        assert not jnp.isnan(dx).any()
    _, dx = fwd_bwd(forms()["multiply"])(x, mask, inf_ct)  # eager: IEEE 0 * inf
    assert jnp.isnan(dx).any()


@pytest.mark.parametrize("name", ["select", "where", "multiply"])
def test_no_form_avoids_the_where_gradient_trap(name):
    # select does not "skip" the dropped branch in backward: a -inf = log(0) feeding a
    # dropped position still turns its zero cotangent into NaN.
    x, mask, _ = _inputs(jnp.float32)
    u = jnp.where(mask, jnp.abs(x) + 1, 0.0)
    grad = jax.jit(jax.grad(lambda u, m: forms()[name](jnp.log(u), m).sum()))(u, mask)
    assert jnp.isnan(grad[~mask]).all()
    assert not jnp.isnan(grad[mask]).any()


def test_select_backward_is_a_full_size_select():
    # The backward pass of the select form computes select(mask, 0, g) / keep for every
    # element: it is as much work as the forward, no element is skipped.
    x, mask, g = _inputs(jnp.float32, n=64)
    _, vjp_fn = jax.vjp(lambda x: forms()["select"](x, mask), x)
    eqns = jax.make_jaxpr(vjp_fn)(g).eqns
    selects = [e for e in eqns if e.primitive.name == "select_n"]
    assert len(selects) == 1
    assert selects[0].outvars[0].aval.shape == (64,)


def test_xla_computes_x_over_keep_as_x_times_reciprocal():
    # Not the seed's question, but it bounds "bit-exact": all three spellings divide the
    # same way, and that way is x * fl(1/keep), not a correctly rounded x / keep.
    x = np.asarray(jax.random.normal(jax.random.key(4), (1 << 14,), jnp.float32))
    y = np.asarray(jax.jit(lambda x: x / KEEP)(x))
    np.testing.assert_array_equal(y, x * (np.float32(1) / np.float32(KEEP)))
    assert (y != x / np.float32(KEEP)).any()
