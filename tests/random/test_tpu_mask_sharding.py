"""The dropout kernel on many devices: 8 CPU devices, the kernel in Pallas's TPU interpreter.

Under a mesh of explicit axes the kernel runs on each device's block inside
``shard_map``, and differentiated, the flags kernel's bytes, selected by XLA; every
sharding must give the unsharded call's outputs and gradients bit for bit, and the
compiled program must move nothing between devices. What the kernel cannot split, and
a program XLA partitions itself, take XLA's path with the same bits.
"""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tests.covering import covering

import dropmask
from dropmask import linen as dl
from dropmask import nnx as dnnx
from dropmask import testing

KEY = jax.random.key(7)
RATE = 0.3
SHAPE = (8, 128, 256)
COLLECTIVES = re.compile(r"\b(all-gather|all-to-all|all-reduce|collective-permute|reduce-scatter)")


def _mesh(kind: str, axis_type=AxisType.Explicit) -> Mesh:
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    if kind == "8":
        return jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)


def _x(seed: int = 1) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), SHAPE, jnp.float32)


def _dropout(x, rate=RATE):
    return dropmask.dropout(x, rate, KEY)


def _vjp(x, ct):
    return jax.vjp(_dropout, x)[1](ct)[0]


def _uses_kernel(f, *args) -> bool:
    return "dropmask_tpu_masked_linear" in str(jax.make_jaxpr(f)(*args))


def _uses_bytes(f, *args) -> bool:
    """Whether ``f`` selects by the flags kernel's bytes alone (differentiated dropout)."""
    jaxpr = str(jax.make_jaxpr(f)(*args))
    return "dropmask_tpu_bytes_linear" in jaxpr and "dropmask_tpu_masked_linear" not in jaxpr


def _collectives(f, *args) -> list[str]:
    return sorted(set(COLLECTIVES.findall(jax.jit(f).lower(*args).compile().as_text())))


SPLITS = [
    ("8", P("data")),  # data parallel
    ("8", P(None, "data")),  # rows
    ("4x2", P("data", None, "model")),  # 2-D, the last axis split into 128-lane halves
    ("4x2", P(("data", "model"))),
    ("4x2", P("model", "data")),
    ("8", P()),  # replicated: each device the whole array
]


# Fast: the 4 x 2 mesh's splits and the replicated array; the 8-device mesh's batch and
# rows splits are slow (the 4 x 2 splits hold a batch split over two axes, and rows
# split over "data").
@pytest.mark.parametrize(
    ("mesh", "spec"),
    covering(SPLITS, [s for s in SPLITS if s[0] == "4x2" or s[1] == P()], unpack=True),
    ids=[f"{m}-{s}" for m, s in SPLITS],
)
def test_each_sharding_draws_the_unsharded_mask_with_no_collective(mesh, spec):
    x, ct = _x(1), _x(2)
    want, want_ct = _dropout(x), _vjp(x, ct)
    mesh_ = _mesh(mesh)
    put = lambda a: jax.device_put(a, NamedSharding(mesh_, spec))  # noqa: E731
    xs, cts = put(x), put(ct)
    with testing.tpu_kernels(), jax.set_mesh(mesh_):
        assert _uses_kernel(_dropout, xs) and _uses_bytes(_vjp, xs, cts)
        got = jax.jit(_dropout)(xs)
        got_ct = jax.jit(_vjp)(xs, cts)
        got_rate = jax.jit(_dropout)(xs, jnp.float32(RATE))
        assert _collectives(_dropout, xs) == []
        assert _collectives(_vjp, xs, cts) == []
    assert got.sharding.is_equivalent_to(xs.sharding, got.ndim)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_ct), np.asarray(want_ct))
    np.testing.assert_array_equal(np.asarray(got_rate), np.asarray(want))


def test_a_split_the_kernel_cannot_take_draws_the_same_bits_by_xlas_path():
    """The last axis in eight: 32 lanes a block, not the kernel's whole 128."""
    x = _x()
    want = _dropout(x)
    mesh = _mesh("8")
    xs = jax.device_put(x, NamedSharding(mesh, P(None, None, "data")))
    with testing.tpu_kernels(), jax.set_mesh(mesh):
        assert not _uses_kernel(_dropout, xs)
        got = jax.jit(_dropout)(xs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    ("shape", "dtype", "spec"),
    [
        ((8, 16, 100), jnp.float32, P("data")),  # a last axis that is not whole registers
        ((4, 80, 200), jnp.bfloat16, P(None, "data")),  # rows split, columns padded
        ((8, 16, 256), jnp.float16, P("data", None, "model")),  # a dtype the kernel lacks
    ],
)
def test_a_block_the_dropout_kernel_does_not_take_selects_with_bytes(shape, dtype, spec):
    """On each device's block, the flags kernel's bytes in both passes (as on one device);
    the unsharded call's bits."""
    x = jax.random.normal(jax.random.key(1), shape).astype(dtype)
    ct = jax.random.normal(jax.random.key(2), shape).astype(dtype)
    want, want_ct = _dropout(x), _vjp(x, ct)
    mesh = _mesh("4x2" if "model" in spec else "8")
    xs, cts = (jax.device_put(a, NamedSharding(mesh, spec)) for a in (x, ct))
    with testing.tpu_kernels(), jax.set_mesh(mesh):
        assert _uses_bytes(_dropout, xs) and _uses_bytes(_vjp, xs, cts)
        got, got_ct = jax.jit(_dropout)(xs), jax.jit(_vjp)(xs, cts)
        assert _collectives(_vjp, xs, cts) == []
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_ct), np.asarray(want_ct))


