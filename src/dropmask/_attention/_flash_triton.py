"""FlashAttention-2 as Pallas kernels, with the dense path's dropout mask drawn inside.

Three kernels, tied with a ``jax.custom_vjp``:

* forward: a program per (query tile, batch, head) loops over the key tiles the
  window structure leaves (causal attention stops at the diagonal), keeps a running
  maximum, sum and unnormalised output per row, and writes the output, one
  log-sum-exp per row and the row's taint (it saw a non-finite input or score);
* backward, ``dk``/``dv``: a program per (key tile, batch, head) loops over the query
  tiles that may see it;
* backward, ``dq``: a program per (query tile, batch, head) loops over key tiles.

The backward kernels recompute each tile's scores and dropout flags; nothing of size
``[q_len, kv_len]`` is stored. The tile geometry, masks and taint rules are those of
``_blockwise`` (a :class:`~dropmask._attention._blockwise.Plan` describes
the call), so both paths compute the same function.

Dropout. Each kernel computes its tile's keep-flags from the four key words and the
tile's global position (``_random._tile_mask``): they are the dense path's flags element by
element, drawn again in the backward pass, never stored. A Python-number rate is
compiled into the kernels; a JAX scalar arrives as an input (one compilation for every
rate). A dense boolean ``mask`` is read a tile at a time; key tiles past a batch row's
last valid key are not visited.

Inputs are padded to whole tiles (and depths to a power of two of at least 16, as
Triton's matrix units need); padding keys are invalid and padding queries discarded.
Off a GPU the kernels run in Pallas's interpreter (``interpret=True``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .._random import Threshold, key_words, threshold, tile_keep_flags
from . import _blockwise as bw
from . import _kernel_inputs as ki

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_Q",
    "Kernel",
    "mask_dims",
    "pallas_attention",
]

# Tile sizes until measured on a GPU: a key tile of 32 is one mask word per row, the
# cheapest flags; JAX's own Pallas kernel takes 32 x 32 for its backward pass.
DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 32


@dataclasses.dataclass(frozen=True)
class Kernel:
    """Everything static about one call of the kernels.

    Attributes:
      tiles: the call's geometry, structure and dropout (as for the blockwise path);
        ``tiles.keep`` is the keep probability when static (None for a run-time one).
      segments: whether segment ids are given.
      interpret: run the kernels in Pallas's interpreter (off a GPU).
      mask_dims: for a dense ``mask``, which of its (batch, head, query, key) axes are
        whole (the others broadcast); None without one.
      num_warps, num_stages: Triton's launch parameters (GPU only).
    """

    tiles: bw.Plan
    segments: bool
    interpret: bool
    mask_dims: tuple[bool, bool, bool, bool] | None = None
    num_warps: int = 4
    num_stages: int = 2

    @property
    def dropout(self) -> bool:
        return self.tiles.dropout

    @property
    def run_time_rate(self) -> bool:
        return self.tiles.run_time_rate


class _Dropout(NamedTuple):
    """Inside a kernel: the four key words (``uint32`` scalars) and the threshold."""

    words: list[jax.Array]
    threshold: Threshold


class _Inputs(NamedTuple):
    """The kernels' side inputs, each padded to whole tiles; None where absent.

    ``q_state: int32[B, H, Lq]`` (1 where the query holds a non-finite entry),
    ``kv_state: int32[B, Hk, Lk]`` (0 padding, ``VALID``, or ``NONFINITE`` for a
    valid key whose key or value holds one), segment ids ``int32[B, L]``, the four
    Threefry key words ``uint32[4]`` and, for a run-time rate, ``float32[2]``: the
    threshold's value and the probability it realises, and a dense mask as ``int8``
    ``[B|1, H|1, Lq|1, Lk|1]`` (nonzero = may attend); ``key_tiles: int32[B]``, the
    key tiles up to the last valid key (the loops stop there: padding costs nothing).
    """

    q_state: jax.Array
    kv_state: jax.Array
    q_segments: jax.Array | None
    kv_segments: jax.Array | None
    words: jax.Array | None
    rate: jax.Array | None
    mask: jax.Array | None
    key_tiles: jax.Array


def _dropout(kernel: Kernel, words_ref: Any, rate_ref: Any) -> _Dropout | None:
    if words_ref is None:
        return None
    words = [words_ref[t] for t in range(4)]
    if rate_ref is None:
        assert kernel.tiles.keep is not None
        return _Dropout(words, threshold(kernel.tiles.keep))
    return _Dropout(words, Threshold(rate_ref[0].astype(jnp.uint32), rate_ref[1]))


def _kept_scale(kernel: Kernel, dropout: _Dropout | None, bh: Any, rows: Any, col0: Any) -> Any:
    """``1/realised`` where kept, 0 where dropped (``[bq, bk]``), or None without dropout;
    NaN everywhere for a run-time rate outside [0, 1], as on the dense path."""
    if dropout is None:
        return None
    thr = dropout.threshold
    flags = tile_keep_flags(kernel.tiles, thr, dropout.words, bh, rows, col0)
    acc = kernel.tiles.accumulate
    if isinstance(thr.realised, float):
        scale = 1.0 / thr.realised if thr.realised > 0 else 0.0  # rate 1 keeps nothing
        return jnp.where(flags, jnp.asarray(scale, acc), jnp.zeros((), acc))
    # _dropout's scale and fill, NaN for an invalid rate through ``realised * 0``:
    # Triton's lowering takes no NaN literal.
    realised = thr.realised.astype(acc)
    nan_or_zero = realised * 0
    positive = realised > 0
    scale = jnp.where(positive, 1 / jnp.where(positive, realised, 1), 0) + nan_or_zero
    return jnp.where(flags, scale, nan_or_zero)


# --- the tile computations ------------------------------------------------------------


def _dot(a: jax.Array, b: jax.Array, contract: tuple[int, int], plan: bw.Plan) -> jax.Array:
    return lax.dot_general(
        a,
        b,
        (((contract[0],), (contract[1],)), ((), ())),
        precision=plan.precision,
        preferred_element_type=plan.accumulate,
    )


def _allowed(plan: bw.Plan, rows, cols, state, q_seg, kv_seg, mask) -> jax.Array:
    """``bool[bq, bk]``: where the tile's queries may attend (structure, padding, mask)."""
    ok = (state != 0)[None, :]
    if mask is not None:
        ok = ok & (mask != 0)
    if plan.left is not None:
        ok = ok & (cols[None, :] >= rows[:, None] - plan.left)
    if plan.right is not None:
        ok = ok & (cols[None, :] <= rows[:, None] + plan.right)
    if q_seg is not None:
        ok = ok & (q_seg[:, None] == kv_seg[None, :]) & (q_seg != 0)[:, None]
    return jnp.broadcast_to(ok, (plan.block_q, plan.block_k))


