"""float32 at the default precision: the TPU kernels' gradients against XLA's, with a
TPU's rounding emulated on the CPU (every product's operands rounded to bfloat16, as a
TPU's single pass does). ``rowsum(dO * O)`` must be the sum the ``dP`` products round
to (``_flash_tpu_plan.consistent``), or every ``dS`` of a row carries the difference."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from tests.covering import covering

import dropmask as dm
from dropmask import testing
from dropmask._attention import _flash_tpu as ft
from dropmask._attention import _flash_tpu_kernels as fk

SHAPE = (1, 256, 2, 128)
KEY = jax.random.key(9)
INPUTS = jax.random.key(100)


def _rounded(x: jax.Array) -> jax.Array:
    """float32 ``x`` rounded to bfloat16's precision (to nearest, ties to even), by its
    bits, which no compiler pass folds away."""
    if x.dtype != jnp.float32:
        return x
    u = lax.bitcast_convert_type(x, jnp.uint32)
    u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
    return lax.bitcast_convert_type(u, jnp.float32)


def _tpu_product(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """An einsum whose forward and backward products round their operands, as XLA's
    products at the default precision do on a TPU."""

    @jax.custom_vjp
    def product(a, b):
        return jnp.einsum(spec, _rounded(a), _rounded(b))

    def forward(a, b):
        return product(a, b), (a, b)

    def backward(saved, ct):
        a, b = saved
        _, by_a = jax.vjp(lambda a: jnp.einsum(spec, a, _rounded(b)), _rounded(a))
        _, by_b = jax.vjp(lambda b: jnp.einsum(spec, _rounded(a), b), _rounded(b))
        return by_a(_rounded(ct))[0], by_b(_rounded(ct))[0]

    product.defvjp(forward, backward)
    return product(a, b)


def _xla_dense(q, k, v, rate, product):
    s = product("bqhd,bkhd->bhqk", q * q.shape[-1] ** -0.5, k)
    causal = jnp.tril(jnp.ones(s.shape[-2:], bool))
    p = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
    if rate:
        p = jnp.where(dm.keep_mask(KEY, p.shape, rate), p / (1 - rate), 0.0)
    return product("bhqk,bkhd->bqhd", p, v)


def _kernels(q, k, v, rate):
    return dm.dot_product_attention(
        q, k, v, is_causal=True, algorithm="pallas", block_q=128, block_k=128,
        dropout_rate=rate, key=KEY, deterministic=not rate, broadcast_dropout=False,
    )  # fmt: skip


def _grads(f, q, k, v, g):
    return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * g), (0, 1, 2))(q, k, v)


def _errors(got, want) -> np.ndarray:
    """Each gradient's relative error in the root mean square (steadier than the
    largest entry's from one draw to the next)."""
    return np.array(
        [float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) for a, b in zip(got, want, strict=True)]
    )


@pytest.mark.parametrize("rate", covering([0.0, 0.1], [0.1]))  # fast: with dropout
def test_gradients_as_accurate_as_xlas_where_products_round(rate, monkeypatch):
    q, k, v, g = (jax.random.normal(x, SHAPE, jnp.float32) for x in jax.random.split(INPUTS, 4))
    with jax.enable_x64():
        exact = lambda q, k, v: _xla_dense(q, k, v, rate, jnp.einsum)  # noqa: E731
        wide = [x.astype(jnp.float64) for x in (q, k, v, g)]
        want = [np.asarray(x) for x in _grads(exact, *wide)]
    xla = _errors(_grads(lambda q, k, v: _xla_dense(q, k, v, rate, _tpu_product), q, k, v, g), want)

    def rounded_dot(flash, a, b, dims):
        return lax.dot_general(_rounded(a), _rounded(b), dims, preferred_element_type=jnp.float32)

    monkeypatch.setattr(fk, "_dot", rounded_dot)
    with testing.tpu_kernels():  # interpreted, so ``consistent`` is off: products did not round
        inconsistent = _errors(_grads(lambda *a: _kernels(*a, rate), q, k, v, g), want)
        monkeypatch.setattr(
            ft, "consistent", lambda flash, dtype: dataclasses.replace(flash, consistent=True)
        )
        got = _errors(_grads(lambda *a: _kernels(*a, rate), q, k, v, g), want)
    # Without dropout the kernels' sums are XLA's; with it, v / keep rounds, not p / keep.
    assert np.all(got <= (1.001 if rate == 0 else 1.03) * xla), (got, xla)
    if rate:  # without ``consistent``: dq and dk 1.1x-1.2x XLA's error
        assert np.all(inconsistent[:2] > 1.1 * xla[:2]), (inconsistent, xla)
