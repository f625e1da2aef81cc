"""Where a local block sits in a global array: the sharding facts a mask draw needs.

Inside ``shard_map`` each device holds a block of the global array; the fast
generator draws each element from its global position, so it needs the block's
place. ``local_block`` checks ``global_shape`` / ``offset`` given by the caller;
``block_from_spec`` derives them from the input's ``PartitionSpec``.

Under a mesh of explicit axes an array's type carries its sharding instead, and a
mask is drawn whole (its values do not depend on the sharding): ``sharded_as`` gives it
the sharding of the array it is applied to, which ``lax.select`` needs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._checks import concrete_value
from .._errors import DropmaskTypeError, DropmaskValueError, user_error

__all__ = [
    "Block",
    "block_from_spec",
    "explicit_split",
    "explicitly_sharded_axes",
    "local_block",
    "local_shape",
    "resharded_to",
    "sharded_as",
    "spec_entries",
]


@dataclasses.dataclass(frozen=True)
class Block:
    """Where a local array sits in a global one: for masks drawn inside ``shard_map``.

    Attributes:
      global_shape: the shape of the whole (unsharded) mask.
      offset: the global index of the local block's first element, one entry per
        axis (ints or traced scalars such as ``lax.axis_index('x') * local_size``).
    """

    global_shape: tuple[int, ...]
    offset: tuple[Any, ...]


def local_block(
    shape: tuple[int, ...],
    global_shape: Sequence[int] | None,
    offset: Sequence[Any] | None,
    axes: Sequence[int] = (),
    *,
    caller: str = "dropout",
) -> Block | None:
    """Validates ``global_shape`` / ``offset`` against a local ``shape``; None if unset.

    ``axes`` are the (normalized) broadcast axes: the mask has one entry along each, so
    its global extent there is 1 and its offset 0.
    """
    if global_shape is None and offset is None:
        return None
    if global_shape is None or offset is None:
        raise user_error(
            DropmaskValueError,
            "global_shape and offset go together (the local block's place in the global array), "
            f"got global_shape={global_shape!r}, offset={offset!r}",
            "Pass both.",
            caller=caller,
        )
    dims = tuple(global_shape)
    if any(isinstance(d, bool) or not isinstance(d, int | np.integer) for d in dims):
        raise user_error(
            DropmaskTypeError,
            f"global_shape must be a tuple of Python ints, got {global_shape!r}",
            "Pass the unsharded shape, e.g. global_shape=(local[0] * n_devices, local[1]).",
            caller=caller,
        )
    dims = tuple(int(d) for d in dims)
    offset = tuple(offset)
    if len(dims) != len(shape) or len(offset) != len(shape):
        raise user_error(
            DropmaskValueError,
            f"global_shape and offset need one entry per axis of the local shape {shape}, got "
            f"global_shape={dims} and {len(offset)} offsets",
            caller=caller,
        )
    if any(g < d for g, d in zip(dims, shape, strict=True)):
        raise user_error(
            DropmaskValueError,
            f"global_shape {dims} is smaller than the local shape {shape}; it is the shape of "
            "the whole (unsharded) array",
            caller=caller,
        )
    _check_offset(shape, dims, offset, caller=caller)
    return Block(
        tuple(1 if i in axes else d for i, d in enumerate(dims)),
        tuple(0 if i in axes else o for i, o in enumerate(offset)),
    )


def _check_offset(shape: tuple[int, ...], global_shape: Any, offset: Any, *, caller: str) -> None:
    """Raises unless each ``offset`` entry known now puts the local block of ``shape``
    inside ``global_shape``: an int in ``[0, global - local]``.

    Traced entries (e.g. ``lax.axis_index(...) * size`` inside ``shard_map``) are left
    to run time; a JAX scalar known now is checked as the same Python int is. The pair's
    other checks (both given, one entry per axis, ints) come first, in ``local_block``.
    """
    dims, offsets = tuple(global_shape), tuple(offset)
    for axis, (o, g, d) in enumerate(zip(offsets, dims, shape, strict=True)):
        value = concrete_value(o)
        if value is None or isinstance(g, bool) or not isinstance(g, int | np.integer):
            continue
        if value != math.floor(value) or not 0 <= value <= int(g) - d:
            raise user_error(
                DropmaskValueError,
                f"offset[{axis}] must be an int in [0, {int(g) - d}] (the local block {shape} "
                f"inside global_shape {tuple(int(n) for n in dims)}), got {value:g}",
                "Pass each axis's global index of the block's first element.",
                caller=caller,
            )


def _check_bound(names: Any, spec: Any, caller: str) -> None:
    """Raises unless every mesh axis in one ``shard_spec`` entry is bound here.

    JAX's own error is a bare ``NameError: unbound axis name``; this one names the
    argument, the axis and the mesh axes that are in scope.
    """
    group = names if isinstance(names, tuple) else (names,)
    if not group or not all(isinstance(name, str) for name in group):
        raise user_error(
            DropmaskTypeError,
            "shard_spec entries must be None, a mesh axis name or a tuple of names, got "
            f"{names!r} in {spec!r}",
            "Pass the input's PartitionSpec from shard_map's in_specs.",
            caller=caller,
        )
    for name in group:
        try:
            lax.axis_size(name)
        except NameError:
            in_scope = tuple(jax.sharding.get_abstract_mesh().axis_names)
            where = (
                f"the mesh axes in scope are {in_scope}"
                if in_scope
                else "no mesh axis is in scope (this is not inside shard_map)"
            )
            raise user_error(
                DropmaskValueError,
                f"shard_spec {spec!r} names the mesh axis {name!r}, which is not bound here; "
                f"{where}",
                "Use shard_spec inside shard_map with the input's PartitionSpec from in_specs, "
                "or leave it None outside shard_map.",
                caller=caller,
            ) from None


def block_from_spec(shape: tuple[int, ...], spec: Any, *, caller: str) -> Block:
    """The block of a global array that this device holds inside ``shard_map``.

    ``spec`` is the input's ``PartitionSpec`` (as in ``shard_map``'s ``in_specs``): one
    entry per leading axis, ``None`` or a mesh axis name (or a tuple of names) that the
    axis is split over. The global size along an axis is the local size times the
    number of devices on those mesh axes; the offset is this device's index on them
    (``lax.axis_index``, row-major over a tuple) times the local size.
    """
    entries = tuple(spec)
    if len(entries) > len(shape):
        raise user_error(
            DropmaskValueError,
            f"shard_spec {spec!r} has {len(entries)} entries but the input has {len(shape)} axes",
            "Pass the PartitionSpec the input has inside shard_map.",
            caller=caller,
        )
    entries = entries + (None,) * (len(shape) - len(entries))
    global_shape, offset = [], []
    for d, names in zip(shape, entries, strict=True):
        if names is None:
            global_shape.append(d)
            offset.append(0)
            continue
        _check_bound(names, spec, caller)
        size = lax.axis_size(names)
        global_shape.append(d * size)
        offset.append(lax.axis_index(names) * d)
    return Block(tuple(global_shape), tuple(offset))


def explicit_split(x: Any) -> tuple[Any, Any] | None:
    """``(mesh, spec)`` of ``x``'s type where it is traced under a mesh of explicit axes
    (of any size: there a kernel must run inside ``shard_map``, since a Pallas call takes
    no array whose type names a mesh axis); None elsewhere: no mesh, inside
    ``shard_map`` over all of a mesh's axes, or a mesh of automatic axes (whose types
    carry no partition)."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if sharding is None or mesh is None or not getattr(mesh, "axis_names", ()):
        return None
    explicit = jax.sharding.AxisType.Explicit
    if explicit not in tuple(mesh.axis_types):
        return None
    return mesh, sharding.spec


