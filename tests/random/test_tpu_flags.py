"""The kept mask's flags drawn as bytes by the TPU kernel (``_random/_tpu_flags.py``), run
in Pallas's TPU interpreter on a CPU.

Where the kernels run, dense attention keeps its weights' mask as ``int8`` flags that
the dropout kernel draws once; the flags, and attention's outputs and gradients, must
equal the default path's bit for bit.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from tests.covering import covering

import dropmask
from dropmask import testing
from dropmask._random import _draw, _tpu_flags, threshold

KEY = jax.random.key(9)


def _kept(shape, p, key=KEY):
    # The array traced beside the mask: unsharded, so the bytes kernel may draw it.
    beside = jnp.zeros(())
    return _draw.draw(key, shape, p, "fast", _draw.kept, beside, caller="test")


_FLAG_SHAPES = [
    (2, 3, 197, 197),  # ViT's 197 keys: the kernel's columns padded to 256
    (2, 1, 96, 96),  # one mask for every head
    (3, 77, 200),  # rows and columns both partial
    (1, 40, 1100),  # column blocks of 1152
    (5, 80),  # rank 2
]


# Fast: each shape once, the two rates in turn.
@pytest.mark.parametrize(
    ("shape", "p"),
    covering(
        [(shape, p) for shape in _FLAG_SHAPES for p in (0.9, 0.3)],
        [(shape, (0.9, 0.3)[i % 2]) for i, shape in enumerate(_FLAG_SHAPES)],
        unpack=True,
    ),
)
def test_kept_flags_are_the_keep_mask(shape, p):
    want = dropmask.keep_mask(KEY, shape, 1.0 - p)
    with testing.tpu_kernels():
        kept = jax.jit(lambda p: _kept(shape, p))(jnp.float32(p))
        static = _kept(shape, p)
    assert kept.form == static.form == "bytes"
    assert kept.words.dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(kept.flags()), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(static.flags()), np.asarray(want))


def test_a_kernel_that_fails_to_lower_falls_back_to_the_same_flags(monkeypatch):
    def broken(*args, **kwargs):
        raise NotImplementedError("no such Mosaic op")

    want = dropmask.keep_mask(KEY, (3, 197, 197), 0.1)
    monkeypatch.setattr(_tpu_flags, "_pallas", broken)
    with testing.tpu_kernels():
        got = jax.jit(lambda: _kept((3, 197, 197), 0.9).flags())()
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_batched_keys_draw_each_keys_flags():
    keys = jax.random.split(KEY, 3)
    draw = lambda k: _kept((4, 197), 0.9, k).flags()  # noqa: E731
    want = jnp.stack([dropmask.keep_mask(k, (4, 197), 0.1) for k in keys])
    with testing.tpu_kernels():
        got = jax.vmap(draw)(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("shape", [(3, 0), (5, 1), (2, 7, 1), (), (4, 64)])
def test_shapes_the_flags_kernel_does_not_take(shape):
    assert _tpu_flags.flags_kernel_for(shape, threshold(0.9), interpret=True) is None


def _attention(q, k, v, broadcast):
    return dropmask.dot_product_attention(
        q,
        k,
        v,
        dropout_rate=0.1,
        key=KEY,
        deterministic=False,
        broadcast_dropout=broadcast,
        algorithm="dense",
    )


@pytest.mark.parametrize("broadcast", [True, False])
def test_dense_attention_outputs_and_gradients_equal_the_default_path(broadcast):
    q, k, v, g = (
        jax.random.normal(kk, (2, 67, 3, 16), jnp.float32) for kk in jax.random.split(KEY, 4)
    )

    def loss(q, k, v):
        return jnp.sum(_attention(q, k, v, broadcast) * g)

    run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    want = run(q, k, v)
    with testing.tpu_kernels():
        jaxpr = str(jax.make_jaxpr(run)(q, k, v))
        got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert jaxpr.count("dropmask_tpu_keep_flags") == 1  # drawn once, kept for the backward
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("check_vma", [True, False])
def test_dense_attention_inside_shard_map_keeps_each_devices_bytes(check_vma):
    """Manual axes: each device draws its batch block's mask as bytes (a mask per head,
    its own shape's, as without the kernels) and keeps them for the backward pass."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    spec = jax.sharding.PartitionSpec("data")
    q, k, v, g = (
        jax.device_put(
            jax.random.normal(kk, (8, 67, 3, 16), jnp.float32), NamedSharding(mesh, spec)
        )
        for kk in jax.random.split(KEY, 4)
    )

    def local(q, k, v, g):
        loss = lambda q, k, v: jnp.sum(_attention(q, k, v, False) * g)  # noqa: E731
        value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
        return value[None], grads  # each device's loss

    f = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec, check_vma=check_vma)
    with jax.set_mesh(mesh):
        with testing.tpu_kernels(False):
            want = jax.jit(f)(q, k, v, g)
        with testing.tpu_kernels():
            assert "dropmask_tpu_keep_flags" in str(jax.make_jaxpr(f)(q, k, v, g))
            got = jax.jit(f)(q, k, v, g)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _explicit_mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=explicit)


