"""FlashAttention-2 as Pallas TPU (Mosaic) kernels, with the dense path's dropout mask drawn inside.

The TPU form of ``_pallas`` (whose kernels are written for Triton's programs): three
kernels over a grid whose last axis walks the tiles a program reduces over, with the
running state in scratch memory, as TPUs run Pallas kernels.

* forward, grid ``(batch * heads, query tiles, key tiles)``: a running maximum, sum
  and unnormalised output per query row; writes the output and one log-sum-exp per
  row (``+inf`` for a tainted row, which saw a non-finite input or score);
* ``dk``/``dv``, grid ``(batch * kv_heads, key tiles, groups * query tiles)``: works on
  the transposed scores ``k q^T`` ``[block_k, block_q]``, so the log-sum-exps and
  ``rowsum(dO * O)`` arrive as lane vectors and every product is a plain one;
* ``dq``, grid ``(batch * heads, query tiles, key tiles)``.

Tiles the window structure (causal, local) or the key padding leaves out are skipped,
and their index maps repeat the previous tile, so they cost no copy either.

The non-finite convention (a row that sees a non-finite input or score is tainted) costs
checks on every score; :func:`clean` proves ahead, from one read of ``q`` and ``k``, that
every score of a call is finite, and then each tile takes a step without them, which
gives the same bits (the checks find nothing) in about half the vector work.

Dropout (``_flash_dropout``). Where the flags fit in the memory that q, k, v and the
output take, a fourth kernel (grid ``(rows of heads, query tiles, key tiles)``, one row
where every head shares the mask) draws each tile's flags once into 32-bit words, a bit
a flag, and the three kernels unpack their tile's words with a shift and a compare;
elsewhere each kernel draws its tile's flags itself (the ``dk``/``dv`` kernel
transposed). Either way the flags are the dense path's, element by element. A flag
selects a weight (or its ``dP``); the ``1/keep`` scale is applied once to what the kept
weights sum to, or to the tile of ``v`` or ``dO`` they meet, not to each weight.

Served (:func:`serves`): float32 and bfloat16, no dense ``mask`` and no ``bias``, with
dropout more than one key (the key axis packs the mask), and head depths that are
multiples of 64 (those compiled on a TPU so far); the caller takes the
blockwise path otherwise, which draws the same mask. Tiles: ``block_k`` a multiple of
128 (each row of a key tile holds whole calls, ``block_k / 8`` of them) and ``block_q``
of 16. Off a TPU the kernels run in Pallas's TPU interpreter (the tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._random import LANES, check_word_count, key_words, threshold, tpu_only
from . import _blockwise as bw
from . import _flash_dropout as fd
from . import _kernel_inputs as ki

__all__ = ["DEFAULT_BLOCKS", "Flash", "flash_attention", "kernel_precision", "serves"]

# (block_q, block_k): 128 calls a row of a key tile. Measured on a v5e (bf16, causal,
# dropout 0.1, forward and backward): against (512, 1024), 6% faster at [1, 4096, 8, 128],
# 7% at 8192 and 11% at 32768 tokens, and the 4-layer step 2% faster at 1024 tokens.
DEFAULT_BLOCKS = (1024, 1024)
_U32 = np.uint32
_ROW = 128  # lanes of a per-row scratch value (a row's scalar, repeated)
_NT = (((1,), (1,)), ((), ()))  # a @ b^T
_NN = (((1,), (0,)), ((), ()))  # a @ b
_TN = (((0,), (0,)), ((), ()))  # a^T @ b
_VMEM_BYTES = 64 * 2**20  # of a v5e's 128 MiB; a [1024, 1024] tile's scores and weights


@dataclasses.dataclass(frozen=True)
class Flash:
    """Everything static about one call: the tiles (a blockwise ``Plan``), whether
    segment ids are given, and whether the kernels run in the interpreter."""

    tiles: bw.Plan
    segments: bool
    interpret: bool
    stored: bool = False  # the flags drawn ahead into bits (``_flash_dropout.Bits``)
    key_padding: bool = True  # keys to mask out by their state (padded or invalid)
    fused_dq: bool = False  # the dk/dv kernel writes dq's part of each key tile
    place: fd.Place | None = None  # one device's block of a sharded call, mask per head
    precision: lax.Precision = lax.Precision.DEFAULT  # of float32 products (kernel_precision)

    @property
    def dropout(self) -> bool:
        return self.tiles.dropout

    @property
    def run_time_rate(self) -> bool:
        return self.tiles.run_time_rate

    @property
    def bits(self) -> fd.Bits:
        return fd.Bits(self.tiles.block_q, self.tiles.block_k)

    def flag_rows(self, bh: Any) -> Any:
        """The row of the stored flags that head row ``bh`` reads: one mask for every
        head, or each head's own."""
        return 0 if self.tiles.broadcast_dropout else bh


