"""The TPU attention kernels' bodies: forward, ``dk``/``dv``, ``dq`` and the flags kernel,
each run by ``_flash_tpu_calls`` over its grid (``_flash_tpu``'s docstring describes
them)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from . import _blockwise as bw
from . import _flash_dropout as fd
from . import _kernel_inputs as ki
from ._flash_tpu_plan import NN, NT, ROW, TN, Flash, flag_tiles, key_range, query_range
from ._flash_tpu_plan import visited as visited_tile

__all__ = ["dkdv_kernel", "dq_kernel", "flags_kernel", "forward_kernel"]


def _dot(flash: Flash, a: jax.Array, b: jax.Array, dims: Any) -> jax.Array:
    """A product in float32; of float32 operands at the call's precision (bfloat16
    operands are exact in one pass). Named either way: a precision of None would take a
    user's ``jax.default_matmul_precision`` inside the kernel, where "highest" asks
    Mosaic for a float32 contraction of bfloat16 operands, which it refuses."""
    f32 = jnp.dtype(jnp.float32)
    exact = flash.precision == lax.Precision.HIGHEST and a.dtype == f32 and b.dtype == f32
    precision = lax.Precision.HIGHEST if exact else lax.Precision.DEFAULT
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
    flash: Flash,
    sc: fd.Scalars,
    flags_ref: Any,
    bh: Any,
    i: Any,
    j: Any,
    transposed: bool,
    keys: slice | None = None,
    queries: slice | None = None,
) -> jax.Array | None:
    """The keep-flags of tile ``(i, j)`` of head row ``bh`` (of its keys ``keys`` and
    queries ``queries`` alone where given): unpacked from the stored bits, or drawn;
    None without dropout."""
    if not flash.dropout:
        return None
    if flags_ref is not None:
        return flash.bits.unpack(flags_ref[...], transposed, keys, queries)
    plan = flash.tiles
    keys = slice(0, plan.block_k) if keys is None else keys
    queries = slice(0, plan.block_q) if queries is None else queries
    row0, col0 = i * plan.block_q + queries.start, j * plan.block_k + keys.start
    shape = (queries.stop - queries.start, keys.stop - keys.start)
    return fd.drawn_flags(sc, bh, row0, col0, shape, transposed)


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


def _when_visited(flash: Flash, sc: fd.Scalars, visited: Any, step: Any) -> None:
    """Runs ``step(careful)`` on a visited tile: ``careful=False`` in a clean call (see
    ``clean``), whose scores are all finite, so the tile skips the non-finite checks
    (about half the vector work of a step); ``careful=True`` otherwise."""
    clean = sc.clean[0] != 0
    pl.when(visited & clean)(functools.partial(step, False))
    pl.when(visited & jnp.logical_not(clean))(functools.partial(step, True))


def _state(flash: Flash, careful: bool, ref: Any, column: bool = False, keys: Any = None) -> Any:
    """The key states a tile masks by (of its keys ``keys`` alone where given): None
    (every key valid) in a clean call without key padding."""
    if not (careful or flash.key_padding):
        return None
    return _column(ref) if column else ref[...] if keys is None else ref[:, keys]


def forward_kernel(flash: Flash, *refs: Any) -> None:
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

    lo, hi = key_range(plan, i, sc.key_tiles[bh // plan.heads])

    def piece(careful: bool, q: jax.Array, keys: slice) -> None:
        """The online softmax over the tile's keys ``keys``."""
        width = keys.stop - keys.start
        s = _dot(flash, q, k_ref[keys, :], NT)  # [bq, width]
        rows = i * bq + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
        cols = j * bk + keys.start + lax.broadcasted_iota(jnp.int32, (1, width), 1)
        state = _state(flash, careful, kv_state_ref, keys=keys)  # [1, width]
        q_seg = None if q_seg_ref is None else _column(q_seg_ref)
        kv_seg = None if kv_seg_ref is None else kv_seg_ref[:, keys]
        ok = _allowed(plan, rows, cols, state, q_seg, kv_seg)
        if careful:
            bad = _nonfinite(s) | (state == ki.NONFINITE)
            bad_q = _column(q_state_ref) != 0
            seen = jnp.max(jnp.where(ok & (bad | bad_q), 1, 0), axis=1, keepdims=True)
            taint_sc[...] = jnp.maximum(taint_sc[...], seen)
            ok = ok & ~bad
        s = jnp.where(ok, s, -jnp.inf)
        # The running maximum and sum stay [bq, ROW] (a row's value in every lane), and
        # the maximum meets the scores as whole registers tiled along the keys, not as
        # a column broadcast lane by lane: with the weights' product below, on a v5e
        # (bf16 causal [1, 8192, 8, 128]) the forward took 2.44 ms against 2.69.
        m = m_sc[...]
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(jnp.where(m == -jnp.inf, -jnp.inf, m - shift))
        p = jnp.exp(s - jnp.tile(shift, (1, width // ROW)))
        m_sc[...] = m_new
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
        alpha = _lanes(alpha, acc_sc.shape[-1])
        flags = _tile_flags(flash, sc, flags_ref, bh, i, j, False, keys)
        if flags is not None:
            p = jnp.where(flags, p, 0.0)
        v = v_ref[keys, :]
        if flash.consistent:  # see ``consistent``
            v = v if not flash.dropout else _scaled(v, sc.inverse_keep())
            high = _bfloat16_high(p)
            acc_sc[...] = (
                alpha * acc_sc[...] + _dot(flash, high, v, NN) + _dot(flash, p - high, v, NN)
            )
        elif v.dtype == jnp.float32:
            acc_sc[...] = alpha * acc_sc[...] + _dot(flash, p, v, NN)
        else:  # p stays float32, v is widened (not p's tile narrowed): one pass rounds
            v = v.astype(jnp.float32)  # both as they enter the matrix unit
            pv = lax.dot_general(
                p, v, NN, precision=lax.Precision.DEFAULT, preferred_element_type=jnp.float32
            )
            acc_sc[...] = alpha * acc_sc[...] + pv

    def step(careful: bool) -> None:
        q = q_ref[...]
        for first in range(0, bk, flash.chunk):  # in pieces (``FORWARD_CHUNK``)
            piece(careful, q, slice(first, first + flash.chunk))

    _when_visited(flash, sc, (j >= lo) & (j < hi), step)

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish() -> None:
        total = l_sc[...][:, :1]
        tainted = taint_sc[...][:, :1] != 0
        empty = (total == 0) | tainted
        safe = jnp.where(empty, 1.0, total)
        scaled = flash.dropout and not flash.consistent  # else v was, in each step
        norm = sc.inverse_keep() / safe if scaled else 1 / safe
        o_ref[...] = jnp.where(empty, 0.0, acc_sc[...] * norm).astype(o_ref.dtype)
        lse = jnp.where(tainted, jnp.inf, jnp.where(empty, 0.0, m_sc[...][:, :1] + jnp.log(safe)))
        lse_ref[...] = jnp.broadcast_to(lse, lse_ref.shape)


def _lanes(x: jax.Array, width: int) -> jax.Array:
    """A ``[rows, ROW]`` value of equal lanes as ``[rows, width]``."""
    return jnp.tile(x, (1, -(-width // ROW)))[:, :width]


def _bfloat16_high(x: jax.Array) -> jax.Array:
    """float32 ``x`` with its mantissa cut to bfloat16's 7 bits (exact in bfloat16; ``x``
    minus it is exact in float32)."""
    bits = lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(-(2**16))
    return lax.bitcast_convert_type(bits, jnp.float32)


def _weights(careful: bool, live: Any, s: jax.Array, lse: jax.Array) -> jax.Array:
    """The backward kernels' softmax weights ``exp(s - lse)`` where ``live``, 0 elsewhere.
    A careful step takes only finite scores as live (a tainted row's log-sum-exp is
    +inf, so its weights are 0 too)."""
    if careful:
        live = live & ~_nonfinite(s)
        s = jnp.where(live, s, 0.0)
    return jnp.where(live, jnp.exp(s - lse), 0.0)


def _scaled(x: jax.Array, by: Any) -> jax.Array:
    """A tile ``x`` multiplied by ``by``, in the tile's dtype."""
    return (x.astype(jnp.float32) * by).astype(x.dtype)


def dkdv_kernel(flash: Flash, *refs: Any) -> None:
    plan = flash.tiles
    r = _Refs.of(flash, refs, 7)
    sc, q_seg_ref, kv_seg_ref, flags_ref = r.scalars, r.q_segments, r.kv_segments, r.flags
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kv_state_ref = r.inputs
    if flash.fused_dq:  # the zeros dq is aliased to, dq, and its accumulator
        _, dk_ref, dv_ref, dq_ref, dk_sc, dv_sc, dq_sc, *v_kept_sc = r.rest
    else:
        dk_ref, dv_ref, dk_sc, dv_sc, *v_kept_sc = r.rest
        dq_ref = dq_sc = None
    bkv, j, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk, g = plan.block_q, plan.block_k, plan.groups
    n_q = plan.n_q
    group, i = t // n_q, t % n_q
    b = bkv // plan.kv_heads
    bh = bkv * g + group  # b * heads + (bkv % kv_heads) * groups + group

    if dq_sc is not None:

        @pl.when((j == 0) & (t == 0))
        def _new_heads() -> None:
            dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

    @pl.when(t == 0)
    def _init() -> None:
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)
        if v_kept_sc:  # v / keep: dP of the kept weights, scaled once a key tile
            v_kept_sc[0][...] = _scaled(v_ref[...], sc.inverse_keep())

    lo, hi = query_range(plan, j, sc.key_tiles[b])

    def piece(careful: bool, k: jax.Array, queries: slice) -> None:
        """The tile's part from its queries ``queries``."""
        width = queries.stop - queries.start
        q, d_out = q_ref[queries, :], do_ref[queries, :]
        s = _dot(flash, k, q, NT)  # [bk, width]
        cols = j * bk + lax.broadcasted_iota(jnp.int32, (bk, 1), 0)  # keys, down
        rows = i * bq + queries.start + lax.broadcasted_iota(jnp.int32, (1, width), 1)
        state = _state(flash, careful, kv_state_ref, column=True)
        q_seg = None if q_seg_ref is None else q_seg_ref[:, queries]
        kv_seg = None if kv_seg_ref is None else _column(kv_seg_ref)
        live = _allowed(plan, rows, cols, state, q_seg, kv_seg)
        p = _weights(careful, live, s, lse_ref[:, queries])
        flags = _tile_flags(flash, sc, flags_ref, bh, i, j, True, queries=queries)
        kept = p if flags is None else jnp.where(flags, p, 0.0)
        dv_sc[...] += _dot(flash, kept.astype(d_out.dtype), d_out, NN)
        v = v_ref[...] if flags is None else v_kept_sc[0][...]
        d_p = _dot(flash, v, d_out, NT)  # [bk, width]
        if flags is not None:
            d_p = jnp.where(flags, d_p, 0.0)
        d_s = (p * (d_p - delta_ref[:, queries])).astype(q.dtype)
        dk_sc[...] += _dot(flash, d_s, q, NN)
        if dq_sc is not None:  # this key tile's part of dq: d_s^T k
            at = pl.ds(pl.multiple_of(i * bq + queries.start, width), width)
            dq_sc[group, at, :] += _dot(flash, d_s, k, TN)

    def step(careful: bool) -> None:
        k = k_ref[...]
        for first in range(0, bq, flash.backward_chunk):  # in pieces (``BACKWARD_CHUNK``)
            piece(careful, k, slice(first, first + flash.backward_chunk))

    _when_visited(flash, sc, (i >= lo) & (i < hi), step)
    if dq_ref is not None and dq_sc is not None:  # the tile the index map names, as summed
        shown = pl.multiple_of(visited_tile(lo, hi, i, n_q) * bq, bq)
        dq_ref[...] = dq_sc[group, pl.ds(shown, bq), :].astype(dq_ref.dtype)

    @pl.when(t == pl.num_programs(2) - 1)
    def _finish() -> None:
        dk_ref[...] = dk_sc[...].astype(dk_ref.dtype)
        dv = dv_sc[...] if not flash.dropout else dv_sc[...] * sc.inverse_keep()
        dv_ref[...] = dv.astype(dv_ref.dtype)


def dq_kernel(flash: Flash, *refs: Any) -> None:
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
            do_kept_sc[0][...] = _scaled(do_ref[...], sc.inverse_keep())

    lo, hi = key_range(plan, i, sc.key_tiles[bh // plan.heads])

    def step(careful: bool) -> None:
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        s = _dot(flash, q, k, NT)  # [bq, bk]
        rows = i * bq + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
        cols = j * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        state = _state(flash, careful, kv_state_ref)
        q_seg = None if q_seg_ref is None else _column(q_seg_ref)
        kv_seg = None if kv_seg_ref is None else kv_seg_ref[...]
        live = _allowed(plan, rows, cols, state, q_seg, kv_seg)
        p = _weights(careful, live, s, _column(lse_ref))
        flags = _tile_flags(flash, sc, flags_ref, bh, i, j, False)
        if flags is None:
            d_p = _dot(flash, do_ref[...], v, NT)
        elif flash.consistent:  # dP with v / keep, as the dk/dv kernel's (``consistent``)
            d_p = _dot(flash, do_ref[...], _scaled(v_ref[...], sc.inverse_keep()), NT)
        else:
            d_p = _dot(flash, do_kept_sc[0][...], v, NT)
        if flags is not None:
            d_p = jnp.where(flags, d_p, 0.0)
        d_s = p * (d_p - _column(delta_ref))
        dq_sc[...] += _dot(flash, d_s.astype(k.dtype), k, NN)

    _when_visited(flash, sc, (j >= lo) & (j < hi), step)

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish() -> None:
        dq_ref[...] = dq_sc[...].astype(dq_ref.dtype)


def flags_kernel(flash: Flash, *refs: Any) -> None:
    """Draws each tile's flags once, into its words (``_flash_dropout.Bits``)."""
    plan = flash.tiles
    refs_ = list(refs)
    sc = fd.Scalars(plan, refs_, flash.place)
    (words_ref,) = refs_
    row, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    lo, hi = flag_tiles(flash, row, i, sc.key_tiles)

    @pl.when((j >= lo) & (j < hi))
    def _draw() -> None:
        shape = (plan.block_q, plan.block_k)
        flags = fd.drawn_flags(sc, row, i * plan.block_q, j * plan.block_k, shape, False)
        words_ref[...] = flash.bits.pack(flags)
