"""The TPU attention kernels on many devices: 8 CPU devices, kernels in Pallas's TPU interpreter.

Under a mesh of explicit axes a call split over batch, heads or both runs the forward,
``dk``/``dv`` and ``dq`` kernels on each device's block: outputs and gradients equal the
unsharded call's bit for bit, with one mask for every head and with a mask per head,
and the compiled program moves nothing between devices. A split the kernels cannot
take (the query or key axis) and a program XLA partitions itself take the blockwise
path, with the same mask.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import dropmask
from dropmask import testing

KEY = jax.random.key(3)
B, L, H, HK, D = 8, 256, 4, 2, 64
COLLECTIVES = re.compile(r"\b(all-gather|all-to-all|all-reduce|collective-permute|reduce-scatter)")
KERNELS = ("dropmask_flash_fwd", "dropmask_flash_dkdv")


def _mesh(kind: str, axis_type=AxisType.Explicit):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    if kind == "8":
        return jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)


def _qkv_ct():
    ks = jax.random.split(jax.random.key(1), 4)
    return (
        jax.random.normal(ks[0], (B, L, H, D)),
        jax.random.normal(ks[1], (B, L, HK, D)),
        jax.random.normal(ks[2], (B, L, HK, D)),
        jax.random.normal(ks[3], (B, L, H, D)),
    )


def _attention(per_head: bool):
    def f(q, k, v):
        return dropmask.dot_product_attention(
            q,
            k,
            v,
            dropout_rate=0.2,
            dropout_rng=KEY,
            broadcast_dropout=not per_head,
            is_causal=True,
            algorithm="pallas",
            block_q=128,
            block_k=128,
        )

    return f


def _kernels_in(f, *args) -> bool:
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(f(*a))))(*args))
    return all(name in jaxpr for name in KERNELS)


def _collectives(f, *args) -> list[str]:
    return sorted(set(COLLECTIVES.findall(jax.jit(f).lower(*args).compile().as_text())))


SLOW = pytest.mark.slow  # make test checks both splits at once; test-slow each alone
SPLITS = [
    pytest.param("4x2", P("data", None, "model"), True, id="both, a mask per head"),
    pytest.param("8", P("data"), False, id="data parallel", marks=SLOW),
    pytest.param("4x2", P(None, None, "model"), True, id="tensor parallel", marks=SLOW),
    pytest.param("4x2", P("data", None, "model"), False, id="both, one mask", marks=SLOW),
]


def _sharded_against_unsharded(f, mesh, spec) -> None:
    """``f``'s values and gradients with the inputs sharded as ``spec`` over ``mesh`` equal
    the unsharded call's bit for bit, by the kernels, the output sharded as ``q``, and the
    compiled forward and backward programs move nothing between devices."""
    q, k, v, ct = _qkv_ct()
    vjp = lambda q, k, v, ct: jax.vjp(f, q, k, v)[1](ct)  # noqa: E731
    put = lambda a: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    with testing.tpu_kernels():
        want, want_grads = jax.jit(f)(q, k, v), jax.jit(vjp)(q, k, v, ct)
        with jax.set_mesh(mesh):
            args = [put(a) for a in (q, k, v)]
            assert _kernels_in(f, *args)
            got, grads = jax.jit(f)(*args), jax.jit(vjp)(*args, put(ct))
            assert _collectives(f, *args) == []
            assert _collectives(vjp, *args, put(ct)) == []
    assert got.sharding.is_equivalent_to(args[0].sharding, got.ndim)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for g, w in zip(grads, want_grads, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize(("mesh", "spec", "per_head"), SPLITS)
def test_each_split_gives_the_unsharded_values_and_gradients_with_no_collective(
    mesh, spec, per_head
):
    _sharded_against_unsharded(_attention(per_head), _mesh(mesh), spec)


def test_a_split_length_is_gathered_for_the_kernels_and_the_output_split_back():
    """The query and key axes split over ``"model"``: the kernels run on whole rows, and
    the output and gradients come back split as the inputs (a cotangent split so is
    the output's type)."""
    q, k, v, ct = _qkv_ct()
    f = _attention(per_head=True)
    vjp = lambda q, k, v, ct: jax.vjp(f, q, k, v)[1](ct)  # noqa: E731
    mesh = _mesh("4x2")
    spec = P("data", "model")
    put = lambda a: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    with testing.tpu_kernels():
        want, want_grads = jax.jit(f)(q, k, v), jax.jit(vjp)(q, k, v, ct)
        with jax.set_mesh(mesh):
            args = [put(a) for a in (q, k, v)]
            assert _kernels_in(f, *args)
            got, grads = jax.jit(f)(*args), jax.jit(vjp)(*args, put(ct))
    for out, w in ((got, want), *zip(grads, want_grads, strict=True)):
        assert out.sharding.is_equivalent_to(args[0].sharding, out.ndim)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(w))


def test_a_program_xla_partitions_itself_takes_the_blockwise_path_with_the_same_mask():
    """Automatic axes: the sharding is not known when traced, and XLA cannot partition
    a Mosaic kernel."""
    q, k, v, _ = _qkv_ct()
    mesh = _mesh("8", AxisType.Auto)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("data")))  # noqa: E731
    f = _attention(per_head=True)
    blockwise = lambda q, k, v: dropmask.dot_product_attention(  # noqa: E731
        q,
        k,
        v,
        dropout_rate=0.2,
        dropout_rng=KEY,
        broadcast_dropout=False,
        is_causal=True,
        algorithm="blockwise",
        block_q=128,
        block_k=128,
    )
    want = jax.jit(blockwise)(q, k, v)
    with testing.tpu_kernels():
        args = [put(a) for a in (q, k, v)]
        assert not _kernels_in(f, *args)
        got = jax.jit(f)(*args)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_inside_a_users_shard_map_each_block_is_a_call_of_its_own():
    """As on every path: inside shard_map a block's mask is that of a call on the block."""
    q, k, v, _ = _qkv_ct()
    f = _attention(per_head=False)
    mesh = _mesh("8", AxisType.Auto)
    mapped = jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False)
    with testing.tpu_kernels():
        want = jnp.concatenate([jax.jit(f)(*(a[i : i + 1] for a in (q, k, v))) for i in range(B)])
        args = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (q, k, v)]
        assert _kernels_in(mapped, *args)
        got = jax.jit(mapped)(*args)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_key_lengths_and_segments_split_with_the_batch():
    """Side inputs of a batch row (valid keys, segment ids) reach that row's device."""
    lengths = jnp.array([256, 200, 129, 1, 256, 77, 130, 255])
    starts = jnp.arange(B)[:, None] * 20
    segments = (jnp.arange(L)[None, :] >= starts).astype(jnp.int32) + 1  # two per row

    def f(q, k, v):
        return dropmask.dot_product_attention(
            q, k, v, dropout_rate=0.2, dropout_rng=KEY, broadcast_dropout=False,
            kv_lengths=lengths, q_segment_ids=segments, kv_segment_ids=segments,
            algorithm="pallas", block_q=128, block_k=128,
        )  # fmt: skip

    _sharded_against_unsharded(f, _mesh("4x2"), P("data", None, "model"))
