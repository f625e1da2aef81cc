"""The TPU attention kernels' dropout: each tile's keep-flags, drawn, or stored as bits.

A tile's flags are the dense path's, element by element, for any tile size: drawn from
the key words and the tile's position by ``dropmask._random.keep_tile``, the dropout
kernel's own delivery (each Threefry call once, its 8 flags packed in a byte and spread
by the matrix unit), in either orientation (the ``dk``/``dv`` kernel works on the
transposed scores).

Drawing is the kernels' dearest work: a Threefry-4x32-13 call counts about 150 vector
operations (13 rounds of add, rotate and xor on 4 words, and the key injections) for
its 8 flags, and kernels that draw their tiles' flags draw each three times a step
(forward, ``dk``/``dv``, ``dq``), and once per head where one mask is shared by every
head (``broadcast_dropout``, Flax's default). So where the bits fit
(:func:`stores`), a kernel of their own draws each flag once, into 1-bit form
(:class:`Bits`), and the attention kernels unpack them with a shift and a compare.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._random import LANES, keep_tile, rows_along_lanes, threshold
from . import _blockwise as bw

__all__ = ["Bits", "Place", "Scalars", "drawn_flags", "stores"]

_U32 = np.uint32


@dataclasses.dataclass(frozen=True)
class Place:
    """Where one device's block of a sharded call sits, for a mask per head (with one
    mask for every head, Flax's default, the place does not matter): the batch axes and
    heads of the block and of the whole call. The block's first index on each batch
    axis and its first head follow the key words, as run-time scalars."""

    local_batch: tuple[int, ...]
    global_batch: tuple[int, ...]
    local_heads: int
    global_heads: int

    @property
    def rows(self) -> int:
        """The whole call's rows of heads (batch * heads)."""
        return math.prod(self.global_batch) * self.global_heads

    def row(self, bh: Any, offset: list[Any]) -> Any:
        """The whole call's row of local row of heads ``bh``."""
        b, h = bh // self.local_heads, bh % self.local_heads
        index: Any = 0
        for axis, (size, whole) in enumerate(zip(self.local_batch, self.global_batch, strict=True)):
            coord = b // math.prod(self.local_batch[axis + 1 :]) % size
            index = index * whole + coord + offset[axis]
        return index * self.global_heads + h + offset[len(self.local_batch)]


class Scalars:
    """The scalar-prefetch operands: key tiles per batch row, whether the call is
    clean (``_flash_tpu.clean``), key words (then a block's offsets, with a ``place``),
    run-time rate."""

    def __init__(self, plan: bw.Plan, refs: list[Any], place: Place | None = None):
        self.key_tiles = refs.pop(0)
        self.clean = refs.pop(0)
        self.words = refs.pop(0) if plan.dropout else None
        self.rate = refs.pop(0) if plan.run_time_rate else None
        self.plan = plan
        self.place = place

    def head_row(self, bh: Any) -> Any:
        """The whole call's row of heads of local row ``bh``."""
        if self.place is None:
            return bh
        assert self.words is not None
        offset = [self.words[4 + i] for i in range(len(self.place.local_batch) + 1)]
        return self.place.row(bh, offset)

    def threshold(self) -> tuple[Any, Any]:
        """``(threshold, realised)`` for ``keep_tile``, static or read from memory."""
        if self.rate is None:
            assert self.plan.keep is not None
            thr = threshold(self.plan.keep)
            return np.int32(thr.value), thr.realised
        bits = jnp.full((1, 1), self.rate[1], jnp.int32)
        return self.rate[0], lax.bitcast_convert_type(bits, jnp.float32)

    def key(self) -> list[jax.Array]:
        assert self.words is not None
        return [self.words[t].astype(_U32) for t in range(4)]

    def inverse_keep(self) -> Any:
        """What a kept weight is multiplied by, ``1/realised`` (0 where nothing is
        kept). The kernels select the kept weights and apply this once to a sum of
        them (an output row, ``dv``) or to a tile of the operand they meet (``v``,
        ``dO``), not to each weight. A run-time rate outside [0, 1] realises NaN,
        which so reaches every output and gradient, as on the dense path."""
        _, realised = self.threshold()
        if isinstance(realised, float):
            return np.float32(1.0 / realised if realised > 0 else 0.0)
        positive = realised > 0
        return jnp.where(positive, 1 / jnp.where(positive, realised, 1), 0) + realised * 0