def _nonfinite(s: jax.Array) -> jax.Array:
    # -inf too: an allowed score is -inf only by overflow (see the blockwise path).
    return jnp.isnan(s) | (jnp.abs(s) == jnp.inf)


def _row_max(x: jax.Array) -> jax.Array:
    """``any`` along the last axis of a boolean ``x``, as an int32 max (Triton reduces it)."""
    return jnp.max(x.astype(jnp.int32), axis=-1)


def _side_refs(kernel: Kernel, rest: list[Any]) -> tuple[Any, Any, Any, Any, _Dropout | None]:
    """Pops the side inputs off ``rest`` in :func:`_side_specs`'s order."""
    key_tiles = rest.pop(0)[0]
    q_seg_ref, kv_seg_ref = (rest.pop(0), rest.pop(0)) if kernel.segments else (None, None)
    mask_ref = rest.pop(0) if kernel.mask_dims is not None else None
    words_ref = rest.pop(0) if kernel.dropout else None
    rate_ref = rest.pop(0) if kernel.run_time_rate else None
    return key_tiles, q_seg_ref, kv_seg_ref, mask_ref, _dropout(kernel, words_ref, rate_ref)


def _mask_tile(kernel: Kernel, mask_ref: Any, rows: Any, cols: Any) -> jax.Array | None:
    """The mask's ``[bq|1, bk|1]`` tile: ``rows`` / ``cols`` slice a whole axis of the
    block (None where the block already is the tile); broadcast axes are read whole."""
    if mask_ref is None:
        return None
    assert kernel.mask_dims is not None
    _, _, q_whole, k_whole = kernel.mask_dims
    every = slice(None)
    row_slice = rows if q_whole and rows is not None else every
    return mask_ref[row_slice, cols if k_whole and cols is not None else every]


