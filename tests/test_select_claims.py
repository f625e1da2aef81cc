"""The facts ``dropmask why`` reports about dropout's last line, checked on this backend.

``lax.select(mask, x / keep, zeros_like(x))`` (Flax's spelling), ``jnp.where(mask,
x / keep, 0)`` and ``mask * x / keep``: each test reads one claim's verdict and the
measurement behind it from :func:`dropmask.why.check_claims`, so the command, the
document that quotes it and these tests rest on the same code.
"""

from __future__ import annotations

import jax
import pytest

from dropmask import why

CPU = jax.default_backend() == "cpu"


@pytest.fixture(scope="module")
def claims() -> dict[str, why.Claim]:
    return {c.id: c for c in why.check_claims(timing=False).claims}


def test_where_compiles_to_the_same_program_as_select(claims):
    claim = claims["where-is-select"]
    assert claim.verdict == why.HOLDS
    assert len(claim.data) == 4 and all(row["hlo same as select"] for row in claim.data)


def test_python_zero_keeps_half_precision(claims):
    claim = claims["zero-promotes"]
    assert claim.verdict == why.NOT
    for dtype in ("f16", "bf16", "f32"):
        row = claim.data[dtype]
        assert row["where"] == row["select"] == row["multiply"]
    assert claim.data["bf16"]["where(np.float32(0))"] == "float32"


def test_select_rejects_mismatched_dtypes(claims):
    assert claims["select-is-strict"].verdict == why.HOLDS
    assert claims["select-is-strict"].data == {"select rejects": True, "where promotes": True}


@pytest.mark.skipif(not CPU, reason="XLA:CPU's simplifier rewrites the f32 form")
def test_multiply_mask_is_rewritten_in_f32_but_not_in_bf16(claims):
    claim = claims["multiply-converts-mask"]
    assert claim.verdict == why.DEPENDS
    by_dtype = {row["dtype"]: row for row in claim.data}
    assert by_dtype["f32"]["hlo select"] == 1 and by_dtype["f32"]["hlo convert"] == 0
    assert by_dtype["bf16"]["hlo select"] == 0 and by_dtype["bf16"]["hlo multiply"] == 2
    assert all(row["jaxpr array converts"] == 1 for row in claim.data)


def test_finite_times_zero_is_exactly_zero(claims):
    assert claims["tiny-nonzero"].verdict == why.NOT
    assert claims["tiny-nonzero"].data == {"f16": True, "bf16": True, "f32": True}


def test_only_the_multiply_form_leaks_nan(claims):
    claim = claims["multiply-leaks-nan"]
    assert all(v["nan"] == 0 for k, v in claim.data.items() if "multiply" not in k)
    assert claim.data["bf16 multiply jit"]["nan"] == 3  # inf, -inf, nan at dropped slots
    assert claim.data["bf16 multiply eager"]["-0.0"] == 1  # dropped -3.0
    if CPU:
        assert claim.verdict == why.DEPENDS
        assert claim.data["f32 multiply jit"]["nan"] == 0


def test_select_backward_touches_every_element(claims):
    claim = claims["select-backward-skips"]
    assert claim.verdict == why.NOT
    assert claim.data["backward select sizes"] == [claim.data["input size"]]


def test_no_form_keeps_gradients_finite_at_keep_zero_or_through_log_zero(claims):
    keep_zero = claims["select-guards-keep-zero"]
    assert keep_zero.verdict == why.NOT
    assert keep_zero.data["select"] == {
        "keep=0 output NaN": False,
        "keep=0 grad NaN": True,
        "log(0) at dropped: grad NaN": True,
    }
    assert keep_zero.data["multiply"]["keep=0 output NaN"] is True
    assert claims["where-guards-log-zero"].verdict == why.NOT
    assert all(v["log(0) at dropped: grad NaN"] for v in keep_zero.data.values())


def test_f16_division_by_a_small_keep_overflows(claims):
    claim = claims["f16-overflow"]
    assert claim.verdict == why.HOLDS
    assert claim.data["first keep that overflows"] == 0.01  # 1000 / 0.02 = 50000 fits


def test_dropmask_keeps_one_bit_per_element_or_none(claims):
    claim = claims["residual-bytes"]
    assert claim.verdict == why.HOLDS
    assert claim.data["bernoulli + select: bool mask"] == pytest.approx(1.0, abs=1e-3)
    assert claim.data["bernoulli + select"] >= 1.0
    assert claim.data["dropmask.dropout"] <= 0.13
    assert claim.data["dropmask.dropout residual='none'"] < 0.01
