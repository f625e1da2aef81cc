"""Mesh, placement and multi-process set-up helpers (8 fake CPU devices)."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from dropmask import DropmaskError
from dropmask.training import initialize_distributed, make_mesh, replicate, shard_batch


def test_make_mesh_takes_the_first_n_local_devices():
    assert make_mesh().devices.size == jax.local_device_count() == 8
    mesh = make_mesh(4)
    assert mesh.axis_names == ("data",)
    assert list(mesh.devices) == jax.local_devices()[:4]
    for bad in (0, 9):
        with pytest.raises(DropmaskError, match=r"devices must be an int in \[1, 8\]"):
            make_mesh(bad)


def test_shard_batch_splits_axis_0_and_keeps_values():
    mesh = make_mesh(4)
    batch = {"x": np.arange(24.0).reshape(8, 3), "y": np.arange(8)}
    sharded = shard_batch(batch, mesh)
    for name, value in batch.items():
        assert sharded[name].sharding.spec == PartitionSpec("data")
        np.testing.assert_array_equal(np.asarray(sharded[name]), value)
        assert {s.data.shape[0] for s in sharded[name].addressable_shards} == {2}
    with pytest.raises(DropmaskError, match="6 examples, which 4 devices cannot split"):
        shard_batch({"x": np.zeros((6, 2))}, mesh)


def test_replicate_keeps_typed_keys_and_values():
    mesh = make_mesh(8)
    tree = {"key": jax.random.key(3, impl="rbg"), "w": np.arange(5.0)}
    placed = replicate(tree, mesh)
    assert jax.random.key_impl(placed["key"]) == jax.random.key_impl(tree["key"])
    np.testing.assert_array_equal(
        jax.random.key_data(placed["key"]), jax.random.key_data(tree["key"])
    )
    assert placed["w"].sharding.is_fully_replicated and len(placed["w"].sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(placed["w"]), tree["w"])


def test_initialize_distributed_without_a_coordinator_does_nothing(monkeypatch):
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    assert initialize_distributed() is False


@pytest.mark.parametrize(
    ("env", "kwargs", "match"),
    [
        ({"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1"}, {}, "needs the process count"),
        (
            {"JAX_NUM_PROCESSES": "two"},
            {"coordinator_address": "127.0.0.1:1"},
            "must be an integer",
        ),
        (
            {},
            {"coordinator_address": "127.0.0.1:1", "num_processes": 2, "process_id": 5},
            r"\[0, num_processes\)",
        ),
    ],
)
def test_initialize_distributed_checks_before_joining(monkeypatch, env, kwargs, match):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DropmaskError, match=match):
        initialize_distributed(**kwargs)