_BATCH = jax.sharding.PartitionSpec("data")
_BATCH_AND_HEADS = jax.sharding.PartitionSpec("data", None, "model")
_HEADS = jax.sharding.PartitionSpec(None, None, ("data", "model"))


# Fast: each split once and both masks, one mask for every head (a broadcast axis kept
# whole) where the heads are split over every device.
@pytest.mark.parametrize(
    ("partition", "broadcast"),
    covering(
        [(p, b) for p in (_BATCH, _BATCH_AND_HEADS, _HEADS) for b in (True, False)],
        [(_BATCH, True), (_BATCH_AND_HEADS, False), (_HEADS, True)],
        unpack=True,
    ),
)
def test_dense_attention_on_a_mesh_keeps_each_devices_block_of_the_bytes(partition, broadcast):
    """A mesh of explicit axes: each device draws its block of the weights' mask (sharded
    as the weights, a broadcast axis whole) as bytes, once; the outputs and gradients
    equal XLA's draw on the same mesh, which moves what the kernels' program moves."""
    mesh = _explicit_mesh()
    args = [
        jax.device_put(jax.random.normal(kk, (8, 197, 8, 16)), NamedSharding(mesh, partition))
        for kk in jax.random.split(KEY, 4)
    ]

    def loss(q, k, v, g):
        return jnp.sum(_attention(q, k, v, broadcast) * g)

    run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    def collectives():
        text = run.lower(*args).compile().as_text()
        return set(re.findall(r"\b(all-gather|all-to-all|collective-permute|reduce-scatter)", text))

    with jax.set_mesh(mesh):
        with testing.tpu_kernels(False):
            want, moved = run(*args), collectives()
        with testing.tpu_kernels():
            assert str(jax.make_jaxpr(run)(*args)).count("dropmask_tpu_keep_flags") == 1
            got = run(*args)
            assert collectives() == moved
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_dense_attention_on_a_mesh_lowers_the_flags_kernel_on_each_devices_block(
    lowering_for_a_tpu,
):
    """Lowered for a TPU on this CPU: one Mosaic call, drawing a device's block of a
    mask per head ([2, 2, 197, 256] of [8, 4, 197, 197] over 4 x 2 devices, its columns
    padded) from the key words and the block's 4 offsets."""
    mesh = _explicit_mesh()
    partition = jax.sharding.PartitionSpec("data", None, "model")
    q = jax.device_put(jnp.ones((8, 197, 4, 64), jnp.bfloat16), NamedSharding(mesh, partition))

    def loss(q, k, v):
        return jnp.sum(_attention(q, k, v, False).astype(jnp.float32))

    with testing.tpu_kernels(), jax.set_mesh(mesh):
        exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["tpu"])
        text = exported(q, q, q).mlir_module()
    calls = [line for line in text.splitlines() if "tpu_custom_call(" in line]
    assert len(calls) == 1
    assert "(tensor<8xi32>) -> tensor<4x197x256xi8>" in calls[0]


def test_dense_attention_lowers_the_flags_kernel_for_a_tpu(lowering_for_a_tpu):
    """Lowered for a TPU on this CPU: one Mosaic call, the flags' (the forward draws them,
    the backward reads them), not XLA's path its lowering falls back to."""
    q = jnp.ones((4, 197, 2, 64), jnp.bfloat16)

    def loss(q, k, v):
        return jnp.sum(_attention(q, k, v, False).astype(jnp.float32))

    with testing.tpu_kernels():
        exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["tpu"])
        text = exported(q, q, q).mlir_module()
    assert text.count("tpu_custom_call(") == 1


