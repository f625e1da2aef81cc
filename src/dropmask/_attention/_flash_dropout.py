"""The TPU attention kernels' dropout: each tile's keep-flags, drawn in the kernel.

A tile's flags are the dense path's, element by element, for any tile size: drawn from
the key words and the tile's position by ``dropmask._random.keep_tile``, the dropout
kernel's own delivery (each Threefry call once, its 8 flags packed in a byte and spread
by the matrix unit), in either orientation (the ``dk``/``dv`` kernel works on the
transposed scores).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._random import LANES, keep_tile, threshold
from . import _blockwise as bw

__all__ = ["Scalars", "drawn_scale"]

_U32 = np.uint32


class Scalars:
    """The scalar-prefetch operands: key tiles per batch row, key words, run-time rate."""

    def __init__(self, plan: bw.Plan, refs: list[Any]):
        self.key_tiles = refs.pop(0)
        self.words = refs.pop(0) if plan.dropout else None
        self.rate = refs.pop(0) if plan.dropout and plan.keep is None else None
        self.plan = plan

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


def drawn_scale(
    sc: Scalars, bh: Any, row0: Any, col0: Any, shape: tuple[int, int], transposed: bool
) -> jax.Array | None:
    """``1/realised`` where a weight is kept, 0 where dropped, as ``[bq, bk]`` (or
    ``[bk, bq]`` when ``transposed``); None without dropout. A run-time rate outside
    [0, 1] realises NaN, which reaches every weight, as on the dense path."""
    plan = sc.plan
    if not plan.dropout:
        return None
    bq, bk = shape
    words_per_row = -(-plan.kv_len // LANES)
    head_row = _U32(0) if plan.broadcast_dropout else bh.astype(_U32) * _U32(plan.q_len)
    rows = lax.broadcasted_iota(_U32, (1, bq) if transposed else (bq, 1), 1 if transposed else 0)
    row_word = (head_row + row0.astype(_U32) + rows) * _U32(words_per_row)
    first_word = (col0 // LANES).astype(_U32)
    thr, realised = sc.threshold()
    flags = keep_tile(sc.key(), thr, row_word, first_word, (bq, bk), transposed=transposed)
    if isinstance(realised, float):
        scale = 1.0 / realised if realised > 0 else 0.0
        return jnp.where(flags, np.float32(scale), np.float32(0.0))
    nan_or_zero = realised * 0  # NaN for a rate outside [0, 1]
    positive = realised > 0
    scale = jnp.where(positive, 1 / jnp.where(positive, realised, 1), 0) + nan_or_zero
    return jnp.where(flags, scale, nan_or_zero)
