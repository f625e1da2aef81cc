"""A TPU attention kernel that Mosaic fails to lower: the call takes the path without the
kernels (the same mask), with one warning, instead of failing its program.

Lowered for a TPU on this CPU (``lowering_for_a_tpu``): compiled kernels, not the
interpreter. The failure is forced by a kernel body that sorts its products, which
Pallas's TPU lowering does not implement."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from tests.covering import covering

import dropmask as dm
from dropmask import testing
from dropmask._attention import _flash_fallback
from dropmask._attention import _flash_tpu_calls as fc
from dropmask._attention import _flash_tpu_kernels as fk
from dropmask._random import _placement

KEY = jax.random.key(3)
KW = {"is_causal": True, "dropout_rate": 0.1, "key": KEY, "deterministic": False}


@pytest.fixture
def fresh_trials(monkeypatch):
    """Empty caches of tried kernels and configurations: a broken body's answer must not
    reach another test."""
    monkeypatch.setattr(_placement, "_LOWERED", {})
    monkeypatch.setattr(_flash_fallback, "_TRIED", {})


def _broken(monkeypatch, name):
    """The kernel body ``name`` with every product sorted: Mosaic cannot lower it."""
    body = getattr(fc, name)

    def sorted_products(flash, *refs):
        real = fk._dot
        fk._dot = lambda *args: lax.sort(real(*args))
        try:
            body(flash, *refs)
        finally:
            fk._dot = real

    monkeypatch.setattr(fc, name, sorted_products)


def _qkv(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    return tuple(jnp.asarray(rng.normal(size=(2, 1024, 4, 64)), dtype) for _ in range(3))


def _loss(q, k, v, **kw):
    return jnp.sum(dm.dot_product_attention(q, k, v, algorithm="pallas", **kw) * jnp.cos(q))


def _exported(q, k, v):
    grad = jax.jit(jax.grad(functools.partial(_loss, **KW), (0, 1, 2)))
    with testing.tpu_kernels():
        return jax.export.export(grad, platforms=["tpu"])(q, k, v).mlir_module()


def _dropmask_warnings(record):
    return [str(w.message) for w in record if "dot_product_attention" in str(w.message)]


# Fast: the forward kernel; the dk/dv kernel (slow) fails over the same way.
@pytest.mark.parametrize("name", covering(["forward_kernel", "dkdv_kernel"], ["forward_kernel"]))
def test_a_kernel_mosaic_cannot_lower_sends_the_call_to_the_blockwise_path(
    name, monkeypatch, lowering_for_a_tpu, fresh_trials
):
    _broken(monkeypatch, name)
    q, k, v = _qkv()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        text = _exported(q, k, v)
        again = _exported(q, k, v)  # the configuration's answer is cached: no second warning
        with testing.tpu_kernels():
            got = jax.jit(jax.grad(functools.partial(_loss, **KW), (0, 1, 2)))(q, k, v)
    assert "tpu_custom_call(" not in text and "tpu_custom_call(" not in again
    (message,) = _dropmask_warnings(record)
    kernel = {"forward_kernel": "dropmask_flash_fwd", "dkdv_kernel": "dropmask_flash_dkdv"}[name]
    assert message.startswith(
        f"dot_product_attention: Mosaic failed to lower the TPU attention kernel {kernel} "
        "(NotImplementedError: Unimplemented primitive in Pallas TPU lowering"
    )
    assert "q (2, 1024, 4, 64) float32" in message and "the same dropout mask" in message
    for g, w in zip(got, _blockwise_grads(q, k, v), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _blockwise_grads(q, k, v):
    def loss(q, k, v):
        out = dm.dot_product_attention(q, k, v, algorithm="blockwise", **KW)
        return jnp.sum(out * jnp.cos(q))

    return jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)


def test_kernels_that_lower_are_tried_once_and_warn_nothing(lowering_for_a_tpu, fresh_trials):
    q, k, v = _qkv(jnp.bfloat16)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        text = _exported(q, k, v)
        tried = dict(_placement._LOWERED)
        _exported(q, k, v)
    assert _dropmask_warnings(record) == []
    assert text.count("tpu_custom_call(") == 3  # forward, dk/dv (dq fused), the flags
    assert len(tried) == 3 and set(tried.values()) == {None}
    assert _placement._LOWERED == tried  # the second trace lowered nothing more
    assert list(_flash_fallback._TRIED.values()) == [None]
