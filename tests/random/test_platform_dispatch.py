"""The kernels are chosen by the platform a program is lowered for, not by the process.

On a TPU host (the default backend reported as a TPU here) dropout and attention trace
the TPU kernels, and lowering decides: lowered for the CPU a program takes XLA's path
(attention: the path it takes without the kernels), for a TPU the Mosaic kernels, and a
program exported for both lowers for each. The TPU lowering is Pallas to Mosaic on this
CPU (``lowering_for_a_tpu``); nothing here runs on a TPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.covering import covering

import dropmask

KEY = jax.random.key(11)
MOSAIC = "tpu_custom_call"


def _dropout(x):
    return dropmask.dropout(x, 0.25, KEY)


def _attention(q, algorithm="pallas"):
    return dropmask.dot_product_attention(
        q, q, q, dropout_rate=0.25, dropout_rng=KEY, is_causal=True, algorithm=algorithm
    )


def _without_kernels(name):
    """What a CPU process computes: for attention, the path the call takes on a TPU host
    where the kernels do not run (the blockwise path, the same mask)."""
    fn = CASES[name][0]
    return (lambda q: _attention(q, "blockwise")) if name == "attention" else fn


def _dropout_grad(x):
    return jax.grad(lambda x: jnp.sum(jnp.sin(_dropout(x))))(x)


CASES = {
    "dropout": (_dropout, (64, 256), "dropmask_tpu_masked_linear"),
    # differentiated: the bytes the flags kernel draws, selected by XLA
    "dropout, differentiated": (_dropout_grad, (64, 256), "dropmask_tpu_bytes_linear"),
    "attention": (_attention, (1, 256, 2, 64), "dropmask_flash_fwd"),
}


@pytest.fixture
def tpu_host(monkeypatch, lowering_for_a_tpu):
    """This process as a TPU host's would trace: the default backend a TPU."""
    del lowering_for_a_tpu
    jax.clear_caches()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    yield
    jax.clear_caches()


def _x(shape):
    return jax.random.normal(jax.random.key(2), shape, jnp.float32)


# Fast: dropout and attention; differentiated dropout (slow) takes the CPU path when
# lowered by jit in test_on_a_mesh_a_cpu_computation_on_a_tpu_host_takes_the_cpu_path.
@pytest.mark.parametrize("name", covering(CASES, ["dropout", "attention"]))
def test_a_cpu_computation_on_a_tpu_host_takes_the_cpu_path_with_the_same_values(
    name, monkeypatch, request
):
    fn, shape, kernel = CASES[name]
    x = _x(shape)
    want = jax.jit(_without_kernels(name))(x)
    request.getfixturevalue("tpu_host")
    assert kernel in str(jax.make_jaxpr(fn)(x))  # traced, to be chosen when lowered
    lowered = jax.jit(fn).lower(x).as_text()
    assert MOSAIC not in lowered
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x)), np.asarray(want))


@pytest.mark.parametrize("name", list(CASES))
def test_an_export_for_the_cpu_and_a_tpu_lowers_for_each(name, request):
    fn, shape, _ = CASES[name]
    x = _x(shape)
    want = jax.jit(_without_kernels(name))(x)
    request.getfixturevalue("tpu_host")
    both = jax.export.export(jax.jit(fn), platforms=("cpu", "tpu"))(x)
    tpu = jax.export.export(jax.jit(fn), platforms=("tpu",))(x)
    cpu = jax.export.export(jax.jit(fn), platforms=("cpu",))(x)
    assert MOSAIC in both.mlir_module() and MOSAIC in tpu.mlir_module()
    assert MOSAIC not in cpu.mlir_module()
    np.testing.assert_array_equal(np.asarray(both.call(x)), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(cpu.call(x)), np.asarray(want))


def test_on_a_mesh_a_cpu_computation_on_a_tpu_host_takes_the_cpu_path(request):
    """Under a mesh of explicit axes the bytes are traced on each device's block inside
    ``shard_map``; lowered for the CPU there is no Mosaic call and no collective, and
    the values are the unsharded CPU process's."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    x = _x((64, 256))
    want = jax.jit(_dropout_grad)(x)
    request.getfixturevalue("tpu_host")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    spec = jax.sharding.PartitionSpec("data")
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
    with jax.set_mesh(mesh):
        assert "dropmask_tpu_bytes_linear" in str(jax.make_jaxpr(_dropout_grad)(xs))
        compiled = jax.jit(_dropout_grad).lower(xs).compile()
        got = compiled(xs)
    text = compiled.as_text()
    assert MOSAIC not in text
    assert not any(op in text for op in ("all-gather", "all-reduce", "all-to-all"))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