def local_shape(shape: tuple[int, ...], mesh: Any, spec: Any) -> tuple[int, ...] | None:
    """Each device's block of an array of ``shape`` sharded as ``spec`` over ``mesh``;
    None where an axis does not split evenly."""
    entries = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    local = []
    for size, names in zip(shape, entries, strict=True):
        group = () if names is None else names if isinstance(names, tuple) else (names,)
        parts = math.prod(mesh.shape[name] for name in group)
        if size % parts:
            return None
        local.append(size // parts)
    return tuple(local)


def explicitly_sharded_axes(x: Any) -> tuple[int, ...]:
    """The axes of ``x`` that its type splits over the axes of an explicit mesh; ``()``
    outside such a mesh (where a type carries no partition)."""
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    if spec is None:
        return ()
    return tuple(axis for axis, part in enumerate(spec) if part is not None)


def sharded_as(y: jax.Array, x: jax.Array) -> jax.Array:
    """``y`` (broadcastable to ``x``) broadcast to ``x``'s shape and sharded as ``x``, when
    ``x`` is sharded over a mesh of explicit axes; ``y`` as is otherwise.

    There ``lax.select`` needs its operands sharded alike (Flax draws its mask with
    ``out_sharding=jax.typeof(inputs).sharding``); the values do not change.
    """
    if not explicitly_sharded_axes(x):
        return y
    return resharded_to(jnp.broadcast_to(y, x.shape), jax.typeof(x).sharding)


def resharded_to(x: jax.Array, sharding: Any) -> jax.Array:
    """``x`` resharded to ``sharding`` (a ``NamedSharding``; its mesh named, so that no
    ``jax.set_mesh`` is needed around the call); ``x`` itself, and no operation in the
    program, where ``x`` is already split so or ``sharding`` is None."""
    have = spec_entries(jax.typeof(x).sharding.spec, x.ndim)
    if sharding is None or have == spec_entries(sharding.spec, x.ndim):
        return x
    return jax.sharding.reshard(x, sharding)


def spec_entries(spec: Any, ndim: int) -> tuple[Any, ...]:
    """A partition spec's entries, one per axis (trailing axes unsplit)."""
    entries = tuple(spec)
    return entries + (None,) * (ndim - len(entries))