def _forward_kernel(kernel: Kernel, *refs: Any) -> None:
    plan = kernel.tiles
    q_ref, k_ref, v_ref, q_state_ref, kv_state_ref, *rest = refs
    key_tiles, q_seg_ref, kv_seg_ref, mask_ref, dropout = _side_refs(kernel, rest)
    out_ref, lse_ref, taint_ref = rest
    i, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk, acc_dtype = plan.block_q, plan.block_k, plan.accumulate
    q = q_ref[...]
    rows = i * bq + lax.iota(jnp.int32, bq)
    q_seg = None if q_seg_ref is None else q_seg_ref[...]
    # A non-finite query taints its row only if the row may attend to some key.
    bad_q = (q_state_ref[...] != 0)[:, None]

    def body(j, carry):
        m, total, acc, taint = carry
        start = j * bk
        k = k_ref[pl.ds(start, bk), :]
        v = v_ref[pl.ds(start, bk), :]
        cols = start + lax.iota(jnp.int32, bk)
        state = kv_state_ref[pl.ds(start, bk)]
        kv_seg = None if kv_seg_ref is None else kv_seg_ref[pl.ds(start, bk)]
        s = _dot(q, k, (1, 1), plan)
        mask = _mask_tile(kernel, mask_ref, None, pl.ds(start, bk))
        ok = _allowed(plan, rows, cols, state, q_seg, kv_seg, mask)
        bad = _nonfinite(s) | (state == ki.NONFINITE)[None, :]
        taint = jnp.maximum(taint, _row_max(ok & (bad | bad_q)))
        s = jnp.where(ok & ~bad, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(jnp.where(m == -jnp.inf, -jnp.inf, m - shift))
        p = jnp.exp(s - shift[:, None])
        total = alpha * total + jnp.sum(p, axis=-1)
        scale = _kept_scale(kernel, dropout, b * plan.heads + h, rows, start)
        if scale is not None:
            p = p * scale
        acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v, (1, 0), plan)
        return m_new, total, acc, taint

    init = (
        jnp.full((bq,), -jnp.inf, acc_dtype),
        jnp.zeros((bq,), acc_dtype),
        jnp.zeros((bq, v_ref.shape[-1]), acc_dtype),
        jnp.zeros((bq,), jnp.int32),
    )
    lo, hi = bw.key_block_bounds(plan, i)
    hi = jnp.minimum(hi, key_tiles)
    m, total, acc, taint = lax.fori_loop(lo, hi, body, init)
    empty = (total == 0) | (taint != 0)
    safe = jnp.where(empty, 1.0, total)
    out_ref[...] = jnp.where(empty[:, None], 0.0, acc / safe[:, None]).astype(out_ref.dtype)
    lse_ref[...] = jnp.where(empty, 0.0, m + jnp.log(safe))
    taint_ref[...] = taint


def _probabilities(
    kernel: Kernel, dropout, bh, q, k, rows, col0, state, q_seg, kv_seg, mask, lse, taint
):
    """A tile's softmax probabilities ``p`` (0 where dead or tainted) and dropout scale."""
    plan = kernel.tiles
    cols = col0 + lax.iota(jnp.int32, plan.block_k)
    s = _dot(q, k, (1, 1), plan)
    ok = _allowed(plan, rows, cols, state, q_seg, kv_seg, mask)
    live = ok & (taint == 0)[:, None] & ~_nonfinite(s)
    p = jnp.where(live, jnp.exp(jnp.where(live, s, 0.0) - lse[:, None]), 0.0)
    return p, _kept_scale(kernel, dropout, bh, rows, col0)


def _backward_refs(kernel: Kernel, refs: tuple[Any, ...]):
    (q_ref, k_ref, v_ref, d_out_ref, lse_ref, delta_ref, taint_ref, kv_state_ref, *rest) = refs
    ins = (q_ref, k_ref, v_ref, d_out_ref, lse_ref, delta_ref, taint_ref, kv_state_ref)
    return ins, _side_refs(kernel, rest), rest