@pytest.mark.parametrize(
    ("shape", "dims", "spec", "dtype"),
    [
        ((8, 16, 256), (1,), P("data", None, "model"), jnp.float32),  # shared along rows
        ((8, 16, 256), (0,), P("data"), jnp.bfloat16),  # along the split batch axis
        ((4, 8, 16, 256), (1, 2), P("data", "model"), jnp.float32),  # along a split axis
    ],
)
def test_a_broadcast_mask_draws_each_devices_block_of_it_as_bytes(shape, dims, spec, dtype):
    """``broadcast_dims``: each device draws its block of the mask, whole along the axes
    it broadcasts (where the array's block has a non-zero offset, the mask's is 0), as
    bytes in both passes; the unsharded call's bits, no collective."""
    x = jax.random.normal(jax.random.key(1), shape).astype(dtype)
    ct = jax.random.normal(jax.random.key(2), shape).astype(dtype)

    def f(x):
        return dropmask.dropout(x, RATE, KEY, broadcast_dims=dims)

    def vjp(x, ct):
        return jax.vjp(f, x)[1](ct)[0]

    want, want_ct = f(x), vjp(x, ct)
    mesh = _mesh("4x2")
    xs, cts = (jax.device_put(a, NamedSharding(mesh, spec)) for a in (x, ct))
    with testing.tpu_kernels(), jax.set_mesh(mesh):
        assert _uses_bytes(f, xs) and _uses_bytes(vjp, xs, cts)
        got, got_ct = jax.jit(f)(xs), jax.jit(vjp)(xs, cts)
        assert _collectives(f, xs) == [] and _collectives(vjp, xs, cts) == []
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_ct), np.asarray(want_ct))


def test_a_program_xla_partitions_itself_takes_xlas_path():
    """Automatic axes: the sharding is not known when traced, and Mosaic cannot be
    partitioned by XLA."""
    x = _x()
    want = _dropout(x)
    mesh = _mesh("4x2", AxisType.Auto)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None, "model")))
    with testing.tpu_kernels():
        assert not _uses_kernel(_dropout, xs)
        got = jax.jit(_dropout)(xs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("check_vma", [True, False])
def test_inside_a_users_shard_map_the_kernel_draws_its_block_of_the_global_mask(check_vma):
    x, ct = _x(1), _x(2)
    want, want_ct = _dropout(x), _vjp(x, ct)
    mesh = _mesh("8", AxisType.Auto)

    def drop(block):
        offset = (jax.lax.axis_index("data") * block.shape[0], 0, 0)
        return dropmask.dropout(block, RATE, KEY, global_shape=SHAPE, offset=offset)

    def shard(f, n):
        spec = (P("data"),) * n
        return jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec[0], check_vma=check_vma)

    f = shard(drop, 1)
    f_vjp = shard(lambda block, ct: jax.vjp(drop, block)[1](ct)[0], 2)
    xs, cts = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (x, ct))
    with testing.tpu_kernels():
        assert _uses_kernel(f, xs) and _uses_bytes(f_vjp, xs, cts)
        got, got_ct = jax.jit(f)(xs), jax.jit(f_vjp)(xs, cts)
        assert _collectives(f, xs) == _collectives(f_vjp, xs, cts) == []
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_ct), np.asarray(want_ct))


def test_differentiated_on_a_mesh_lowers_the_flags_kernel_on_each_devices_block(
    lowering_for_a_tpu,
):
    """Lowered for a TPU on this CPU: the forward and backward passes each draw the
    bytes of a device's block, [2, 197, 128] of [8, 197, 256] (197 rows: a partial
    block), with the block's offsets among the kernel's scalars; no dropout kernel."""
    mesh = _mesh("4x2")
    x = jnp.ones((8, 197, 256), jnp.bfloat16)
    x = jax.device_put(x, NamedSharding(mesh, P("data", None, "model")))

    def loss(x):
        return jnp.sum(_dropout(x).astype(jnp.float32))

    with testing.tpu_kernels(), jax.set_mesh(mesh):
        exported = jax.export.export(jax.jit(jax.value_and_grad(loss)), platforms=["tpu"])
        text = exported(x).mlir_module()
    calls = [line for line in text.splitlines() if "tpu_custom_call(" in line]
    assert len(calls) == 2
    assert all("(tensor<7xi32>) -> tensor<2x197x128xi8>" in call for call in calls)


