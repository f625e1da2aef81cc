"""The TPU attention kernels as ``pallas_call``s: each kernel's grid, block specs, index
maps (a skipped tile's repeats the tile before), scratch and outputs; whether ``dq``
comes from the ``dk``/``dv`` kernel."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._random import tpu_only
from . import _blockwise as bw
from ._flash_tpu_kernels import dkdv_kernel, dq_kernel, flags_kernel, forward_kernel
from ._flash_tpu_plan import (
    ROW,
    VMEM_BYTES,
    Flash,
    Inputs,
    flag_tiles,
    key_range,
    query_range,
    visited,
)

__all__ = ["backward", "draw_flags", "forward", "fuses_dq", "kernel_call"]


def kernel_call(
    flash: Flash,
    body: Any,
    grid,
    in_specs,
    out_specs,
    out_shape,
    scratch,
    name: str,
    *,
    ordered: int = 1,
    aliases: dict[int, int] | None = None,
):
    # The last ``ordered`` axes in order: a skipped step's index map repeats a block
    # another step of the last axis visits; the dk/dv kernel that accumulates dq
    # reduces over its key tiles too.
    semantics: tuple[Any, ...] = ("parallel",) * (len(grid) - ordered) + ("arbitrary",) * ordered
    call = pl.pallas_call(
        functools.partial(body, flash),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2 + flash.dropout + flash.run_time_rate,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=scratch,
        ),
        out_shape=out_shape,
        input_output_aliases=aliases or {},
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=semantics, vmem_limit_bytes=VMEM_BYTES
        ),
        interpret=flash.interpret,
        name=name,
    )
    if flash.interpret:
        return call
    # Compiled kernels sit in the TPU branch of a platform switch (``_dot_product``).
    # Tried once while traced, so that a kernel Mosaic fails to lower sends the call to
    # the path without the kernels (``_dot_product``) instead of failing its program.
    # The name, ``flash`` and the grid, with the operands' shapes, determine the kernel.
    return lambda *args: tpu_only(call, *args, check=(name, (flash, grid)))


class _ByQueryTile:
    """Index maps for a grid ``(batch * heads, query tiles, key tiles)`` (the forward and
    ``dq`` kernels): a query tile's blocks, and the key tile visited at each step."""

    def __init__(self, plan: bw.Plan):
        self.plan = plan

    def _key_tile(self, bh: Any, i: Any, j: Any, tiles: Any) -> Any:
        lo, hi = key_range(self.plan, i, tiles[bh // self.plan.heads])
        return visited(lo, hi, j, self.plan.n_k)

    def rows(self, bh: Any, i: Any, j: Any, *_: Any) -> tuple[Any, ...]:
        return (bh, i, 0)

    def row_vector(self, bh: Any, i: Any, j: Any, *_: Any) -> tuple[Any, ...]:
        return (bh, 0, i)

    def keys(self, bh: Any, i: Any, j: Any, tiles: Any, *_: Any) -> tuple[Any, ...]:
        return (bh // self.plan.groups, self._key_tile(bh, i, j, tiles), 0)

    def key_vector(self, bh: Any, i: Any, j: Any, tiles: Any, *_: Any) -> tuple[Any, ...]:
        return (bh // self.plan.groups, 0, self._key_tile(bh, i, j, tiles))

    def flags_spec(self, flash: Flash) -> Any:
        """A tile's stored flags: its head row's (or the shared) row, the key tile
        visited."""

        def index(bh: Any, i: Any, j: Any, tiles: Any, *_: Any) -> tuple[Any, ...]:
            return (flash.flag_rows(bh), i, self._key_tile(bh, i, j, tiles))

        return pl.BlockSpec((None, *flash.bits.tile), index)

    def segment_specs(self) -> list[Any]:
        """Query and key segment ids ``int32[B, 1, L]`` (a batch row's, every head)."""
        plan, heads = self.plan, self.plan.heads

        def q_seg(bh: Any, i: Any, j: Any, *_: Any) -> tuple[Any, ...]:
            return (bh // heads, 0, i)

        def kv_seg(bh: Any, i: Any, j: Any, tiles: Any, *_: Any) -> tuple[Any, ...]:
            return (bh // heads, 0, self._key_tile(bh, i, j, tiles))

        return [
            pl.BlockSpec((None, 1, plan.block_q), q_seg),
            pl.BlockSpec((None, 1, plan.block_k), kv_seg),
        ]


def forward(flash: Flash, q, k, v, side: Inputs):
    """``q: [B*H, Lq, D]``, ``k, v: [B*Hk, Lk, D|Dv]`` -> output and log-sum-exps."""
    plan = flash.tiles
    bq, bk = plan.block_q, plan.block_k
    depth, dv = q.shape[-1], v.shape[-1]
    ix = _ByQueryTile(plan)
    in_specs = [
        pl.BlockSpec((None, bq, depth), ix.rows),
        pl.BlockSpec((None, bk, depth), ix.keys),
        pl.BlockSpec((None, bk, dv), ix.keys),
        pl.BlockSpec((None, 1, bq), ix.row_vector),
        pl.BlockSpec((None, 1, bk), ix.key_vector),
    ]
    args = [q, k, v, side.q_state, side.kv_state]
    if flash.segments:
        in_specs += ix.segment_specs()
        args += [side.q_segments, side.kv_segments]
    if flash.stored:
        in_specs.append(ix.flags_spec(flash))
        args.append(side.flags)
    out_specs = [pl.BlockSpec((None, bq, dv), ix.rows), pl.BlockSpec((None, bq, ROW), ix.rows)]
    rows = q.shape[0]
    out_shape = [
        jax.ShapeDtypeStruct((rows, q.shape[1], dv), q.dtype),
        jax.ShapeDtypeStruct((rows, q.shape[1], ROW), jnp.float32),
    ]
    scratch = [
        pltpu.VMEM((bq, ROW), jnp.float32),
        pltpu.VMEM((bq, ROW), jnp.float32),
        pltpu.VMEM((bq, dv), jnp.float32),
        pltpu.VMEM((bq, ROW), jnp.int32),
    ]
    grid = (rows, plan.n_q, plan.n_k)
    run = kernel_call(
        flash, forward_kernel, grid, in_specs, out_specs, out_shape, scratch, "dropmask_flash_fwd"
    )
    out, lse = run(*side.scalars, *args)
    return out, lse[:, :, 0].reshape(rows, 1, -1)


def backward(flash: Flash, q, k, v, side: Inputs, out, lse, d_out):
    plan = flash.tiles
    bq, bk, heads, g, n_q = plan.block_q, plan.block_k, plan.heads, plan.groups, plan.n_q
    depth, dv = q.shape[-1], v.shape[-1]
    tainted = (lse == jnp.inf).reshape(lse.shape[0], -1, 1)
    d_out = jnp.where(tainted, 0, d_out).astype(q.dtype)
    # dO as the dP products see it: rounded to bfloat16 where they round (``consistent``)
    seen = lax.reduce_precision(d_out, 8, 7) if flash.consistent else d_out
    delta = jnp.sum(seen.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    delta = delta.reshape(lse.shape)  # rowsum(dO * O) = rowsum(P * dP), [B*H, 1, Lq]

    # dk, dv: grid (B*Hk, key tiles, groups * query tiles).
    def q_tile(bkv, j, t, tiles, *_):
        lo, hi = query_range(plan, j, tiles[bkv // plan.kv_heads])
        return bkv * g + t // n_q, visited(lo, hi, t % n_q, n_q)

    def q_index(bkv, j, t, *rest):
        bh, i = q_tile(bkv, j, t, *rest)
        return (bh, i, 0)

    def q_row(bkv, j, t, *rest):
        bh, i = q_tile(bkv, j, t, *rest)
        return (bh, 0, i)

    in_specs = [
        pl.BlockSpec((None, bq, depth), q_index),
        pl.BlockSpec((None, bk, depth), lambda bkv, j, t, *_: (bkv, j, 0)),
        pl.BlockSpec((None, bk, dv), lambda bkv, j, t, *_: (bkv, j, 0)),
        pl.BlockSpec((None, bq, dv), q_index),
        pl.BlockSpec((None, 1, bq), q_row),
        pl.BlockSpec((None, 1, bq), q_row),
        pl.BlockSpec((None, 1, bk), lambda bkv, j, t, *_: (bkv, 0, j)),
    ]
    args = [q, k, v, d_out, lse, delta, side.kv_state]
    if flash.segments:

        def q_seg(bkv, j, t, *rest):
            bh, i = q_tile(bkv, j, t, *rest)
            return (bh // heads, 0, i)

        in_specs += [
            pl.BlockSpec((None, 1, bq), q_seg),
            pl.BlockSpec((None, 1, bk), lambda bkv, j, t, *_: (bkv // plan.kv_heads, 0, j)),
        ]
        args += [side.q_segments, side.kv_segments]
    if flash.stored:

        def flags(bkv, j, t, *rest):
            bh, i = q_tile(bkv, j, t, *rest)
            return (flash.flag_rows(bh), i, j)

        in_specs.append(pl.BlockSpec((None, *flash.bits.tile), flags))
        args.append(side.flags)
    out_specs = [
        pl.BlockSpec((None, bk, depth), lambda bkv, j, t, *_: (bkv, j, 0)),
        pl.BlockSpec((None, bk, dv), lambda bkv, j, t, *_: (bkv, j, 0)),
    ]
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    scratch = [pltpu.VMEM((bk, depth), jnp.float32), pltpu.VMEM((bk, dv), jnp.float32)]
    flash = dataclasses.replace(flash, fused_dq=fuses_dq(plan, depth))
    aliases = None
    if flash.fused_dq:
        # dq accumulates over the key tiles in VMEM (a group of heads' rows) and each
        # step writes the tile its index map names; tiles no key tile reaches keep
        # the zeros of the operand dq is aliased to.
        aliases = {len(side.scalars) + len(args): 2}
        in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
        args.append(jnp.zeros(q.shape, q.dtype))
        out_specs.append(pl.BlockSpec((None, bq, depth), q_index))
        out_shape.append(jax.ShapeDtypeStruct(q.shape, q.dtype))
        scratch.append(pltpu.VMEM((g, n_q * bq, depth), jnp.float32))
    if flash.dropout:
        scratch.append(pltpu.VMEM((bk, dv), v.dtype))
    grid = (k.shape[0], plan.n_k, g * n_q)
    d_k, d_v, *d_q = kernel_call(
        flash,
        dkdv_kernel,
        grid,
        in_specs,
        out_specs,
        out_shape,
        scratch,
        "dropmask_flash_dkdv",
        ordered=2 if flash.fused_dq else 1,
        aliases=aliases,
    )(*side.scalars, *args)
    if d_q:
        return d_q[0], d_k, d_v
    return _dq(flash, q, k, v, side, args), d_k, d_v


# A group of heads' dq, float32, that the dk/dv kernel may keep in VMEM: [1, 32768, 8,
# 128] or [1, 8192, 8 over 2, 128], beside the about 20 MiB a step of [1024, 1024]
# tiles takes, under the kernels' VMEM_BYTES.
DQ_VMEM_BYTES = 16 * 2**20


def fuses_dq(plan: bw.Plan, depth: int) -> bool:
    """Whether the ``dk``/``dv`` kernel computes ``dq`` too, accumulating a group of
    heads' rows over its key tiles in VMEM (``DQ_VMEM_BYTES``). It saves the ``dq``
    kernel's second pass over the scores (their product, exponentials and dropout
    flags, and ``dP``): the backward's products go from 7 a tile pair to 5. Longer
    rows take the ``dq`` kernel."""
    return plan.groups * plan.n_q * plan.block_q * depth * 4 <= DQ_VMEM_BYTES


def _dq(flash: Flash, q, k, v, side: Inputs, args: list[Any]) -> jax.Array:
    """``dq`` by its own kernel: grid ``(B*H, query tiles, key tiles)``, as the forward."""
    plan = flash.tiles
    bq, bk = plan.block_q, plan.block_k
    depth, dv = q.shape[-1], v.shape[-1]
    ix = _ByQueryTile(plan)
    in_specs = [
        pl.BlockSpec((None, bq, depth), ix.rows),
        pl.BlockSpec((None, bk, depth), ix.keys),
        pl.BlockSpec((None, bk, dv), ix.keys),
        pl.BlockSpec((None, bq, dv), ix.rows),
        pl.BlockSpec((None, 1, bq), ix.row_vector),
        pl.BlockSpec((None, 1, bq), ix.row_vector),
        pl.BlockSpec((None, 1, bk), ix.key_vector),
    ]
    if flash.segments:
        in_specs += ix.segment_specs()
    if flash.stored:
        in_specs.append(ix.flags_spec(flash))
    out_specs = [pl.BlockSpec((None, bq, depth), ix.rows)]
    scratch = [pltpu.VMEM((bq, depth), jnp.float32)]
    if flash.dropout and not flash.consistent:
        scratch.append(pltpu.VMEM((bq, dv), q.dtype))
    grid = (q.shape[0], plan.n_q, plan.n_k)
    (d_q,) = kernel_call(
        flash,
        dq_kernel,
        grid,
        in_specs,
        out_specs,
        [jax.ShapeDtypeStruct(q.shape, q.dtype)],
        scratch,
        "dropmask_flash_dq",
    )(*side.scalars, *args)
    return d_q


def draw_flags(flash: Flash, rows: int, scalars: tuple[jax.Array, ...]) -> jax.Array:
    """The stored flags of ``rows`` rows of heads (1: one mask for all), drawn by
    ``flags_kernel``: ``int32[rows, n_q * tile rows, n_k * 128]``."""
    plan = flash.tiles
    tile_rows, tile_cols = flash.bits.tile

    def index(row: Any, i: Any, j: Any, tiles: Any, *_: Any) -> tuple[Any, ...]:
        lo, hi = flag_tiles(flash, row, i, tiles)
        return (row, i, visited(lo, hi, j, plan.n_k))

    shape = (rows, plan.n_q * tile_rows, plan.n_k * tile_cols)
    (words,) = kernel_call(
        flash,
        flags_kernel,
        (rows, plan.n_q, plan.n_k),
        [],
        [pl.BlockSpec((None, tile_rows, tile_cols), index)],
        [jax.ShapeDtypeStruct(shape, jnp.int32)],
        [],
        "dropmask_flash_flags",
    )(*scalars)
    return words
