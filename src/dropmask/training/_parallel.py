"""Data parallelism with JAX's own SPMD: one ``Mesh``, batches sharded, state replicated.

The batch axis is split over a 1-D mesh axis ``'data'`` and everything in the train
state is replicated; ``jax.jit`` then partitions the unchanged ``train_step`` and
inserts the gradient all-reduce. dropmask's masks depend only on the key and each
element's global position, so every device draws its own part of the same global mask
and a sharded step computes what one device would, up to the order of the reductions.

Across hosts the same code runs in every process after :func:`initialize_distributed`:
the mesh spans all processes' devices and each process feeds its slice of the batch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._errors import DropmaskValueError, user_error
from ._serialization import keys_from_data, keys_to_data

__all__ = [
    "check_batch_splits",
    "initialize_distributed",
    "make_mesh",
    "replicate",
    "shard_batch",
]

DATA_AXIS = "data"

# Read when the matching flag is not given. The first is also the variable that
# jax.distributed.initialize itself reads; the two counts are read here, so that a run
# never depends on which cluster JAX manages to detect.
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Joins a multi-process run with ``jax.distributed.initialize``, if one is configured.

    Each argument falls back to its environment variable (``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``). With no coordinator address from
    either, nothing happens and the run is single-process. On CPU the cross-process
    collectives use gloo. Call it before anything touches a device.

    Args:
      coordinator_address: ``host:port`` of process 0's coordinator service.
      num_processes: how many processes take part.
      process_id: this process's index in ``[0, num_processes)``.

    Returns:
      True when a distributed run was initialised.

    Raises:
      DropmaskValueError: an address that is not ``HOST:PORT``, or given without
        both counts, or a count that is not an integer in range.

    Example:
      >>> initialize_distributed()  # no coordinator address, here or in the environment
      False
      >>> try:
      ...     initialize_distributed("10.0.0.1", num_processes=2, process_id=0)
      ... except DropmaskValueError as err:
      ...     print(str(err).split(", got")[0])
      initialize_distributed: coordinator_address must be HOST:PORT of process 0
    """
    address = coordinator_address or os.environ.get(ENV_COORDINATOR)
    if not address:
        return False
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 2**16:
        raise user_error(
            DropmaskValueError,
            f"coordinator_address must be HOST:PORT of process 0, got {address!r}",
            "Pass e.g. --coordinator-address=10.0.0.1:1234.",
            caller="initialize_distributed",
        )
    count = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    index = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if count is None or index is None:
        raise user_error(
            DropmaskValueError,
            f"a multi-process run at {address} needs the process count and this process's id, "
            f"got num_processes={count}, process_id={index}",
            f"Pass --num-processes and --process-id (or set {ENV_NUM_PROCESSES} and "
            f"{ENV_PROCESS_ID}).",
            caller=None,
        )
    if count < 1 or not 0 <= index < count:
        raise user_error(
            DropmaskValueError,
            f"process_id must be in [0, num_processes), got process_id={index} with "
            f"num_processes={count}",
            caller=None,
        )
    # Only CPU collectives read this; GPU and TPU runs keep their own transports.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index)
    return True


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise user_error(
            DropmaskValueError,
            f"environment variable {name} must be an integer, got {value!r}",
            caller=None,
        ) from None


def make_mesh(devices_per_process: int | None = None) -> Mesh:
    """A 1-D ``'data'`` mesh over ``devices_per_process`` local devices of every process.

    Args:
      devices_per_process: how many of each process's local devices to use; all of
        them when ``None``.

    Returns:
      A ``Mesh`` of ``devices_per_process * jax.process_count()`` devices.

    Raises:
      DropmaskValueError: more devices asked for than a process has, or fewer than 1.

    Example:
      >>> mesh = make_mesh(1)
      >>> mesh.axis_names, mesh.devices.size == jax.process_count()
      (('data',), True)
    """
    local = jax.local_device_count()
    n = local if devices_per_process is None else devices_per_process
    if not isinstance(n, int) or not 1 <= n <= local:
        raise user_error(
            DropmaskValueError,
            f"devices must be an int in [1, {local}] (the local devices of this process), got "
            f"{devices_per_process!r}",
            "On CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N gives N devices.",
            caller=None,
        )
    by_process: dict[int, list[Any]] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    chosen = [d for p in sorted(by_process) for d in by_process[p][:n]]
    return Mesh(np.array(chosen), (DATA_AXIS,))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Places every leaf of ``tree`` (keys included) whole on every device of ``mesh``.

    Every process must pass the same values (e.g. a state built from the same seed).

    Example:
      >>> import jax.numpy as jnp
      >>> placed = replicate({"w": jnp.ones(3), "key": jax.random.key(0)}, make_mesh())
      >>> placed["w"].sharding.is_fully_replicated, placed["key"].dtype
      (True, key<fry>)
    """
    sharding = NamedSharding(mesh, PartitionSpec())
    data, impls = keys_to_data(tree)
    placed = jax.tree.map(
        lambda leaf: jax.make_array_from_process_local_data(sharding, np.asarray(leaf)), data
    )
    return keys_from_data(placed, impls)


def check_batch_splits(batch: Mapping[str, Any], mesh: Mesh) -> None:
    """Raises :class:`DropmaskValueError` unless every entry of ``batch`` splits evenly
    over the mesh's devices along axis 0."""
    size = mesh.devices.size
    for name, value in batch.items():
        if np.shape(value)[0] % size:
            raise user_error(
                DropmaskValueError,
                f"batch entry {name!r} has {np.shape(value)[0]} examples, which {size} devices "
                "cannot split evenly",
                f"Use a batch_size that is a multiple of {size}.",
                caller=None,
            )


def shard_batch(batch: Mapping[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """Splits a global batch along axis 0 over the mesh; each process sends its slice.

    Every process passes the same global batch (a pure function of seed and step);
    only this process's contiguous slice is copied to its devices.

    Args:
      batch: ``{name: array[global_batch, ...]}``.
      mesh: a mesh from :func:`make_mesh`.

    Returns:
      ``{name: jax.Array}`` sharded as ``PartitionSpec('data')``.

    Raises:
      DropmaskValueError: the batch size is not a multiple of the mesh size.

    Example:
      >>> mesh = make_mesh()
      >>> x = shard_batch({"x": np.zeros((2 * mesh.devices.size, 3))}, mesh)["x"]
      >>> x.sharding.spec == PartitionSpec("data"), x.addressable_shards[0].data.shape
      (True, (2, 3))
    """
    check_batch_splits(batch, mesh)
    sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    procs = jax.process_count()
    out = {}
    for name, value in batch.items():
        value = np.asarray(value)
        per = value.shape[0] // procs
        local = value[jax.process_index() * per : (jax.process_index() + 1) * per]
        out[name] = jax.make_array_from_process_local_data(sharding, local, value.shape)
    return out