def test_a_broadcast_mask_on_a_mesh_lowers_the_flags_kernel_on_its_block(lowering_for_a_tpu):
    """Lowered for a TPU on this CPU: a mask shared along the rows ([8, 1, 256] for [8,
    197, 256] on 4 x 2) draws a device's block of it, [2, 1, 128], in each pass."""
    mesh = _mesh("4x2")
    x = jnp.ones((8, 197, 256), jnp.bfloat16)
    x = jax.device_put(x, NamedSharding(mesh, P("data", None, "model")))

    def loss(x):
        return jnp.sum(dropmask.dropout(x, RATE, KEY, broadcast_dims=1).astype(jnp.float32))

    with testing.tpu_kernels(), jax.set_mesh(mesh):
        exported = jax.export.export(jax.jit(jax.value_and_grad(loss)), platforms=["tpu"])
        text = exported(x).mlir_module()
    calls = [line for line in text.splitlines() if "tpu_custom_call(" in line]
    assert len(calls) == 2
    assert all("(tensor<7xi32>) -> tensor<2x1x128xi8>" in call for call in calls)


def test_under_vmap_scan_and_remat_on_a_mesh():
    x = _x()
    keys = jax.random.split(KEY, 2)

    def layers(x):
        def body(h, key):
            return jnp.tanh(dropmask.dropout(h, RATE, key)), None

        return jax.lax.scan(jax.checkpoint(body), x, keys)[0]

    def over_keys(x):
        return jax.vmap(lambda key: dropmask.dropout(x, RATE, key))(keys)

    loss = lambda x: jnp.sum(layers(x) * x)  # noqa: E731
    want = (layers(x), jax.grad(loss)(x), over_keys(x))
    mesh = _mesh("4x2")
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None, "model")))
    with testing.tpu_kernels(), jax.set_mesh(mesh):
        assert _uses_kernel(layers, xs)
        got = (jax.jit(layers)(xs), jax.jit(jax.grad(loss))(xs), jax.jit(over_keys)(xs))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=0)


# Fast: each split once, a static rate with one and a run-time rate with the other.
@pytest.mark.parametrize(
    ("static", "spec"),
    covering(
        [(s, spec) for s in (True, False) for spec in (P("data"), P(None, None, "data"))],
        [(True, P("data")), (False, P(None, None, "data"))],
        unpack=True,
    ),
    ids=[f"{s}-spec{i}" for s in (True, False) for i in range(2)],
)
@pytest.mark.parametrize("dims", [(), pytest.param((0,), marks=pytest.mark.slow)])
def test_per_example_gradients_on_a_mesh(spec, static, dims):
    """``vmap`` of a gradient over a sharded batch: the bytes' batching rule draws the
    whole mask by XLA, at a run-time rate too, and a mask broadcast along the rows."""
    weights = (jnp.arange(np.prod(SHAPE[1:])) % 7 - 3).reshape(SHAPE[1:]).astype(jnp.float32)

    def per_example(x, rate):
        # The cotangent varies by example (exact: small integers times signs).
        grad = jax.grad(
            lambda row: jnp.sum(
                dropmask.dropout(row, rate, KEY, broadcast_dims=dims) * weights * jnp.sign(row)
            )
        )
        return jax.vmap(grad)(x)

    f = jax.jit(per_example, static_argnums=1 if static else ())
    x = _x()
    want = f(x, RATE)
    mesh = _mesh("8")
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    with testing.tpu_kernels(), jax.set_mesh(mesh):
        got = f(xs, RATE)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Dropout(RATE, deterministic=not training)(x)
        return nn.Dense(256)(x)


class _NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dropout = nnx.Dropout(RATE, rngs=rngs)
        self.dense = nnx.Linear(256, 256, rngs=rngs)

    def __call__(self, x):
        return self.dense(self.dropout(x))


def test_linen_and_nnx_models_under_swap_dropout_on_a_mesh():
    x = _x()
    model = _Block()
    variables = model.init(jax.random.key(0), x, training=False)

    def linen(x):
        with dl.swap_dropout():
            return model.apply(variables, x, training=True, rngs={"dropout": KEY})

    nnx_model = _NnxBlock(nnx.Rngs(params=0, dropout=3))
    dnnx.swap_dropout(nnx_model)
    graph, state = nnx.split(nnx_model)

    def with_nnx(state, x):
        return nnx.merge(graph, state)(x)

    def fresh():  # the stream's count as split, so that each call draws the same mask
        return jax.tree.map(lambda a: a, state)

    want = (linen(x), with_nnx(fresh(), x))
    mesh = _mesh("8")
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    with testing.tpu_kernels(), jax.set_mesh(mesh):
        assert _uses_kernel(linen, xs) and _uses_kernel(with_nnx, fresh(), xs)
        got = (jax.jit(linen)(xs), jax.jit(with_nnx)(fresh(), xs))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
