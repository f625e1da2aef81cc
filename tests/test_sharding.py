"""The fast mask is the same for every sharding, and needs no communication."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import dropmask
from dropmask import _fast_mask
from dropmask import linen as dl
from dropmask import nnx as dnnx

SHAPE = (64, 128)
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def _mesh(n: int) -> Mesh:
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return Mesh(np.array(jax.devices()[:n]), ("d",))


@functools.cache
def _reference(broadcast_dims=()):
    x = jnp.ones(SHAPE)
    return np.asarray(dropmask.dropout(x, 0.5, jax.random.key(0), broadcast_dims=broadcast_dims))


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("broadcast_dims", [(), (0,), (1,)])
def test_named_sharding_bit_identical_and_communication_free(n, axis, broadcast_dims):
    spec = PartitionSpec(*(("d" if i == axis else None) for i in range(2)))
    sharding = NamedSharding(_mesh(n), spec)
    x = jax.device_put(jnp.ones(SHAPE), sharding)
    f = jax.jit(
        lambda x, k: dropmask.dropout(x, 0.5, k, broadcast_dims=broadcast_dims),
        out_shardings=sharding,
    )
    key = jax.random.key(0)
    np.testing.assert_array_equal(np.asarray(f(x, key)), _reference(broadcast_dims))
    hlo = f.lower(x, key).compile().as_text()
    assert not any(op in hlo for op in COLLECTIVES), [op for op in COLLECTIVES if op in hlo]


@pytest.mark.parametrize("path", _fast_mask.PATHS)
@pytest.mark.parametrize("axis", [0, 1])
def test_every_mask_path_is_bit_identical_and_communication_free_when_sharded(path, axis):
    """CPU and CUDA take different paths by default; each must shard like the others."""
    spec = PartitionSpec(*(("d" if i == axis else None) for i in range(2)))
    sharding = NamedSharding(_mesh(8), spec)
    words = _fast_mask.key_words(jax.random.key(0))
    thr = _fast_mask.threshold(0.9)
    f = jax.jit(
        lambda w: _fast_mask.keep_from_words(w, SHAPE, thr, path=path), out_shardings=sharding
    )
    want = _fast_mask.keep_from_words(words, SHAPE, thr, path="per_element")
    np.testing.assert_array_equal(np.asarray(f(words)), np.asarray(want))
    hlo = f.lower(words).compile().as_text()
    assert not any(op in hlo for op in COLLECTIVES), [op for op in COLLECTIVES if op in hlo]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_shard_map_with_global_offsets(n):
    mesh = _mesh(n)
    rows = SHAPE[0] // n

    def local(x, key):
        offset = (jax.lax.axis_index("d") * rows, 0)
        return dropmask.dropout(x, 0.5, key, global_shape=SHAPE, offset=offset)

    f = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(PartitionSpec("d"), PartitionSpec()),
            out_specs=PartitionSpec("d"),
        )
    )
    np.testing.assert_array_equal(np.asarray(f(jnp.ones(SHAPE), jax.random.key(0))), _reference())


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.relu(nn.Dense(32)(x))
        x = dl.Dropout(0.3, deterministic=not training)(x)
        return nn.Dense(4)(x)


def test_data_parallel_step_matches_single_device():
    mesh = _mesh(8)
    x = jax.random.normal(jax.random.key(0), (64, 8))
    y = jax.random.randint(jax.random.key(1), (64,), 0, 4)
    model = MLP()
    params = model.init(jax.random.key(2), x, training=False)
    tx = optax.sgd(0.1)

    def step(params, opt_state, x, y, key):
        def loss_fn(p):
            logits = model.apply(p, x, training=True, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    key = jax.random.fold_in(jax.random.key(3), 0)
    single = jax.jit(step)(params, tx.init(params), x, y, key)
    data = NamedSharding(mesh, PartitionSpec("d"))
    sharded = jax.jit(step)(
        params, tx.init(params), jax.device_put(x, data), jax.device_put(y, data), key
    )
    np.testing.assert_allclose(float(sharded[2]), float(single[2]), rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
        sharded[0],
        single[0],
    )


@pytest.mark.parametrize("axis", [0, 1])
def test_each_device_generates_only_its_own_words(axis):
    """The packed words are computed inside a conditional; it must be partitioned like
    the data (each device draws its local words), not replicated on every device."""
    spec = PartitionSpec(*(("d" if i == axis else None) for i in range(2)))
    sharding = NamedSharding(_mesh(8), spec)
    x = jax.device_put(jnp.ones((256, 2048)), sharding)
    f = jax.jit(lambda x, k: dropmask.dropout(x, 0.1, k), out_shardings=sharding)
    hlo = f.lower(x, jax.random.key(0)).compile().as_text()
    local_words = "u32[32,64]" if axis == 0 else "u32[256,8]"
    conditionals = [line for line in hlo.splitlines() if " conditional(" in line]
    assert conditionals and all(local_words in line for line in conditionals), conditionals


# --- modules inside shard_map: each device draws its block of one global mask ---------


def _mesh2d() -> Mesh:
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


SPECS = [
    PartitionSpec("data"),
    PartitionSpec(None, "model"),
    PartitionSpec("data", "model"),
    PartitionSpec(("data", "model")),
    PartitionSpec(None, ("model", "data")),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("broadcast_dims", [(), (0,)])
def test_linen_dropout_in_shard_map_equals_unsharded(spec, broadcast_dims):
    mesh, x, key = _mesh2d(), jax.random.normal(jax.random.key(1), SHAPE), jax.random.key(3)
    layer = dl.Dropout(0.3, broadcast_dims=broadcast_dims, deterministic=False)
    want = layer.apply({}, x, rngs={"dropout": key})
    sharded = layer.clone(shard_spec=spec)
    f = jax.jit(
        jax.shard_map(
            lambda x, k: sharded.apply({}, x, rngs={"dropout": k}),
            mesh=mesh,
            in_specs=(spec, PartitionSpec()),
            out_specs=spec,
        )
    )
    np.testing.assert_array_equal(np.asarray(f(x, key)), np.asarray(want))
    if broadcast_dims:
        return
    # without shard_spec every device would draw the same local mask
    same = jax.jit(
        jax.shard_map(
            lambda x, k: layer.apply({}, x, rngs={"dropout": k}),
            mesh=mesh,
            in_specs=(spec, PartitionSpec()),
            out_specs=spec,
        )
    )
    assert not np.array_equal(np.asarray(same(x, key)), np.asarray(want))


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_nnx_dropout_in_shard_map_equals_unsharded(spec):
    mesh, x = _mesh2d(), jax.random.normal(jax.random.key(1), SHAPE)
    key = jax.random.key(5)
    want = dnnx.Dropout(0.3)(x, rngs=key)
    layer = dnnx.Dropout(0.3, shard_spec=spec)
    f = jax.jit(
        jax.shard_map(
            lambda x, k: layer(x, rngs=k),
            mesh=mesh,
            in_specs=(spec, PartitionSpec()),
            out_specs=spec,
        )
    )
    np.testing.assert_array_equal(np.asarray(f(x, key)), np.asarray(want))


def test_modules_take_call_time_global_shape_and_offset():
    mesh, x, key = _mesh(8), jax.random.normal(jax.random.key(1), SHAPE), jax.random.key(3)
    rows = SHAPE[0] // 8
    linen_layer = dl.Dropout(0.5, deterministic=False)
    nnx_layer = dnnx.Dropout(0.5)

    def local(x, k):
        offset = (jax.lax.axis_index("d") * rows, 0)
        a = linen_layer.apply({}, x, rng=k, global_shape=SHAPE, offset=offset)
        b = nnx_layer(x, rngs=k, global_shape=SHAPE, offset=offset)
        return a, b

    spec = PartitionSpec("d")
    f = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=(spec, spec))
    )
    a, b = f(x, key)
    want = np.asarray(dropmask.dropout(x, 0.5, key))
    np.testing.assert_array_equal(np.asarray(a), want)
    np.testing.assert_array_equal(np.asarray(b), want)


def test_shard_spec_longer_than_the_input_is_rejected():
    mesh = _mesh(8)
    layer = dl.Dropout(0.5, deterministic=False, shard_spec=PartitionSpec(None, None, "d"))
    f = jax.shard_map(
        lambda x, k: layer.apply({}, x, rng=k),
        mesh=mesh,
        in_specs=(PartitionSpec("d"), PartitionSpec()),
        out_specs=PartitionSpec("d"),
    )
    with pytest.raises(
        dropmask.DropmaskValueError, match="shard_spec .* has 3 entries but the input has 2"
    ):
        jax.jit(f)(jnp.ones(SHAPE), jax.random.key(0))