def _dkdv_kernel(kernel: Kernel, *refs: Any) -> None:
    plan = kernel.tiles
    ins, side, (dk_ref, dv_ref) = _backward_refs(kernel, refs)
    key_tiles, q_seg_ref, kv_seg_ref, mask_ref, dropout = side
    q_ref, k_ref, v_ref, d_out_ref, lse_ref, delta_ref, taint_ref, kv_state_ref = ins
    j, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk = plan.block_q, plan.block_k
    k, v = k_ref[...], v_ref[...]
    state = kv_state_ref[...]
    kv_seg = None if kv_seg_ref is None else kv_seg_ref[...]

    def body(i, carry):
        dk, dv = carry
        rows_slice = pl.ds(i * bq, bq)
        q = q_ref[rows_slice, :]
        d_out = d_out_ref[rows_slice, :]
        rows = i * bq + lax.iota(jnp.int32, bq)
        q_seg = None if q_seg_ref is None else q_seg_ref[rows_slice]
        p, scale = _probabilities(
            kernel,
            dropout,
            b * plan.heads + h,
            q,
            k,
            rows,
            j * bk,
            state,
            q_seg,
            kv_seg,
            _mask_tile(kernel, mask_ref, rows_slice, None),
            lse_ref[rows_slice],
            taint_ref[rows_slice],
        )
        kept = p if scale is None else p * scale
        dv = dv + _dot(kept.astype(v.dtype), d_out, (0, 0), plan)
        d_p = _dot(d_out, v, (1, 1), plan)
        if scale is not None:
            d_p = d_p * scale
        d_s = p * (d_p - delta_ref[rows_slice][:, None])
        dk = dk + _dot(d_s.astype(q.dtype), q, (0, 0), plan)
        return dk, dv

    init = (
        jnp.zeros((bk, k_ref.shape[-1]), plan.accumulate),
        jnp.zeros((bk, v_ref.shape[-1]), plan.accumulate),
    )
    lo, hi = bw.query_block_bounds(plan, j)
    hi = jnp.where(j < key_tiles, hi, lo)  # past the last valid key: nothing to do
    dk, dv = lax.fori_loop(lo, hi, body, init)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(kernel: Kernel, *refs: Any) -> None:
    plan = kernel.tiles
    ins, side, (dq_ref,) = _backward_refs(kernel, refs)
    key_tiles, q_seg_ref, kv_seg_ref, mask_ref, dropout = side
    q_ref, k_ref, v_ref, d_out_ref, lse_ref, delta_ref, taint_ref, kv_state_ref = ins
    i, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk = plan.block_q, plan.block_k
    q, d_out = q_ref[...], d_out_ref[...]
    lse, delta, taint = lse_ref[...], delta_ref[...], taint_ref[...]
    rows = i * bq + lax.iota(jnp.int32, bq)
    q_seg = None if q_seg_ref is None else q_seg_ref[...]

    def body(j, dq):
        cols_slice = pl.ds(j * bk, bk)
        k = k_ref[cols_slice, :]
        v = v_ref[cols_slice, :]
        kv_seg = None if kv_seg_ref is None else kv_seg_ref[cols_slice]
        state = kv_state_ref[cols_slice]
        p, scale = _probabilities(
            kernel,
            dropout,
            b * plan.heads + h,
            q,
            k,
            rows,
            j * bk,
            state,
            q_seg,
            kv_seg,
            _mask_tile(kernel, mask_ref, None, cols_slice),
            lse,
            taint,
        )
        d_p = _dot(d_out, v, (1, 1), plan)
        if scale is not None:
            d_p = d_p * scale
        d_s = p * (d_p - delta[:, None])
        return dq + _dot(d_s.astype(k.dtype), k, (1, 0), plan)

    lo, hi = bw.key_block_bounds(plan, i)
    hi = jnp.minimum(hi, key_tiles)
    dq = lax.fori_loop(lo, hi, body, jnp.zeros((bq, q_ref.shape[-1]), plan.accumulate))
    dq_ref[...] = dq.astype(dq_ref.dtype)


# --- pallas_call plumbing -------------------------------------------------------------


def _call(kernel: Kernel, body: Any, grid: tuple[int, ...], in_specs, out_specs, out_shape, name):
    compiler_params = None
    if not kernel.interpret:
        from jax.experimental.pallas import triton as plgpu

        compiler_params = plgpu.CompilerParams(
            num_warps=kernel.num_warps, num_stages=kernel.num_stages
        )
    return pl.pallas_call(
        functools.partial(body, kernel),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=kernel.interpret,
        compiler_params=compiler_params,
        name=name,
    )