def drawn_flags(
    sc: Scalars, bh: Any, row0: Any, col0: Any, shape: tuple[int, int], transposed: bool
) -> jax.Array:
    """``bool``: the keep-flags of the tile of head row ``bh`` (batch * heads) whose
    first query is ``row0`` and first key ``col0``, as ``[bq, bk]`` (``shape``), or as
    ``[bk, bq]`` when ``transposed``."""
    plan = sc.plan
    bq, bk = shape
    words_per_row = -(-plan.kv_len // LANES)
    if plan.broadcast_dropout:
        head_row: Any = _U32(0)
    else:
        head_row = jnp.asarray(sc.head_row(bh)).astype(_U32) * _U32(plan.q_len)
    on_lanes = transposed or rows_along_lanes(bq, bk)
    rows = lax.broadcasted_iota(_U32, (1, bq) if on_lanes else (bq, 1), 1 if on_lanes else 0)
    row_word = (head_row + row0.astype(_U32) + rows) * _U32(words_per_row)
    first_word = (col0 // LANES).astype(_U32)
    thr, _ = sc.threshold()
    return keep_tile(sc.key(), thr, row_word, first_word, (bq, bk), transposed=transposed)


# --- stored as bits --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bits:
    """How a ``[block_q, block_k]`` tile's flags are stored: as ``int32`` words.

    The tile is cut into blocks of ``[rows, 128]`` (``rows = gcd(block_q, 128)``),
    numbered row-major: ``row_slabs`` of ``block_q / rows`` by ``lane_slabs`` of
    ``block_k / 128``. Block ``b`` is bit ``b % 32`` of word block ``b // 32``, a
    ``[rows, 128]`` block of words; the tile's words are those blocks stacked, ``[words *
    rows, 128]``. So packing and unpacking move whole blocks, with neither lane nor
    sublane shuffles, in either orientation (the transposed one transposes a word block
    first). A tile of ``[1024, 1024]`` (the default) is 64 blocks of ``[128, 128]``: two
    word blocks, one bit a flag. Compiled, ``rows`` must be 128: a transposed word block
    is then whole vector registers.
    """

    block_q: int
    block_k: int

    @property
    def rows(self) -> int:
        return math.gcd(self.block_q, 128)

    @property
    def row_slabs(self) -> int:
        return self.block_q // self.rows

    @property
    def lane_slabs(self) -> int:
        return self.block_k // 128

    @property
    def words(self) -> int:
        return -(-self.row_slabs * self.lane_slabs // 32)

    @property
    def tile(self) -> tuple[int, int]:
        """The shape of one tile's words."""
        return (self.words * self.rows, 128)

    def serves(self, interpret: bool) -> bool:
        """Whether these tiles can store their flags: key tiles of whole 128-lane
        blocks, and compiled, blocks of 128 rows (a transposed block of words is then
        whole vector registers)."""
        return self.block_k % 128 == 0 and (interpret or self.rows == 128)

    def _blocks(self) -> list[tuple[int, int, int, int]]:
        """``(row slab, lane slab, word block, bit)`` of each block."""
        out = []
        for t in range(self.row_slabs):
            for s in range(self.lane_slabs):
                b = t * self.lane_slabs + s
                out.append((t, s, b // 32, b % 32))
        return out

    def pack(self, flags: jax.Array) -> jax.Array:
        """``int32[*tile]``: the words of ``bool[block_q, block_k]`` flags."""
        ones = jnp.where(flags, np.int32(1), np.int32(0))
        r = self.rows
        words: list[Any] = [None] * self.words
        for t, s, w, u in self._blocks():
            piece = ones[t * r : (t + 1) * r, s * 128 : (s + 1) * 128] << np.int32(u)
            words[w] = piece if words[w] is None else words[w] | piece
        return words[0] if len(words) == 1 else jnp.concatenate(words, axis=0)

    def unpack(
        self,
        words: jax.Array,
        transposed: bool,
        keys: slice | None = None,
        queries: slice | None = None,
    ) -> jax.Array:
        """``bool``: the flags of ``words``, as ``[block_q, block_k]``, or as ``[block_k,
        block_q]`` when ``transposed``; of the keys ``keys`` (a slice of whole 128-lane
        blocks) and the queries ``queries`` (of whole ``rows`` blocks) alone where given."""
        r = self.rows
        lanes, rows_ = range(self.lane_slabs), range(self.row_slabs)
        if keys is not None:
            lanes = range(keys.start // 128, keys.stop // 128)
        if queries is not None:
            rows_ = range(queries.start // r, queries.stop // r)
        blocks: dict[int, jax.Array] = {}  # the word blocks needed, each transposed once
        grid: dict[tuple[int, int], jax.Array] = {}
        for t, s, w, u in self._blocks():
            if s in lanes and t in rows_:
                if w not in blocks:
                    block = words[w * r : (w + 1) * r]
                    blocks[w] = block.T if transposed else block
                grid[t, s] = (blocks[w] << np.int32(31 - u)) < 0
        if transposed:  # a block is [128 keys, rows queries]: keys down, queries across
            strips = [[grid[t, s] for t in rows_] for s in lanes]
        else:
            strips = [[grid[t, s] for s in lanes] for t in rows_]
        return jnp.concatenate([jnp.concatenate(strip, axis=1) for strip in strips], axis=0)


def stores(plan: bw.Plan, interpret: bool, heads_rows: int, budget_bytes: int) -> bool:
    """Whether the flags are drawn once and stored (else each kernel draws its tiles):
    with dropout, where :class:`Bits` serves the tiles and the words of ``heads_rows``
    rows of heads (1 where one mask is shared) take at most ``budget_bytes``."""
    bits = Bits(plan.block_q, plan.block_k)
    if not (plan.dropout and bits.serves(interpret)):
        return False
    rows, cols = bits.tile
    return heads_rows * plan.n_q * rows * plan.n_k * cols * 4 <= budget_bytes