def _drawn_by_flags(f, *args):
    jaxpr = str(jax.make_jaxpr(f)(*args))
    return "dropmask_tpu_bytes_linear" in jaxpr and "dropmask_tpu_masked_linear" not in jaxpr


_NOT_TAKEN = [
    ((3, 100), "float32", ()),  # a last axis that is not whole registers
    ((2, 197, 96), "bfloat16", ()),
    ((4, 16, 256), "float32", (1,)),  # broadcast_dims: the mask drawn at (4, 1, 256)
    ((64, 128), "float16", ()),  # a dtype the dropout kernel does not take
]


# Fast: a last axis that is not whole registers (96 lanes, rank 3), broadcast_dims and a
# dtype the dropout kernel does not take; the slow suite adds the rank-2 short axis.
@pytest.mark.parametrize(
    ("shape", "dtype", "dims"), covering(_NOT_TAKEN, _NOT_TAKEN[1:], unpack=True)
)
def test_dropout_the_kernel_does_not_take_selects_with_the_flags_kernels_bytes(shape, dtype, dims):
    x = jax.random.normal(KEY, shape, jnp.float32).astype(dtype)

    def f(x):
        return dropmask.dropout(x, 0.1, KEY, broadcast_dims=dims)

    def loss(x):
        return jnp.sum(f(x).astype(jnp.float32) * jnp.cos(x.astype(jnp.float32)))

    want, want_grad = f(x), jax.grad(loss)(x)
    with testing.tpu_kernels():
        assert _drawn_by_flags(f, x)
        got, got_grad = f(x), jax.grad(loss)(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_grad), np.asarray(want_grad))


def test_dropout_by_the_flags_kernel_lowers_for_a_tpu(lowering_for_a_tpu):
    """The forward pass draws the flags, the backward pass draws them again (the
    dropout keeps no residual but the key): two Mosaic calls."""
    x = jnp.ones((64, 200), jnp.bfloat16)

    def loss(x):
        return jnp.sum(dropmask.dropout(x, 0.1, KEY).astype(jnp.float32))

    with testing.tpu_kernels():
        exported = jax.export.export(jax.jit(jax.value_and_grad(loss)), platforms=["tpu"])
        text = exported(x).mlir_module()
    assert text.count("tpu_custom_call(") == 2


@pytest.mark.parametrize("check_vma", [True, False])
def test_inside_shard_map_the_bytes_kernel_draws_each_devices_own_mask(check_vma):
    """Manual axes: each device draws its block's mask (the user's call, no global
    place) as bytes typed as varying where its scalars are, forward and backward."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    spec = jax.sharding.PartitionSpec("data")
    x = jax.device_put(jax.random.normal(KEY, (16, 100), jnp.float32), NamedSharding(mesh, spec))

    def local(block):
        drop = lambda b: dropmask.dropout(b, 0.1, KEY)  # noqa: E731
        return drop(block), jax.vjp(drop, block)[1](jnp.cos(block))[0]

    f = jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=check_vma)
    with jax.set_mesh(mesh):
        with testing.tpu_kernels(False):
            want = jax.jit(f)(x)
        with testing.tpu_kernels():
            assert "dropmask_tpu_bytes_linear" in str(jax.make_jaxpr(f)(x))
            got = jax.jit(f)(x)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_program_xla_partitions_itself_keeps_xlas_draw_and_adds_no_collective():
    """Automatic axes: the bytes kernel's output has no sharding rule (XLA would gather
    it), so dense attention draws its mask by XLA there, as without the kernels."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    q = jax.device_put(jax.random.normal(KEY, (8, 80, 2, 16), jnp.float32), sharding)
    grad = jax.grad(lambda q: jnp.sum(_attention(q, q, q, False)))

    def collectives(f, x):
        text = jax.jit(f).lower(x).compile().as_text()
        return sorted(set(re.findall(r"\b(all-gather|all-to-all|collective-permute)", text)))

    with testing.tpu_kernels(False):
        want, want_collectives = grad(q), collectives(grad, q)
    with testing.tpu_kernels():
        assert "dropmask_tpu_keep_flags" not in str(jax.make_jaxpr(grad)(q))
        got, got_collectives = grad(q), collectives(grad, q)
    assert got_collectives == want_collectives == []
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
