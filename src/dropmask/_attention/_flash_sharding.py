"""The TPU attention kernels on many devices: each device's block inside ``shard_map``.

A Mosaic kernel is one device's program, which XLA cannot split. Under a mesh of
explicit axes the types of ``q``, ``k`` and ``v`` carry their sharding when traced, so
a call split over batch axes (data parallelism) and over heads (tensor parallelism; the
key-value heads split alike, so each device keeps whole groups of grouped-query heads)
runs the kernels on each device's block, with no collective: the forward and both
backward kernels inside ``shard_map`` of their own, tied by a ``custom_vjp`` (so no
``shard_map`` is differentiated, and no cotangent is summed across devices). The
dropout mask stays the unsharded call's: with one mask for every head (Flax's default)
no tile depends on its batch row or head; with a mask per head each block draws its
rows at their global place (``_flash_dropout.Place``).

A call that splits the query or key axis, or head depths, needs communication whatever
computes it: :func:`split_of` gathers those axes (the inputs resharded to ``q``'s batch
and heads split, the output back to ``q``'s sharding), and the kernels run on whole
rows; the mask is the same. Inside a user's ``shard_map`` the kernels
take each device's block as the whole call (as every path does there). In a program
XLA partitions itself (automatic axes) the sharding is not known when traced, and the
blockwise path runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._random import explicit_split, local_shape
from . import _flash_dropout as fd
from . import _flash_tpu as ft
from . import _kernel_inputs as ki

__all__ = ["Split", "sharded_flash_attention", "split_of"]


@dataclasses.dataclass(frozen=True)
class Split:
    """How a call is split over a mesh of explicit axes: the mesh, the entry of each
    batch axis and the heads' entry (``None``, a mesh axis name or a tuple of names)."""

    mesh: Any
    batch: tuple[Any, ...]
    heads: Any

    def spec(self) -> P:
        """``q``, ``k``, ``v`` and the output: ``[*batch, L, H, D]``."""
        return P(*self.batch, None, self.heads, None)

    def rows(self, *tail: Any) -> P:
        """An array of the batch axes, then ``tail``."""
        return P(*self.batch, *tail)

    def every_device(self) -> P:
        """Per-device pieces stacked along their first axis (residuals between the
        forward and backward ``shard_map``)."""
        return P(tuple(self.mesh.axis_names))

    def offsets(self, local_batch: tuple[int, ...], local_heads: int) -> jax.Array:
        """``int32[len(batch) + 1]``: this device's first batch index on each batch axis
        and its first head (inside ``shard_map``)."""
        out = []
        pairs = (*zip(local_batch, self.batch, strict=True), (local_heads, self.heads))
        for size, names in pairs:
            out.append(0 if names is None else lax.axis_index(names) * size)
        return jnp.stack([jnp.asarray(o, jnp.int32) for o in out])


def _entries(x: jax.Array) -> tuple[Any, ...]:
    """``x``'s partition entries, one per axis."""
    spec = tuple(jax.typeof(x).sharding.spec)
    return spec + (None,) * (x.ndim - len(spec))


def split_of(q: jax.Array, k: jax.Array, v: jax.Array) -> Split | None:
    """How the kernels split a call: None where ``q`` is not traced under a mesh of
    explicit axes (one device, or inside ``shard_map``: the kernels take the call as it
    is); else ``q``'s split of its batch axes and heads. An input split otherwise (a
    sharded length or depth, ``k`` or ``v`` split unlike ``q``) is gathered to that
    split first, and where it does not divide the inputs evenly, to none: the kernels
    need whole rows of keys and queries, and the mask is the same either way."""
    found = explicit_split(q)
    if found is None:
        return None
    mesh, _ = found
    q_spec = _entries(q)
    split = Split(mesh, q_spec[:-3], q_spec[-2])
    if any(local_shape(x.shape, mesh, split.spec()) is None for x in (q, k, v)):
        split = Split(mesh, (None,) * (q.ndim - 3), None)
    return split


def _broadcast(x: Any, shape: tuple[int, ...], mesh: Any, spec: P) -> Any:
    """``x`` (None, or broadcastable to ``shape``) broadcast and sharded as ``spec``."""
    if x is None:
        return None
    return jax.sharding.reshard(jnp.broadcast_to(x, shape), NamedSharding(mesh, spec))