def _side_specs(kernel: Kernel, side: _Inputs, q_block: int, k_block: int, tile_axis: str):
    """Specs of the side inputs (key tile count, and where given segment ids, mask, key
    words, run-time threshold), for a grid ``(tile, batch, head)`` over ``tile_axis``."""
    specs = [pl.BlockSpec((1,), lambda t, b, h: (b,))]
    args: list[Any] = [side.key_tiles]
    if kernel.segments:
        assert side.q_segments is not None and side.kv_segments is not None
        q_index = (lambda t, b, h: (b, t)) if tile_axis == "q" else (lambda t, b, h: (b, 0))
        k_index = (lambda t, b, h: (b, t)) if tile_axis == "k" else (lambda t, b, h: (b, 0))
        specs += [pl.BlockSpec((None, q_block), q_index), pl.BlockSpec((None, k_block), k_index)]
        args += [side.q_segments, side.kv_segments]
    if kernel.mask_dims is not None:
        b_whole, h_whole, q_whole, k_whole = kernel.mask_dims
        block = (None, None, q_block if q_whole else 1, k_block if k_whole else 1)

        def mask_index(t, b, h):
            q_tile = t if q_whole and tile_axis == "q" else 0
            k_tile = t if k_whole and tile_axis == "k" else 0
            return (b if b_whole else 0, h if h_whole else 0, q_tile, k_tile)

        specs.append(pl.BlockSpec(block, mask_index))
        args.append(side.mask)
    if kernel.dropout:
        specs.append(pl.BlockSpec((4,), lambda t, b, h: (0,)))
        args.append(side.words)
    if kernel.run_time_rate:
        specs.append(pl.BlockSpec((2,), lambda t, b, h: (0,)))
        args.append(side.rate)
    return specs, args


