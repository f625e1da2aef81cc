"""FlashAttention-2 as Pallas TPU (Mosaic) kernels, with the dense path's dropout mask drawn inside.

The TPU form of ``_flash_triton`` (whose kernels are written for Triton's programs): three
kernels over a grid whose last axis walks the tiles a program reduces over, with the
running state in scratch memory, as TPUs run Pallas kernels.

* forward, grid ``(batch * heads, query tiles, key tiles)``: a running maximum, sum
  and unnormalised output per query row; writes the output and one log-sum-exp per
  row (``+inf`` for a tainted row, which saw a non-finite input or score); a key tile
  is computed in pieces of ``FORWARD_CHUNK`` keys, so its float32 scores and weights
  stay small values (``_flash_tpu_plan``);
* ``dk``/``dv``, grid ``(batch * kv_heads, key tiles, groups * query tiles)``: works on
  the transposed scores ``k q^T`` ``[block_k, block_q]``, so the log-sum-exps and
  ``rowsum(dO * O)`` arrive as lane vectors and every product but dq's is a plain one;
  it sums ``dq`` too where a group of heads' rows fit in VMEM (``fuses_dq``), the
  accumulator held across the key tiles, and writes each query tile as it goes;
* ``dq``, grid ``(batch * heads, query tiles, key tiles)``, for longer rows.

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
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._random import LANES, check_word_count, key_words, threshold
from . import _blockwise as bw
from . import _flash_dropout as fd
from . import _kernel_inputs as ki
from ._flash_tpu_calls import backward, draw_flags, forward
from ._flash_tpu_plan import COMPILED_DEPTH as COMPILED_DEPTH
from ._flash_tpu_plan import DEFAULT_BLOCKS as DEFAULT_BLOCKS
from ._flash_tpu_plan import Flash as Flash
from ._flash_tpu_plan import Inputs, consistent
from ._flash_tpu_plan import kernel_precision as kernel_precision
from ._flash_tpu_plan import serves as serves

__all__ = [
    "COMPILED_DEPTH",
    "DEFAULT_BLOCKS",
    "Flash",
    "attend_backward",
    "attend_forward",
    "clean",
    "finish",
    "flash_attention",
    "kernel_precision",
    "prepare",
    "rows_first",
    "serves",
]


def _attend_impl(flash: Flash, q, k, v, side: Inputs):
    out, lse = forward(flash, q, k, v, side)
    return out, lse


def attend_forward(flash: Flash, q, k, v, side: Inputs):
    out, lse = forward(consistent(flash, q.dtype), q, k, v, side)
    return (out, lse), (q, k, v, side, out, lse)


def attend_backward(flash: Flash, residuals, cotangents):
    q, k, v, side, out, lse = residuals
    d_out, _ = cotangents
    d_q, d_k, d_v = backward(consistent(flash, q.dtype), q, k, v, side, out, lse, d_out)
    return d_q, d_k, d_v, jax.tree.map(lambda _: None, side)


_attend = jax.custom_vjp(_attend_impl, nondiff_argnums=(0,))
_attend.defvjp(attend_forward, attend_backward)


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
    as ``_flash_triton.pallas_attention`` (which see) without a dense ``mask``.

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
) -> tuple[Flash, jax.Array, jax.Array, jax.Array, Inputs]:
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
    side = Inputs(
        q_state=q_state,
        kv_state=kv_state,
        q_segments=segments(inputs.q_segments, plan.q_len, lq),
        kv_segments=segments(inputs.kv_segments, plan.kv_len, lk),
        flags=draw_flags(flash, flag_rows, tuple(scalars)) if flash.stored else None,
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