def sharded_flash_attention(
    split: Split,
    flash: ft.Flash,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    inputs: ki.KernelInputs,
) -> tuple[jax.Array, jax.Array]:
    """``_flash_tpu.flash_attention`` on each device's block of a call split as ``split``
    (:func:`split_of`): the unsharded call's values and gradients (bit for bit on a CPU;
    on a TPU as two compilations of the unsharded call agree)."""
    plan = flash.tiles
    batch, lq, lk = plan.batch, plan.q_len, plan.kv_len
    q_sharding = jax.typeof(q).sharding
    q, k, v = (_resharded(x, split.mesh, split.spec()) for x in (q, k, v))
    local_batch = local_shape(batch, split.mesh, split.rows())
    assert local_batch is not None
    heads = plan.heads // math.prod(split.mesh.shape[n] for n in _names(split.heads))
    kv_heads = plan.kv_heads // math.prod(split.mesh.shape[n] for n in _names(split.heads))
    local_plan = dataclasses.replace(plan, batch=local_batch, kv_heads=kv_heads)
    place = None
    if plan.dropout and not plan.broadcast_dropout:
        place = fd.Place(local_batch, batch, heads, plan.heads)
    local = dataclasses.replace(flash, tiles=local_plan, place=place)

    side = (
        _broadcast(inputs.kv_valid, (*batch, lk), split.mesh, split.rows(None)),
        _broadcast(inputs.q_segments, (*batch, lq), split.mesh, split.rows(None)),
        _broadcast(inputs.kv_segments, (*batch, lk), split.mesh, split.rows(None)),
        _resharded(inputs.bad_q, split.mesh, split.rows(None, split.heads)),
        _resharded(inputs.bad_kv, split.mesh, split.rows(None, split.heads)),
    )
    side_specs = tuple(
        None if x is None else split.rows(None, split.heads) if i >= 3 else split.rows(None)
        for i, x in enumerate(side)
    )
    scalars = (inputs.key, inputs.run_time_keep)

    def local_inputs(side: Any, scalars: Any) -> ki.KernelInputs:
        kv_valid, q_seg, kv_seg, bad_q, bad_kv = side
        key, keep = scalars
        return ki.KernelInputs(kv_valid, q_seg, kv_seg, bad_q, bad_kv, key, keep)

    spec, every = split.spec(), split.every_device()
    taint_spec = split.rows(split.heads, None, None)
    completed: list[ft.Flash] = []  # the forward's local Flash (static), for the backward

    def forward(q, k, v, side, scalars):
        offsets = None if place is None else split.offsets(local_batch, heads)
        done, q3, k3, v3, kside = ft.prepare(local, q, k, v, local_inputs(side, scalars), offsets)
        completed.append(done)
        (out, lse), saved = ft.attend_forward(done, q3, k3, v3, kside)
        return (*ft.finish(done, out, lse), jax.tree.map(_stacked, saved))

    def attend_fwd(q, k, v, side, scalars):
        out, taint, saved = jax.shard_map(
            forward,
            mesh=split.mesh,
            in_specs=(spec, spec, spec, side_specs, P()),
            out_specs=(spec, taint_spec, every),
            check_vma=False,
        )(q, k, v, side, scalars)
        return (out, taint), saved

    def backward(saved, d_out):
        residuals = jax.tree.map(_unstacked, saved)
        d_rows = ft.rows_first(local_plan, d_out, lq, heads, residuals[0].shape[1])
        d_q, d_k, d_v, _ = ft.attend_backward(completed[-1], residuals, (d_rows, None))
        return (
            _rows_last(local_plan, d_q, lq, heads),
            _rows_last(local_plan, d_k, lk, kv_heads),
            _rows_last(local_plan, d_v, lk, kv_heads),
        )

    def attend_bwd(saved, cotangents):
        d_out, _ = cotangents
        d_q, d_k, d_v = jax.shard_map(
            backward,
            mesh=split.mesh,
            in_specs=(every, spec),
            out_specs=(spec, spec, spec),
            check_vma=False,
        )(saved, d_out)
        return (
            d_q,
            d_k,
            d_v,
            jax.tree.map(lambda _: None, side),
            jax.tree.map(lambda _: None, scalars),
        )

    @jax.custom_vjp
    def attend(q, k, v, side, scalars):
        return attend_fwd(q, k, v, side, scalars)[0]

    attend.defvjp(attend_fwd, attend_bwd)
    out, taint = attend(q, k, v, side, scalars)
    return _resharded(out, split.mesh, q_sharding.spec), taint


def _resharded(x: jax.Array, mesh: Any, spec: Any) -> jax.Array:
    """``x`` sharded as ``spec`` over ``mesh`` (no operation where it already is); the
    mesh named, so that no ``jax.set_mesh`` is needed around the call."""
    if tuple(_entries(x)) == tuple(spec) + (None,) * (x.ndim - len(tuple(spec))):
        return x
    return jax.sharding.reshard(x, NamedSharding(mesh, spec))


def _names(entry: Any) -> tuple[str, ...]:
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def _stacked(x: jax.Array) -> jax.Array:
    return x[None]


def _unstacked(x: jax.Array) -> jax.Array:
    return x[0]


def _rows_last(plan: Any, x: jax.Array, length: int, h: int) -> jax.Array:
    """The inverse of ``_flash_tpu.rows_first``: ``[B * h, padded, d]`` as
    ``[*batch, length, h, d]``."""
    bsz = math.prod(plan.batch)
    x = x[:, :length].reshape(bsz, h, length, x.shape[-1]).transpose(0, 2, 1, 3)
    return x.reshape(*plan.batch, length, h, x.shape[-1])
