"""The dense path's weights: one softmax, compiled once, for every input.

Its values, flags and derivatives on adversarial inputs (NaN, inf, overflow) are
checked against the blockwise and Pallas paths in ``test_attention_paths.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import dropmask as dm

B, T, H, D = 2, 16, 4, 8


def test_the_dense_path_compiles_one_softmax():
    """No run-time choice between two softmaxes: the program holds no ``cond`` and one
    exponential, forward and with dropout's gradient alike."""
    q = jnp.ones((B, T, H, D))
    forward = jax.jit(lambda q: dm.dot_product_attention(q, q, q, algorithm="dense"))

    def loss(q):
        out = dm.dot_product_attention(
            q, q, q, algorithm="dense", dropout_rate=0.1, key=jax.random.key(0),
            deterministic=False,
        )  # fmt: skip
        return jnp.sum(out)

    for program in (forward, jax.jit(jax.grad(loss))):
        hlo = program.lower(q).compile().as_text()
        assert " conditional(" not in hlo
        assert hlo.count(" exponential(") == 1, hlo


def test_under_vmap_the_batch_gets_what_each_member_gets_alone():
    q = jax.random.normal(jax.random.key(1), (3, 1, T, H, D)).at[1, 0, 2, 0, 0].set(jnp.nan)
    batched = jax.vmap(lambda q: dm.dot_product_attention(q, q, q))(q)
    for i in range(3):
        one = dm.dot_product_attention(q[i], q[i], q[i])
        np.testing.assert_allclose(batched[i], one, rtol=1e-6, atol=1e-6)
