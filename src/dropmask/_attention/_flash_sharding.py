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

A call that splits the query or key axis, or head depths, is gathered before any path
runs (``_split.on_whole_rows``: the inputs resharded to ``q``'s batch and heads split,
the output back to ``q``'s sharding), and the kernels run on whole
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
from jax.sharding import PartitionSpec as P

from .._random import local_shape
from . import _flash_dropout as fd
from . import _flash_tpu as ft
from . import _kernel_inputs as ki
from ._split import Split, entries, parts, resharded

__all__ = ["sharded_flash_attention"]


def _broadcast(x: Any, shape: tuple[int, ...], mesh: Any, spec: P) -> Any:
    """``x`` (None, or broadcastable to ``shape``) broadcast and sharded as ``spec``."""
    if x is None:
        return None
    return resharded(jnp.broadcast_to(x, shape), mesh, spec)


def sharded_flash_attention(
    split: Split,
    flash: ft.Flash,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    inputs: ki.KernelInputs,
) -> tuple[jax.Array, jax.Array]:
    """``_flash_tpu.flash_attention`` on each device's block of a call split as ``split``
    (``_split.split_of``): the unsharded call's values and gradients (bit for bit on a CPU;
    on a TPU as two compilations of the unsharded call agree)."""
    plan = flash.tiles
    batch, lq, lk = plan.batch, plan.q_len, plan.kv_len
    assert all(entries(x) == tuple(split.spec()) for x in (q, k, v)), "split first"
    local_batch = local_shape(batch, split.mesh, split.rows())
    assert local_batch is not None
    heads = plan.heads // parts(split.mesh, split.heads)
    kv_heads = plan.kv_heads // parts(split.mesh, split.heads)
    local_plan = dataclasses.replace(plan, batch=local_batch, kv_heads=kv_heads)
    place = None
    if plan.dropout and not plan.broadcast_dropout:
        place = fd.Place(local_batch, batch, heads, plan.heads)
    local = dataclasses.replace(flash, tiles=local_plan, place=place)

    side = (
        _broadcast(inputs.kv_valid, (*batch, lk), split.mesh, split.rows(None)),
        _broadcast(inputs.q_segments, (*batch, lq), split.mesh, split.rows(None)),
        _broadcast(inputs.kv_segments, (*batch, lk), split.mesh, split.rows(None)),
        resharded(inputs.bad_q, split.mesh, split.rows(None, split.heads)),
        resharded(inputs.bad_kv, split.mesh, split.rows(None, split.heads)),
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
            axis_names=set(split.free),
            check_vma=False,
        )(q, k, v, side, scalars)
        return (_varying_as(out, q), _varying_as(taint, q)), saved

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
            axis_names=set(split.free),
            check_vma=False,
        )(saved, d_out)
        return (
            _varying_as(d_q, q),
            _varying_as(d_k, k),
            _varying_as(d_v, v),
            jax.tree.map(lambda _: None, side),
            jax.tree.map(lambda _: None, scalars),
        )

    @jax.custom_vjp
    def attend(q, k, v, side, scalars):
        return attend_fwd(q, k, v, side, scalars)[0]

    attend.defvjp(attend_fwd, attend_bwd)
    out, taint = attend(q, k, v, side, scalars)
    return out, taint


def _varying_as(x: jax.Array, like: jax.Array) -> jax.Array:
    """``x`` varying over the manual mesh axes ``like`` varies over. Inside a
    ``shard_map`` over some of a mesh's axes, the kernels' own ``shard_map`` over the
    rest (which does not check these types) returns values typed as the same on every
    device of those axes: an output typed so, JAX marks varying itself, and the
    transpose of that mark sums the cotangent over the axes (gradients silently
    wrong); a gradient typed so, ``custom_vjp`` refuses."""
    missing = tuple(sorted(_varying(like) - _varying(x)))
    if not missing:
        return x
    if hasattr(lax, "pcast"):
        return lax.pcast(x, missing, to="varying")
    return lax.pvary(x, missing)  # JAX before pcast  # pyright: ignore[reportAttributeAccessIssue]


def _varying(x: jax.Array) -> frozenset[str]:
    """The manual mesh axes ``x``'s type varies over (JAX's ``vma``, renamed
    ``manual_axis_type.varying`` in later versions)."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


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