def _forward(kernel: Kernel, q, k, v, side: _Inputs):
    plan = kernel.tiles
    bsz, lq, heads, depth = q.shape
    lk, dv = k.shape[1], v.shape[-1]
    g = plan.groups
    bq = plan.block_q
    extra_specs, extra = _side_specs(kernel, side, bq, lk, "q")
    in_specs = [
        pl.BlockSpec((None, bq, None, depth), lambda i, b, h: (b, i, h, 0)),
        pl.BlockSpec((None, lk, None, depth), lambda i, b, h: (b, 0, h // g, 0)),
        pl.BlockSpec((None, lk, None, dv), lambda i, b, h: (b, 0, h // g, 0)),
        pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i)),
        pl.BlockSpec((None, None, lk), lambda i, b, h: (b, h // g, 0)),
        *extra_specs,
    ]
    row_spec = pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i))
    out_specs = [
        pl.BlockSpec((None, bq, None, dv), lambda i, b, h: (b, i, h, 0)),
        row_spec,
        row_spec,
    ]
    out_shape = [
        jax.ShapeDtypeStruct((bsz, lq, heads, dv), q.dtype),
        jax.ShapeDtypeStruct((bsz, heads, lq), plan.accumulate),
        jax.ShapeDtypeStruct((bsz, heads, lq), jnp.int32),
    ]
    call = _call(
        kernel,
        _forward_kernel,
        (plan.n_q, bsz, heads),
        in_specs,
        out_specs,
        out_shape,
        "dropmask_attention_forward",
    )
    out, lse, taint = call(q, k, v, side.q_state, side.kv_state, *extra)
    return out, lse, taint


def _backward(kernel: Kernel, q, k, v, side: _Inputs, out, lse, taint, d_out):
    plan = kernel.tiles
    bsz, lq, heads, depth = q.shape
    lk, dv = k.shape[1], v.shape[-1]
    g, bq, bk = plan.groups, plan.block_q, plan.block_k
    d_out = jnp.where((taint != 0).transpose(0, 2, 1)[..., None], 0, d_out).astype(q.dtype)
    delta = jnp.sum(d_out.astype(plan.accumulate) * out.astype(plan.accumulate), axis=-1)
    delta = delta.transpose(0, 2, 1)  # [B, H, Lq], rowsum(dO * O) = rowsum(P * dP)
    args = (q, k, v, d_out, lse, delta, taint, side.kv_state)

    # dk, dv: a program per key tile; the query side whole.
    extra_specs, extra = _side_specs(kernel, side, lq, bk, "k")
    whole_rows = pl.BlockSpec((None, None, lq), lambda j, b, h: (b, h, 0))
    in_specs = [
        pl.BlockSpec((None, lq, None, depth), lambda j, b, h: (b, 0, h, 0)),
        pl.BlockSpec((None, bk, None, depth), lambda j, b, h: (b, j, h // g, 0)),
        pl.BlockSpec((None, bk, None, dv), lambda j, b, h: (b, j, h // g, 0)),
        pl.BlockSpec((None, lq, None, dv), lambda j, b, h: (b, 0, h, 0)),
        whole_rows,
        whole_rows,
        whole_rows,
        pl.BlockSpec((None, None, bk), lambda j, b, h: (b, h // g, j)),
        *extra_specs,
    ]
    # One dk, dv per query head, summed over each key/value head's group below.
    out_specs = [
        pl.BlockSpec((None, bk, None, depth), lambda j, b, h: (b, j, h, 0)),
        pl.BlockSpec((None, bk, None, dv), lambda j, b, h: (b, j, h, 0)),
    ]
    grad_dtype = plan.accumulate if g > 1 else k.dtype
    out_shape = [
        jax.ShapeDtypeStruct((bsz, lk, heads, depth), grad_dtype),
        jax.ShapeDtypeStruct((bsz, lk, heads, dv), grad_dtype),
    ]
    d_k, d_v = _call(
        kernel,
        _dkdv_kernel,
        (plan.n_k, bsz, heads),
        in_specs,
        out_specs,
        out_shape,
        "dropmask_attention_dkdv",
    )(*args, *extra)
    if g > 1:
        d_k = d_k.reshape(bsz, lk, plan.kv_heads, g, depth).sum(axis=3).astype(k.dtype)
        d_v = d_v.reshape(bsz, lk, plan.kv_heads, g, dv).sum(axis=3).astype(v.dtype)

    # dq: a program per query tile; the key side whole.
    extra_specs, extra = _side_specs(kernel, side, bq, lk, "q")
    tile_rows = pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i))
    in_specs = [
        pl.BlockSpec((None, bq, None, depth), lambda i, b, h: (b, i, h, 0)),
        pl.BlockSpec((None, lk, None, depth), lambda i, b, h: (b, 0, h // g, 0)),
        pl.BlockSpec((None, lk, None, dv), lambda i, b, h: (b, 0, h // g, 0)),
        pl.BlockSpec((None, bq, None, dv), lambda i, b, h: (b, i, h, 0)),
        tile_rows,
        tile_rows,
        tile_rows,
        pl.BlockSpec((None, None, lk), lambda i, b, h: (b, h // g, 0)),
        *extra_specs,
    ]
    out_specs = [pl.BlockSpec((None, bq, None, depth), lambda i, b, h: (b, i, h, 0))]
    (d_q,) = _call(
        kernel,
        _dq_kernel,
        (plan.n_q, bsz, heads),
        in_specs,
        out_specs,
        [jax.ShapeDtypeStruct(q.shape, q.dtype)],
        "dropmask_attention_dq",
    )(*args, *extra)
    return d_q, d_k, d_v


def _attend_impl(kernel: Kernel, q, k, v, side: _Inputs):
    out, _, taint = _forward(kernel, q, k, v, side)
    return out, taint


def _attend_fwd(kernel: Kernel, q, k, v, side: _Inputs):
    out, lse, taint = _forward(kernel, q, k, v, side)
    return (out, taint), (q, k, v, side, out, lse, taint)


def _attend_bwd(kernel: Kernel, residuals, cotangents):
    q, k, v, side, out, lse, taint = residuals
    d_out, _ = cotangents
    d_q, d_k, d_v = _backward(kernel, q, k, v, side, out, lse, taint, d_out)
    return d_q, d_k, d_v, jax.tree.map(lambda _: None, side)


_attend = jax.custom_vjp(_attend_impl, nondiff_argnums=(0,))
_attend.defvjp(_attend_fwd, _attend_bwd)


# --- the entry point ------------------------------------------------------------------


def _run_time_threshold(keep: Any) -> jax.Array:
    """``float32[2]``: a run-time threshold's value (an integer of at most 2**16, exact in
    float32) and the probability it realises (NaN for a keep probability outside [0, 1])."""
    thr = threshold(keep)
    return jnp.stack([jnp.asarray(thr.value).astype(jnp.float32), thr.realised])


def mask_dims(mask: jax.Array, batch: tuple[int, ...]) -> tuple[bool, bool, bool, bool]:
    """Which of a dense mask's (batch, head, query, key) axes are whole, not 1."""
    nb = len(batch)
    return (
        any(d != 1 for d in mask.shape[:nb]),
        mask.shape[nb] != 1,
        mask.shape[nb + 1] != 1,
        mask.shape[nb + 2] != 1,
    )


def _mask_input(mask: jax.Array, plan: bw.Plan, lq: int, lk: int) -> jax.Array:
    """``int8[B|1, H|1, Lq_pad|1, Lk_pad|1]``; padding queries and keys masked."""
    nb = len(plan.batch)
    b_whole, _, q_whole, k_whole = mask_dims(mask, plan.batch)
    if b_whole:
        mask = jnp.broadcast_to(mask, (*plan.batch, *mask.shape[nb:]))
    mask = mask.reshape(math.prod(plan.batch) if b_whole else 1, *mask.shape[nb:])
    sizes = {a: n for a, n, whole in ((2, lq, q_whole), (3, lk, k_whole)) if whole}
    return _pad_to(mask.astype(jnp.int8), sizes)


def _padded_depth(depth: int) -> int:
    return max(16, pl.next_power_of_2(depth))


def _pad_to(x: jax.Array, sizes: dict[int, int], value: Any = 0) -> jax.Array:
    widths = [(0, sizes.get(a, d) - d) for a, d in enumerate(x.shape)]
    if not any(w for _, w in widths):
        return x
    return jnp.pad(x, widths, constant_values=value)


def pallas_attention(
    kernel: Kernel,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    inputs: ki.KernelInputs,
    mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Attention of ``q: [*batch, Lq, H, D]`` over ``k``, ``v``: ``[*batch, Lk, Hk, D]``.

    As :func:`dropmask._attention._blockwise.blockwise_attention`: ``q`` is already
    scaled by ``1/sqrt(D)`` and every input is finite (non-finite entries zeroed and
    recorded in ``inputs``, :class:`_kernel_inputs.KernelInputs`). ``mask``: boolean, rank
    ``len(batch) + 3``, each axis 1 or whole (as ``kernel.mask_dims`` says).

    Returns:
      The output ``[*batch, Lq, H, Dv]`` with tainted rows 0, and the taint
      ``bool[*batch, H, Lq, 1]`` (the dense path's layout).
    """
    plan = kernel.tiles
    bsz = math.prod(plan.batch)
    lq, lk = plan.n_q * plan.block_q, plan.n_k * plan.block_k
    depth, v_depth = q.shape[-1], v.shape[-1]
    heads, hk = plan.heads, plan.kv_heads
    q4 = _pad_to(q.reshape(bsz, plan.q_len, heads, depth), {1: lq, 3: _padded_depth(depth)})
    k4 = _pad_to(k.reshape(bsz, plan.kv_len, hk, depth), {1: lk, 3: _padded_depth(depth)})
    v4 = _pad_to(v.reshape(bsz, plan.kv_len, hk, v_depth), {1: lk, 3: _padded_depth(v_depth)})

    q_state, kv_state = ki.position_states(plan, inputs)

    def segments(ids: jax.Array | None, length: int, padded: int) -> jax.Array | None:
        if ids is None:
            return None
        ids = jnp.broadcast_to(ids, (*plan.batch, length)).reshape(bsz, length)
        return _pad_to(ids.astype(jnp.int32), {1: padded})

    side = _Inputs(
        q_state=_pad_to(q_state, {2: lq}),
        kv_state=_pad_to(kv_state, {2: lk}),
        key_tiles=ki.key_tiles(kv_state, plan.block_k),
        q_segments=segments(inputs.q_segments, plan.q_len, lq),
        kv_segments=segments(inputs.kv_segments, plan.kv_len, lk),
        words=key_words(inputs.key) if kernel.dropout else None,
        rate=None if inputs.run_time_keep is None else _run_time_threshold(inputs.run_time_keep),
        mask=None if mask is None else _mask_input(mask, plan, lq, lk),
    )
    out, taint = _attend(kernel, q4, k4, v4, side)
    out = out[:, : plan.q_len, :, :v_depth].reshape(*plan.batch, plan.q_len, heads, v_depth)
    taint = (taint[..., : plan.q_len] != 0).reshape(*plan.batch, heads, plan.q_len, 1)
    return out, taint