# Head depths the kernels serve when compiled: the multiples of this, the depths Mosaic
# compiled and ran on a v5e (64 and 128). Others take the blockwise path, since a
# kernel that fails to compile has no fallback yet; the interpreter takes any depth.
COMPILED_DEPTH = 64


def serves(
    dtype: Any,
    kv_len: int,
    dropout: bool,
    depths: tuple[int, int],
    *,
    mask: bool,
    bias: bool,
    interpret: bool,
) -> bool:
    """Whether the kernels serve a call: float32 or bfloat16, no dense ``mask`` or
    ``bias``, with dropout the key axis packing the mask (more than one key), and
    compiled, ``depths`` (of ``q``/``k`` and of ``v``) multiples of ``COMPILED_DEPTH``."""
    return (
        jnp.dtype(dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
        and (kv_len > 1 or not dropout)
        and not (mask or bias)
        and (interpret or all(d % COMPILED_DEPTH == 0 for d in depths))
    )


# --- inside the kernels ---------------------------------------------------------------


def kernel_precision(precision: Any) -> lax.Precision | None:
    """The precision of the kernels' products for a call's ``precision`` (where None,
    ``jax.default_matmul_precision``'s): Mosaic has one bfloat16 pass (``DEFAULT``) and
    the float32 contraction (``HIGHEST``), so ``HIGH`` (three passes) is given
    ``HIGHEST``, at least as accurate as asked. None where the kernels cannot honour it
    (a dot algorithm, operands at two precisions): the call takes the blockwise path."""
    if precision is None:
        precision = jax.config.jax_default_matmul_precision  # pyright: ignore[reportAttributeAccessIssue]
        if precision is None:
            return lax.Precision.DEFAULT
    if isinstance(precision, tuple | list):
        if len(set(precision)) != 1:
            return None
        precision = precision[0]
    try:
        chosen = lax.Precision(precision) if isinstance(precision, str) else precision
    except ValueError:
        return None
    if not isinstance(chosen, lax.Precision):
        return None
    return lax.Precision.DEFAULT if chosen == lax.Precision.DEFAULT else lax.Precision.HIGHEST


def _dot(flash: Flash, a: jax.Array, b: jax.Array, dims: Any) -> jax.Array:
    """A product in float32; of float32 operands at the call's precision (bfloat16
    operands are exact in one pass)."""
    f32 = jnp.dtype(jnp.float32)
    exact = flash.precision == lax.Precision.HIGHEST and a.dtype == f32 and b.dtype == f32
    precision = lax.Precision.HIGHEST if exact else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _nonfinite(s: jax.Array) -> jax.Array:
    # -inf too: an allowed score is -inf only by overflow (as on the blockwise path).
    return jnp.isnan(s) | (jnp.abs(s) == jnp.inf)


def _column(row_ref: Any) -> jax.Array:
    """A ``[1, n]`` block as an ``[n, 1]`` column."""
    return jnp.expand_dims(row_ref[0], -1)


@dataclasses.dataclass
class _Refs:
    """A kernel's refs, in the order the plumbing passes them: the scalar operands, the
    ``inputs`` each kernel names, segment ids, stored flags, then ``rest`` (outputs and
    scratch)."""

    scalars: fd.Scalars
    inputs: list[Any]
    q_segments: Any
    kv_segments: Any
    flags: Any
    rest: list[Any]

    @classmethod
    def of(cls, flash: Flash, refs: tuple[Any, ...], inputs: int) -> _Refs:
        refs_ = list(refs)
        scalars = fd.Scalars(flash.tiles, refs_, flash.place)
        named, rest = refs_[:inputs], refs_[inputs:]
        segments = (rest.pop(0), rest.pop(0)) if flash.segments else (None, None)
        flags = rest.pop(0) if flash.stored else None
        return cls(scalars, named, *segments, flags, rest)


def _tile_flags(
    flash: Flash, sc: fd.Scalars, flags_ref: Any, bh: Any, i: Any, j: Any, transposed: bool
) -> jax.Array | None:
    """The keep-flags of tile ``(i, j)`` of head row ``bh``: unpacked from the stored
    bits, or drawn; None without dropout."""
    if not flash.dropout:
        return None
    if flags_ref is not None:
        return flash.bits.unpack(flags_ref[...], transposed)
    plan = flash.tiles
    shape = (plan.block_q, plan.block_k)
    return fd.drawn_flags(sc, bh, i * plan.block_q, j * plan.block_k, shape, transposed)


def _allowed(plan: bw.Plan, rows: Any, cols: Any, state: Any, q_seg: Any, kv_seg: Any) -> Any:
    """Where queries ``rows`` may attend to keys ``cols`` (broadcasting shapes);
    ``state`` None: every key is valid."""
    ok = jnp.ones((), bool) if state is None else state != 0
    if plan.left is not None:
        ok = ok & (cols >= rows - plan.left)
    if plan.right is not None:
        ok = ok & (cols <= rows + plan.right)
    if q_seg is not None:
        ok = ok & (q_seg == kv_seg) & (q_seg != 0)
    return ok


def _key_range(plan: bw.Plan, i: Any, key_tiles: Any) -> tuple[Any, Any]:
    lo, hi = bw.key_block_bounds(plan, i)
    return lo, jnp.minimum(hi, key_tiles)


def _query_range(plan: bw.Plan, j: Any, key_tiles: Any) -> tuple[Any, Any]:
    lo, hi = bw.query_block_bounds(plan, j)
    return lo, jnp.where(j < key_tiles, hi, lo)


def _visited(lo: Any, hi: Any, t: Any, count: int) -> Any:
    """The tile to fetch at step ``t`` of a loop over ``[lo, hi)``: ``t`` clamped into it
    (and into ``[0, count)``), so a skipped step fetches the tile already there."""
    last = jnp.maximum(hi - 1, lo)
    return jnp.clip(jnp.clip(t, lo, last), 0, count - 1)


def _when_visited(flash: Flash, sc: fd.Scalars, visited: Any, step: Any) -> None:
    """Runs ``step(careful)`` on a visited tile: ``careful=False`` in a clean call (see
    ``clean``), whose scores are all finite, so the tile skips the non-finite checks
    (about half the vector work of a step); ``careful=True`` otherwise."""
    clean = sc.clean[0] != 0
    pl.when(visited & clean)(functools.partial(step, False))
    pl.when(visited & jnp.logical_not(clean))(functools.partial(step, True))


def _state(flash: Flash, careful: bool, ref: Any, column: bool = False) -> Any:
    """The key states a tile masks by: None (every key valid) in a clean call without
    key padding."""
    if not (careful or flash.key_padding):
        return None
    return _column(ref) if column else ref[...]


def _forward_kernel(flash: Flash, *refs: Any) -> None:
    plan = flash.tiles
    r = _Refs.of(flash, refs, 5)
    sc, q_seg_ref, kv_seg_ref, flags_ref = r.scalars, r.q_segments, r.kv_segments, r.flags
    q_ref, k_ref, v_ref, q_state_ref, kv_state_ref = r.inputs
    o_ref, lse_ref, m_sc, l_sc, acc_sc, taint_sc = r.rest
    bh, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk = plan.block_q, plan.block_k

    @pl.when(j == 0)
    def _init() -> None:
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)
        taint_sc[...] = jnp.zeros(taint_sc.shape, jnp.int32)

    lo, hi = _key_range(plan, i, sc.key_tiles[bh // plan.heads])

    def step(careful: bool) -> None:
        s = _dot(flash, q_ref[...], k_ref[...], _NT)  # [bq, bk]
        rows = i * bq + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
        cols = j * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        state = _state(flash, careful, kv_state_ref)  # [1, bk]
        q_seg = None if q_seg_ref is None else _column(q_seg_ref)
        kv_seg = None if kv_seg_ref is None else kv_seg_ref[...]
        ok = _allowed(plan, rows, cols, state, q_seg, kv_seg)
        if careful:
            bad = _nonfinite(s) | (state == ki.NONFINITE)
            bad_q = _column(q_state_ref) != 0
            seen = jnp.max(jnp.where(ok & (bad | bad_q), 1, 0), axis=1, keepdims=True)
            taint_sc[...] = jnp.maximum(taint_sc[...], seen)
            ok = ok & ~bad
        s = jnp.where(ok, s, -jnp.inf)
        m = m_sc[...][:, :1]
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(jnp.where(m == -jnp.inf, -jnp.inf, m - shift))
        p = jnp.exp(s - shift)
        total = alpha * l_sc[...][:, :1] + jnp.sum(p, axis=1, keepdims=True)
        m_sc[...] = jnp.broadcast_to(m_new, m_sc.shape)
        l_sc[...] = jnp.broadcast_to(total, l_sc.shape)
        flags = _tile_flags(flash, sc, flags_ref, bh, i, j, False)
        if flags is not None:
            p = jnp.where(flags, p, 0.0)
        v = v_ref[...]
        acc_sc[...] = alpha * acc_sc[...] + _dot(flash, p.astype(v.dtype), v, _NN)

    _when_visited(flash, sc, (j >= lo) & (j < hi), step)

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish() -> None:
        total = l_sc[...][:, :1]
        tainted = taint_sc[...][:, :1] != 0
        empty = (total == 0) | tainted
        safe = jnp.where(empty, 1.0, total)
        norm = 1 / safe if not flash.dropout else sc.inverse_keep() / safe
        o_ref[...] = jnp.where(empty, 0.0, acc_sc[...] * norm).astype(o_ref.dtype)
        lse = jnp.where(tainted, jnp.inf, jnp.where(empty, 0.0, m_sc[...][:, :1] + jnp.log(safe)))
        lse_ref[...] = jnp.broadcast_to(lse, lse_ref.shape)


def _weights(careful: bool, live: Any, s: jax.Array, lse: jax.Array) -> jax.Array:
    """The backward kernels' softmax weights ``exp(s - lse)`` where ``live``, 0 elsewhere.
    A careful step takes only finite scores as live (a tainted row's log-sum-exp is
    +inf, so its weights are 0 too)."""
    if careful:
        live = live & ~_nonfinite(s)
        s = jnp.where(live, s, 0.0)
    return jnp.where(live, jnp.exp(s - lse), 0.0)


def _scaled(ref: Any, by: Any) -> jax.Array:
    """A tile of ``ref`` multiplied by ``by``, in the tile's dtype."""
    x = ref[...]
    return (x.astype(jnp.float32) * by).astype(x.dtype)


def _dkdv_kernel(flash: Flash, *refs: Any) -> None:
    plan = flash.tiles
    r = _Refs.of(flash, refs, 7)
    sc, q_seg_ref, kv_seg_ref, flags_ref = r.scalars, r.q_segments, r.kv_segments, r.flags
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kv_state_ref = r.inputs
    dk_ref, dv_ref, *rest = r.rest
    dq_ref = rest.pop(0) if flash.fused_dq else None
    dk_sc, dv_sc, *v_kept_sc = rest
    bkv, j, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk, g = plan.block_q, plan.block_k, plan.groups
    n_q = plan.n_q
    group, i = t // n_q, t % n_q
    b = bkv // plan.kv_heads
    bh = bkv * g + group  # b * heads + (bkv % kv_heads) * groups + group

    @pl.when(t == 0)
    def _init() -> None:
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)
        if v_kept_sc:  # v / keep: dP of the kept weights, scaled once a key tile
            v_kept_sc[0][...] = _scaled(v_ref, sc.inverse_keep())

    lo, hi = _query_range(plan, j, sc.key_tiles[b])

    def step(careful: bool) -> None:
        q, k, d_out = q_ref[...], k_ref[...], do_ref[...]
        s = _dot(flash, k, q, _NT)  # [bk, bq]
        cols = j * bk + lax.broadcasted_iota(jnp.int32, (bk, 1), 0)  # keys, down
        rows = i * bq + lax.broadcasted_iota(jnp.int32, (1, bq), 1)  # queries, across
        state = _state(flash, careful, kv_state_ref, column=True)
        q_seg = None if q_seg_ref is None else q_seg_ref[...]
        kv_seg = None if kv_seg_ref is None else _column(kv_seg_ref)
        live = _allowed(plan, rows, cols, state, q_seg, kv_seg)
        p = _weights(careful, live, s, lse_ref[...])
        flags = _tile_flags(flash, sc, flags_ref, bh, i, j, True)
        kept = p if flags is None else jnp.where(flags, p, 0.0)
        dv_sc[...] += _dot(flash, kept.astype(d_out.dtype), d_out, _NN)
        v = v_ref[...] if flags is None else v_kept_sc[0][...]
        d_p = _dot(flash, v, d_out, _NT)  # [bk, bq]
        if flags is not None:
            d_p = jnp.where(flags, d_p, 0.0)
        d_s = (p * (d_p - delta_ref[...])).astype(q.dtype)
        dk_sc[...] += _dot(flash, d_s, q, _NN)
        if dq_ref is not None:  # this key tile's part of dq: d_s^T k
            dq_ref[...] = _dot(flash, d_s, k, _TN)

    visited = (i >= lo) & (i < hi)
    _when_visited(flash, sc, visited, step)
    if dq_ref is not None:

        @pl.when(jnp.logical_not(visited))
        def _no_part() -> None:
            dq_ref[...] = jnp.zeros(dq_ref.shape, dq_ref.dtype)

    @pl.when(t == pl.num_programs(2) - 1)
    def _finish() -> None:
        dk_ref[...] = dk_sc[...].astype(dk_ref.dtype)
        dv = dv_sc[...] if not flash.dropout else dv_sc[...] * sc.inverse_keep()
        dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(flash: Flash, *refs: Any) -> None:
    plan = flash.tiles
    r = _Refs.of(flash, refs, 7)
    sc, q_seg_ref, kv_seg_ref, flags_ref = r.scalars, r.q_segments, r.kv_segments, r.flags
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kv_state_ref = r.inputs
    dq_ref, dq_sc, *do_kept_sc = r.rest
    bh, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk = plan.block_q, plan.block_k

    @pl.when(j == 0)
    def _init() -> None:
        dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)
        if do_kept_sc:  # dO / keep: dP of the kept weights, scaled once a query tile
            do_kept_sc[0][...] = _scaled(do_ref, sc.inverse_keep())

    lo, hi = _key_range(plan, i, sc.key_tiles[bh // plan.heads])

    def step(careful: bool) -> None:
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        s = _dot(flash, q, k, _NT)  # [bq, bk]
        rows = i * bq + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
        cols = j * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        state = _state(flash, careful, kv_state_ref)
        q_seg = None if q_seg_ref is None else _column(q_seg_ref)
        kv_seg = None if kv_seg_ref is None else kv_seg_ref[...]
        live = _allowed(plan, rows, cols, state, q_seg, kv_seg)
        p = _weights(careful, live, s, _column(lse_ref))
        flags = _tile_flags(flash, sc, flags_ref, bh, i, j, False)
        d_out = do_ref[...] if flags is None else do_kept_sc[0][...]
        d_p = _dot(flash, d_out, v, _NT)
        if flags is not None:
            d_p = jnp.where(flags, d_p, 0.0)
        d_s = p * (d_p - _column(delta_ref))
        dq_sc[...] += _dot(flash, d_s.astype(k.dtype), k, _NN)

    _when_visited(flash, sc, (j >= lo) & (j < hi), step)

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish() -> None:
        dq_ref[...] = dq_sc[...].astype(dq_ref.dtype)


def _flags_kernel(flash: Flash, *refs: Any) -> None:
    """Draws each tile's flags once, into its words (``_flash_dropout.Bits``)."""
    plan = flash.tiles
    refs_ = list(refs)
    sc = fd.Scalars(plan, refs_, flash.place)
    (words_ref,) = refs_
    row, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    lo, hi = _flag_tiles(flash, row, i, sc.key_tiles)

    @pl.when((j >= lo) & (j < hi))
    def _draw() -> None:
        shape = (plan.block_q, plan.block_k)
        flags = fd.drawn_flags(sc, row, i * plan.block_q, j * plan.block_k, shape, False)
        words_ref[...] = flash.bits.pack(flags)


def _flag_tiles(flash: Flash, row: Any, i: Any, key_tiles: Any) -> tuple[Any, Any]:
    """The key tiles of query tile ``i`` whose flags a row of the stored flags holds:
    those some head row visits."""
    plan = flash.tiles
    if plan.broadcast_dropout:  # one mask for every batch row, whatever its padding
        return _key_range(plan, i, plan.n_k)
    return _key_range(plan, i, key_tiles[row // plan.heads])


# --- pallas_call plumbing -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The kernels' side inputs in their layouts (padded to whole tiles).

    ``q_state: int32[B*H, 1, Lq]`` and ``kv_state: int32[B*Hk, 1, Lk]`` (the states of
    ``_kernel_inputs.position_states``), segment ids ``int32[B, 1, L]`` or None, the
    stored flags (``int32[rows, n_q * tile rows, n_k * 128]``, a ``Bits.tile`` per tile)
    or None, and the scalar-prefetch operands: ``key_tiles: int32[B]`` (the key tiles up
    to each row's last valid key), ``clean: int32[1]`` (:func:`clean`), the key words
    ``int32[4]`` and a run-time threshold ``int32[2]`` (value, bits of the realised
    probability).
    """

    q_state: jax.Array
    kv_state: jax.Array
    q_segments: jax.Array | None
    kv_segments: jax.Array | None
    flags: jax.Array | None
    scalars: tuple[jax.Array, ...]


jax.tree_util.register_dataclass(
    _Inputs,
    data_fields=["q_state", "kv_state", "q_segments", "kv_segments", "flags", "scalars"],
    meta_fields=[],
)


def _call(flash: Flash, body: Any, grid, in_specs, out_specs, out_shape, scratch, name: str):
    # The last axis in order: a skipped step's index map repeats a block another step
    # of that axis visits.
    semantics = ("parallel", "parallel", "arbitrary")
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
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=semantics, vmem_limit_bytes=_VMEM_BYTES
        ),
        interpret=flash.interpret,
        name=name,
    )
    if flash.interpret:
        return call
    # Compiled kernels sit in the TPU branch of a platform switch (``_dot_product``).
    return lambda *args: tpu_only(call, *args)


class _ByQueryTile:
    """Index maps for a grid ``(batch * heads, query tiles, key tiles)`` (the forward and
    ``dq`` kernels): a query tile's blocks, and the key tile visited at each step."""

    def __init__(self, plan: bw.Plan):
        self.plan = plan

    def _key_tile(self, bh: Any, i: Any, j: Any, tiles: Any) -> Any:
        lo, hi = _key_range(self.plan, i, tiles[bh // self.plan.heads])
        return _visited(lo, hi, j, self.plan.n_k)

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


def _forward(flash: Flash, q, k, v, side: _Inputs):
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
    out_specs = [pl.BlockSpec((None, bq, dv), ix.rows), pl.BlockSpec((None, bq, _ROW), ix.rows)]
    rows = q.shape[0]
    out_shape = [
        jax.ShapeDtypeStruct((rows, q.shape[1], dv), q.dtype),
        jax.ShapeDtypeStruct((rows, q.shape[1], _ROW), jnp.float32),
    ]
    scratch = [
        pltpu.VMEM((bq, _ROW), jnp.float32),
        pltpu.VMEM((bq, _ROW), jnp.float32),
        pltpu.VMEM((bq, dv), jnp.float32),
        pltpu.VMEM((bq, _ROW), jnp.int32),
    ]
    grid = (rows, plan.n_q, plan.n_k)
    call = _call(
        flash, _forward_kernel, grid, in_specs, out_specs, out_shape, scratch, "dropmask_flash_fwd"
    )
    out, lse = call(*side.scalars, *args)
    return out, lse[:, :, 0].reshape(rows, 1, -1)


def _backward(flash: Flash, q, k, v, side: _Inputs, out, lse, d_out):
    plan = flash.tiles
    bq, bk, heads, g, n_q = plan.block_q, plan.block_k, plan.heads, plan.groups, plan.n_q
    depth, dv = q.shape[-1], v.shape[-1]
    tainted = (lse == jnp.inf).reshape(lse.shape[0], -1, 1)
    d_out = jnp.where(tainted, 0, d_out).astype(q.dtype)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    delta = delta.reshape(lse.shape)  # rowsum(dO * O) = rowsum(P * dP), [B*H, 1, Lq]

    # dk, dv: grid (B*Hk, key tiles, groups * query tiles).
    def q_tile(bkv, j, t, tiles, *_):
        lo, hi = _query_range(plan, j, tiles[bkv // plan.kv_heads])
        return bkv * g + t // n_q, _visited(lo, hi, t % n_q, n_q)

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
    flash = dataclasses.replace(flash, fused_dq=fuses_dq(plan, q, k, v, d_out))
    if flash.fused_dq:  # each step's part: key tile j's, of query tile t % n_q of a head
        out_specs.append(
            pl.BlockSpec(
                (None, None, bq, depth), lambda bkv, j, t, *_: (j, bkv * g + t // n_q, t % n_q, 0)
            )
        )
        out_shape.append(jax.ShapeDtypeStruct((plan.n_k, *q.shape), jnp.float32))
    scratch = [pltpu.VMEM((bk, depth), jnp.float32), pltpu.VMEM((bk, dv), jnp.float32)]
    if flash.dropout:
        scratch.append(pltpu.VMEM((bk, dv), v.dtype))
    grid = (k.shape[0], plan.n_k, g * n_q)
    d_k, d_v, *parts = _call(
        flash, _dkdv_kernel, grid, in_specs, out_specs, out_shape, scratch, "dropmask_flash_dkdv"
    )(*side.scalars, *args)
    if parts:
        return jnp.sum(parts[0], axis=0).astype(q.dtype), d_k, d_v
    return _dq(flash, q, k, v, side, args), d_k, d_v


def fuses_dq(plan: bw.Plan, *operands: jax.Array) -> bool:
    """Whether the ``dk``/``dv`` kernel computes ``dq`` too, as a part per key tile
    (``float32``) that XLA sums: where the parts take at most twice what ``q``, ``k``,
    ``v`` and ``dO`` (``operands``) take, so a few key tiles (4 of bfloat16 at equal
    depths). It saves the ``dq`` kernel's second pass over the scores (their
    exponentials, the dropout flags) for one more product a step and the parts' memory:
    on a v5e, forward and backward at [1, 4096, 8, 128] (4 key tiles) took 2.44 ms
    against 2.63, for 27 MiB of parts; with more key tiles the ``dq`` kernel runs."""
    parts = plan.n_k * operands[0].size * 4
    return parts <= 2 * sum(x.size * x.dtype.itemsize for x in operands)


def _dq(flash: Flash, q, k, v, side: _Inputs, args: list[Any]) -> jax.Array:
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
    if flash.dropout:
        scratch.append(pltpu.VMEM((bq, dv), q.dtype))
    grid = (q.shape[0], plan.n_q, plan.n_k)
    (d_q,) = _call(
        flash,
        _dq_kernel,
        grid,
        in_specs,
        out_specs,
        [jax.ShapeDtypeStruct(q.shape, q.dtype)],
        scratch,
        "dropmask_flash_dq",
    )(*side.scalars, *args)
    return d_q


def _draw_flags(flash: Flash, rows: int, scalars: tuple[jax.Array, ...]) -> jax.Array:
    """The stored flags of ``rows`` rows of heads (1: one mask for all), drawn by
    ``_flags_kernel``: ``int32[rows, n_q * tile rows, n_k * 128]``."""
    plan = flash.tiles
    tile_rows, tile_cols = flash.bits.tile

    def index(row: Any, i: Any, j: Any, tiles: Any, *_: Any) -> tuple[Any, ...]:
        lo, hi = _flag_tiles(flash, row, i, tiles)
        return (row, i, _visited(lo, hi, j, plan.n_k))

    shape = (rows, plan.n_q * tile_rows, plan.n_k * tile_cols)
    (words,) = _call(
        flash,
        _flags_kernel,
        (rows, plan.n_q, plan.n_k),
        [],
        [pl.BlockSpec((None, tile_rows, tile_cols), index)],
        [jax.ShapeDtypeStruct(shape, jnp.int32)],
        [],
        "dropmask_flash_flags",
    )(*scalars)
    return words


def _attend_impl(flash: Flash, q, k, v, side: _Inputs):
    out, lse = _forward(flash, q, k, v, side)
    return out, lse


def _attend_fwd(flash: Flash, q, k, v, side: _Inputs):
    out, lse = _forward(flash, q, k, v, side)
    return (out, lse), (q, k, v, side, out, lse)


def _attend_bwd(flash: Flash, residuals, cotangents):
    q, k, v, side, out, lse = residuals
    d_out, _ = cotangents
    d_q, d_k, d_v = _backward(flash, q, k, v, side, out, lse, d_out)
    return d_q, d_k, d_v, jax.tree.map(lambda _: None, side)


_attend = jax.custom_vjp(_attend_impl, nondiff_argnums=(0,))
_attend.defvjp(_attend_fwd, _attend_bwd)


# --- the entry point ------------------------------------------------------------------


# A score of magnitude at most this is finite however a dot product's sums round.
_SAFE_SCORE = float(np.finfo(np.float32).max) / 4


def clean(q: jax.Array, k: jax.Array, inputs: ki.KernelInputs) -> jax.Array:
    """``int32[1]``: 1 where no input entry was non-finite and no score can overflow
    (``depth * max|q| * max|k|`` bounds every score), so every score is finite and the
    kernels skip the non-finite convention's checks; 0 otherwise, where they make
    them. One read of ``q`` and ``k`` (sanitised), no gradient."""
    q, k = lax.stop_gradient(q), lax.stop_gradient(k)
    finite = ~(jnp.any(inputs.bad_q) | jnp.any(inputs.bad_kv))
    q_max = jnp.max(jnp.abs(q)).astype(jnp.float32)
    k_max = jnp.max(jnp.abs(k)).astype(jnp.float32)
    bounded = q_max * k_max * q.shape[-1] <= _SAFE_SCORE
    return (finite & bounded).astype(jnp.int32).reshape(1)


def _pad_to(x: jax.Array, axis: int, size: int) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, size - d if a == axis else 0) for a, d in enumerate(x.shape)]
    return jnp.pad(x, widths)


def flash_attention(
    flash: Flash,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    inputs: ki.KernelInputs,
) -> tuple[jax.Array, jax.Array]:
    """Attention of ``q: [*batch, Lq, H, D]`` over ``k``, ``v``: ``[*batch, Lk, Hk, D]``,
    as ``_pallas.pallas_attention`` (which see) without a dense ``mask``.

    Returns:
      The output ``[*batch, Lq, H, Dv]`` with tainted rows 0, and the taint
      ``bool[*batch, H, Lq, 1]``.
    """
    flash, q3, k3, v3, side = prepare(flash, q, k, v, inputs)
    out, lse = _attend(flash, q3, k3, v3, side)
    return finish(flash, out, lse)


def rows_first(plan: bw.Plan, x: jax.Array, length: int, h: int, padded: int) -> jax.Array:
    """``x: [*batch, length, h, d]`` as ``[B * h, padded, d]``, the kernels' rows."""
    bsz = math.prod(plan.batch)
    x = x.reshape(bsz, length, h, x.shape[-1]).transpose(0, 2, 1, 3)
    return _pad_to(x.reshape(bsz * h, length, x.shape[-1]), 1, padded)


def prepare(
    flash: Flash,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    inputs: ki.KernelInputs,
    offsets: jax.Array | None = None,
) -> tuple[Flash, jax.Array, jax.Array, jax.Array, _Inputs]:
    """The kernels' operands: ``q``, ``k``, ``v`` as rows of heads (padded to whole
    tiles), the side inputs, and ``flash`` completed (whether the flags are stored,
    whether keys are padded). ``offsets``: where the call is one device's block of a
    larger one (``flash.place``), the block's first batch index per batch axis and its
    first head, which follow the key words."""
    plan = flash.tiles
    bsz = math.prod(plan.batch)
    heads, hk = plan.heads, plan.kv_heads
    lq, lk = plan.n_q * plan.block_q, plan.n_k * plan.block_k
    depth, v_depth = q.shape[-1], v.shape[-1]
    q3 = rows_first(plan, q, plan.q_len, heads, lq)
    k3 = rows_first(plan, k, plan.kv_len, hk, lk)
    v3 = rows_first(plan, v, plan.kv_len, hk, lk)

    q_state, kv_state = ki.position_states(plan, inputs)
    key_tiles = ki.key_tiles(kv_state, plan.block_k)
    kv_state = _pad_to(kv_state.reshape(bsz * hk, 1, plan.kv_len), 2, lk)
    q_state = _pad_to(q_state.reshape(bsz * heads, 1, plan.q_len), 2, lq)

    def segments(ids: jax.Array | None, length: int, padded: int) -> jax.Array | None:
        if ids is None:
            return None
        ids = jnp.broadcast_to(ids, (*plan.batch, length)).reshape(bsz, 1, length)
        return _pad_to(ids.astype(jnp.int32), 2, padded)

    scalars: list[jax.Array] = [key_tiles.astype(jnp.int32), clean(q3, k3, inputs)]
    if flash.dropout:
        rows = 1 if plan.broadcast_dropout else bsz * heads
        if flash.place is not None:
            rows = flash.place.rows
        check_word_count((rows, plan.q_len, -(-plan.kv_len // LANES)))
        words = lax.bitcast_convert_type(key_words(inputs.key), jnp.int32)
        if flash.place is not None:
            assert offsets is not None
            words = jnp.concatenate([words, offsets.astype(jnp.int32)])
        scalars.append(words)
    if flash.run_time_rate:
        thr = threshold(inputs.run_time_keep)
        realised = jnp.asarray(thr.realised, jnp.float32)
        scalars.append(
            jnp.stack(
                [
                    jnp.asarray(thr.value).astype(jnp.int32),
                    lax.bitcast_convert_type(realised, jnp.int32),
                ]
            )
        )
    flag_rows = 1 if plan.broadcast_dropout else bsz * heads
    out_bytes = q.size // depth * v_depth * q.dtype.itemsize
    budget = sum(x.size * x.dtype.itemsize for x in (q, k, v)) + out_bytes
    flash = dataclasses.replace(
        flash,
        stored=fd.stores(plan, flash.interpret, flag_rows, budget),
        key_padding=inputs.kv_valid is not None or lk != plan.kv_len,
    )
    side = _Inputs(
        q_state=q_state,
        kv_state=kv_state,
        q_segments=segments(inputs.q_segments, plan.q_len, lq),
        kv_segments=segments(inputs.kv_segments, plan.kv_len, lk),
        flags=_draw_flags(flash, flag_rows, tuple(scalars)) if flash.stored else None,
        scalars=tuple(scalars),
    )
    return flash, q3, k3, v3, side


def finish(flash: Flash, out: jax.Array, lse: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The kernels' output rows as ``[*batch, Lq, H, Dv]``, and the taint."""
    plan = flash.tiles
    bsz, heads = math.prod(plan.batch), plan.heads
    v_depth = out.shape[-1]
    out = out[:, : plan.q_len].reshape(bsz, heads, plan.q_len, v_depth).transpose(0, 2, 1, 3)
    out = out.reshape(*plan.batch, plan.q_len, heads, v_depth)
    taint = lse[:, 0, : plan.q_len] == jnp.inf
    return out, taint.reshape(*plan.batch, heads, plan.q_len, 1)
