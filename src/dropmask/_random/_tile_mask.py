"""The ``"fast"`` keep-flags of one tile of attention weights, computed where they are used.

The dense path draws its attention-dropout mask over the weights
``[*batch, heads, q_len, kv_len]`` (batch and head axes 1 with ``broadcast_dropout``).
An element's flag depends only on the key and its global position: its 32-element
word along the packing axis (the last axis longer than 1), numbered row-major among
all words, is the counter of Threefry-4x32 calls whose 16-bit output fields
are compared with an integer threshold (``_fast_mask``). :func:`tile_keep_flags`
computes the flags of a ``[block_q, block_k]`` tile from the four key words and the
tile's position with plain ``jax.numpy`` operations on the tile, so a Pallas kernel
can compute them in registers, and they equal the dense path's flags element by
element: the block function, field layout and comparison are ``_fast_mask``'s own.

Two ways, one result. When the key axis packs and ``block_k`` is a multiple of 32, a
tile row holds whole words: each Threefry call is computed once per row and serves
the 8 weights it covers, each weight selecting its field. Otherwise each
weight computes its own call.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from ._draw import mask_shape
from ._fast_mask import (
    FIELDS,
    LANES,
    Threshold,
    check_word_count,
    compare,
    packing_axis,
)
from ._threefry import threefry4x32

__all__ = ["TileGeometry", "tile_keep_flags"]

_U32 = jnp.uint32


class TileGeometry(Protocol):
    """What the flags of a tile depend on: the attention weights' shape and the tiles.

    The attention paths' ``Plan`` is one; only these fields are read.
    """

    @property
    def batch(self) -> tuple[int, ...]: ...
    @property
    def heads(self) -> int: ...
    @property
    def q_len(self) -> int: ...
    @property
    def kv_len(self) -> int: ...
    @property
    def block_q(self) -> int: ...
    @property
    def block_k(self) -> int: ...
    @property
    def broadcast_dropout(self) -> bool: ...


def _mask_layout(plan: TileGeometry) -> tuple[int, int]:
    """``(packing axis from the end, its size)`` of the dense path's global mask.

    1 is the key axis; 2 the query axis (one key); 3 a batch or head axis (one query
    and one key, no ``broadcast_dropout``).
    """
    nb = len(plan.batch)
    axes = tuple(range(nb + 1)) if plan.broadcast_dropout else ()
    shape = mask_shape((*plan.batch, plan.heads, plan.q_len, plan.kv_len), axes)
    axis = packing_axis(shape)
    word_shape = tuple(-(-d // LANES) if a == axis else d for a, d in enumerate(shape))
    check_word_count(word_shape)
    return min(len(shape) - axis, 3), shape[axis]


def _select_output(outputs: list[jax.Array], which: jax.Array) -> jax.Array:
    chosen = outputs[0]
    for k in range(1, len(outputs)):
        chosen = jnp.where(which == _U32(k), outputs[k], chosen)
    return chosen


def tile_keep_flags(
    plan: TileGeometry, thr: Threshold, words: list[jax.Array], bh: Any, rows: Any, col0: Any
) -> jax.Array:
    """``bool[bq, bk]``: the keep-flags of the weights at query ``rows`` (``int32[bq]``)
    and keys ``col0 + [0, bk)`` of batch-head ``bh`` (``batch_index * heads + head``).

    Args:
      plan: the call's geometry (batch dims, heads, lengths, tiles, broadcast_dropout).
      thr: the keep threshold, ``threshold(keep)``; its ``value`` and ``realised`` may
        be run-time scalars (a traced rate).
      words: the four ``uint32`` key words (scalars), ``key_words(key)``.
      bh, rows, col0: the tile's global position (traced scalars and a vector).
    """
    fields = FIELDS
    bq, bk = plan.block_q, plan.block_k
    shape = (bq, bk)
    from_end, size = _mask_layout(plan)
    words_per_row = -(-size // LANES)
    bh = jnp.asarray(bh).astype(_U32)
    head_row = _U32(0) if plan.broadcast_dropout else bh * _U32(plan.q_len)
    rows = rows.astype(_U32)[:, None]
    col0 = jnp.asarray(col0).astype(_U32)
    cols = col0 + lax.broadcasted_iota(_U32, (1, bk), 1)
    zero = jnp.zeros(shape, _U32)

    if from_end == 1 and bk % LANES == 0:
        # Each row of the tile holds whole words: one call per (row, word, j).
        prefix = (head_row + rows) * _U32(words_per_row)  # [bq, 1]
        local = lax.broadcasted_iota(_U32, (1, bk), 1)
        lane = local % _U32(LANES)
        pick = (local // _U32(LANES)) * _U32(fields.calls * 4) + lane // _U32(fields.per_output)
        bit = (lane % _U32(fields.per_output)) * _U32(fields.nbits)
        first_word = col0 // _U32(LANES)
        chosen = zero
        for g in range(bk // LANES):
            counter = jnp.broadcast_to(prefix + first_word + _U32(g), (bq, 1))
            zeros = jnp.zeros((bq, 1), _U32)
            for j in range(fields.calls):
                outs = threefry4x32((counter, zeros + _U32(j), zeros, zeros), words)
                used = -(-min(fields.per_call, LANES - j * fields.per_call) // fields.per_output)
                for o in range(used):
                    index = g * fields.calls * 4 + j * 4 + o
                    chosen = jnp.where(pick == _U32(index), outs[o], chosen)
        return compare(fields.extract(chosen, bit), thr)

    if from_end == 1:
        prefix, coord = head_row + rows, cols
    elif from_end == 2:
        prefix, coord = _U32(0) if plan.broadcast_dropout else bh, rows
    else:
        prefix, coord = bh // _U32(size), bh % _U32(size)
    counter = zero + prefix * _U32(words_per_row) + coord // _U32(LANES)
    j, o, bit = fields.locate(zero + coord % _U32(LANES))
    outs = threefry4x32((counter, j, zero, zero), words)
    return compare(fields.extract(_select_output(outs, o), bit), thr)
