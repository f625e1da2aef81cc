"""The masking benchmark's pass loop does each pass's work, for every output leaf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from benchmarks import bench_masking


def test_loop_sums_every_pass() -> None:
    x = jnp.arange(6.0).reshape(2, 3)
    mask = x > 1
    run = bench_masking._looped(lambda x, m: jnp.where(m, x, 0.0), 3)
    np.testing.assert_allclose(run(jnp.float32(0), x, mask), 3 * np.where(mask, x, 0.0))


def test_loop_shifts_the_first_input_by_pass() -> None:
    x = jnp.zeros((4,))
    run = bench_masking._looped(lambda x: x, 4)
    # Passes see x + i * eps for i = 0..3: with eps = 1 the sum is 0 + 1 + 2 + 3.
    np.testing.assert_allclose(run(jnp.float32(1), x), np.full(4, 6.0))


def test_loop_accumulates_value_and_grad() -> None:
    f = bench_masking._with_grad(lambda x, m: jnp.where(m, x * x, 0.0))
    x = jnp.array([1.0, 2.0, 3.0])
    mask = jnp.array([True, False, True])
    value, grad = bench_masking._looped(f, 2)(jnp.float32(0), x, mask)
    want_value, want_grad = jax.jit(f)(x, mask)
    np.testing.assert_allclose(value, 2 * want_value)
    np.testing.assert_allclose(grad, 2 * want_grad)
