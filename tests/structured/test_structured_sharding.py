"""The structured family on 8 fake devices: sharding the batch changes no mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tests.covering import covering

import dropmask

KEY = jax.random.key(0)


def _mesh() -> Mesh:
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return Mesh(np.array(jax.devices()[:8]), ("d",))


CASES = {
    "drop_block": (lambda x, k: dropmask.drop_block(x, 0.2, k, block_size=3), (16, 8, 8, 8)),
    "drop_block_per_channel": (
        lambda x, k: dropmask.drop_block(x, 0.2, k, block_size=(3, 2), per_channel=True),
        (16, 8, 8, 8),
    ),
    "drop_head": (lambda x, k: dropmask.drop_head(x, 0.5, k), (16, 4, 8, 8)),
    "drop_tokens": (lambda x, k: dropmask.drop_tokens(x, 0.5, k).tokens, (16, 12, 8)),
}


# Fast: each function once, the batch and the last axis split in turn (drop_block's
# channels split per channel).
@pytest.mark.parametrize(
    ("axis", "name"),
    covering(
        [(axis, name) for axis in (0, -1) for name in sorted(CASES)],
        [((0, -1)[i % 2], name) for i, name in enumerate(sorted(CASES))],
        unpack=True,
    ),
    ids=[f"{axis}-{name}" for axis in (0, -1) for name in sorted(CASES)],
)
def test_named_sharding_gives_the_unsharded_result(name, axis):
    f, shape = CASES[name]
    x = jax.random.normal(jax.random.key(1), shape)
    want = f(x, KEY)
    spec = [None] * len(shape)
    spec[axis] = "d"
    sharded = jax.device_put(x, NamedSharding(_mesh(), PartitionSpec(*spec)))
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(sharded, KEY)), np.asarray(want))


# Fast: the batch split with one mask for the channels, the channels split with a mask
# per channel.
@pytest.mark.parametrize(
    ("spec", "per_channel"),
    covering(
        [
            (s, c)
            for s in (PartitionSpec("d"), PartitionSpec(None, None, None, "d"))
            for c in (False, True)
        ],
        [(PartitionSpec("d"), False), (PartitionSpec(None, None, None, "d"), True)],
        unpack=True,
    ),
    ids=[f"spec{i}-{c}" for i in range(2) for c in (False, True)],
)
def test_drop_block_in_shard_map_equals_unsharded(per_channel, spec):
    shape = (16, 8, 8, 8)
    x = jax.random.normal(jax.random.key(1), shape)
    want = dropmask.drop_block(x, 0.2, KEY, block_size=3, per_channel=per_channel)
    mesh = _mesh()

    def local(x, key):
        axis = 0 if spec[0] == "d" else 3
        offset = [0, 0, 0, 0]
        offset[axis] = jax.lax.axis_index("d") * x.shape[axis]
        return dropmask.drop_block(
            x, 0.2, key, block_size=3, per_channel=per_channel, global_shape=shape, offset=offset
        )

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec))
    np.testing.assert_array_equal(np.asarray(f(x, KEY)), np.asarray(want))


def test_layer_drop_decision_is_the_same_on_every_device():
    x = jax.device_put(jnp.ones((16, 4)), NamedSharding(_mesh(), PartitionSpec("d")))
    for k in jax.random.split(KEY, 6):
        want = dropmask.layer_drop(lambda h: h * 2.0, jnp.ones((16, 4)), 0.5, k)
        got = jax.jit(lambda x, k: dropmask.layer_drop(lambda h: h * 2.0, x, 0.5, k))(x, k)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
