"""Attention with dropout under a mesh of explicit axes, on XLA's paths: outputs and
gradients equal the unsharded call's. The dense path's backward pass transposes its
products by hand, at types an einsum may shard otherwise than the cotangent that
arrives; the blockwise path fills its loops from a 0 that keeps the sharded axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import dropmask


def _mesh(devices: int):
    if len(jax.devices()) < devices:
        pytest.skip(f"needs {devices} devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh((devices,), ("data",), axis_types=(AxisType.Explicit,))


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("algorithm", ["dense", "blockwise"])
def test_gradients_under_a_mesh_of_explicit_axes_equal_the_unsharded_ones(
    devices, dtype, algorithm
):
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, g = (jax.random.normal(kk, (devices, 64, 2, 32), dtype) for kk in ks)

    def loss(q, k, v, g):
        out = dropmask.dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_rate=0.1,
            key=jax.random.key(1),
            deterministic=False,
            algorithm=algorithm,
        )
        return jnp.sum((out * g).astype(jnp.float32))

    grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    want = grads(q, k, v, g)
    mesh = _mesh(devices)
    with jax.set_mesh(mesh):
        args = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (q, k, v, g)]
        got = grads(*args)
    # The same mask; XLA's partitioned program may round another way.
    tol = 1e-5 if dtype == "float32" else 2e-2
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
