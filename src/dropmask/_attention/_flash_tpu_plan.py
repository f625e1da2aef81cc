"""The TPU attention kernels' plan: what is static about a call (``Flash``), the tiles
each grid step visits, the side inputs' layouts, and what the kernels serve."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _blockwise as bw
from . import _flash_dropout as fd

__all__ = [
    "COMPILED_DEPTH",
    "DEFAULT_BLOCKS",
    "Flash",
    "Inputs",
    "consistent",
    "flag_tiles",
    "kernel_precision",
    "key_range",
    "query_range",
    "serves",
    "visited",
]


# (block_q, block_k): 128 calls a row of a key tile. Measured on a v5e (bf16, causal,
# dropout 0.1, forward and backward): against (512, 1024), 6% faster at [1, 4096, 8, 128],
# 7% at 8192 and 11% at 32768 tokens, and the 4-layer step 2% faster at 1024 tokens.
# Larger tiles are slower: at [1, 8192, 8, 64] (and at depth 128), 4.66 ms (4.76) here,
# (2048, 1024) 4.90 (4.98), (1024, 2048) 4.97 (5.05), (2048, 2048) 10.31 (10.45).
DEFAULT_BLOCKS = (1024, 1024)
_U32 = np.uint32
ROW = 128  # lanes of a per-row scratch value (a row's scalar, repeated)
NT = (((1,), (1,)), ((), ()))  # a @ b^T
NN = (((1,), (0,)), ((), ()))  # a @ b
TN = (((0,), (0,)), ((), ()))  # a^T @ b
# A [1024, 1024] tile's scores and weights are 4 MiB values each, whose every
# elementwise pass goes through memory; in pieces of 256 keys they stay smaller. On a
# v5e (bf16 causal [1, L, 8, 128], forward alone, one process against splash attention
# at 1024 tiles): 8192 tokens 1.57 ms against 1.74 whole (splash 1.36), 32768 17.99
# against 20.39 (splash 18.07); pieces of 512 took 1.63 and 18.84.
FORWARD_CHUNK = 256
# The dk/dv kernel's tile likewise, in pieces of queries, with dropout (its flags' selects
# are two more passes over the tile). Forward + backward, v5e, bf16 causal [1, L, 8, 128],
# against the tile whole: with dropout 0.1, 8192 tokens 4.30 ms against 4.45, 32768 56.98
# against 59.13 (pieces of 512: 4.45, 58.93); without dropout 4.07 against 4.02 at 8192.
BACKWARD_CHUNK = 256
# Tiles of fewer scores are computed whole: at [512, 512] tiles, pieces cost time
# (forward + backward, v5e, causal [16, 512, 8, 64], dropout 0.1, a mask per head:
# bf16 1.287 ms in pieces against 1.215 whole, float32 1.648 against 1.613).
PIECES_FROM = 1024 * 1024
VMEM_BYTES = 64 * 2**20  # of a v5e's 128 MiB; a [1024, 1024] tile's scores and weights


@dataclasses.dataclass(frozen=True)
class Flash:
    """Everything static about one call: the tiles (a blockwise ``Plan``), whether
    segment ids are given, and whether the kernels run in the interpreter."""

    tiles: bw.Plan
    segments: bool
    interpret: bool
    stored: bool = False  # the flags drawn ahead into bits (``_flash_dropout.Bits``)
    key_padding: bool = True  # keys to mask out by their state (padded or invalid)
    fused_dq: bool = False  # the dk/dv kernel sums dq too (``_flash_tpu_calls.fuses_dq``)
    place: fd.Place | None = None  # one device's block of a sharded call, mask per head
    precision: lax.Precision = lax.Precision.DEFAULT  # of float32 products (kernel_precision)
    consistent: bool = False  # rowsum(dO * O) as the products round (``consistent``)

    @property
    def dropout(self) -> bool:
        return self.tiles.dropout

    @property
    def run_time_rate(self) -> bool:
        return self.tiles.run_time_rate

    @property
    def chunk(self) -> int:
        """The keys the forward kernel computes at once: a key tile of ``PIECES_FROM``
        scores or more in pieces of ``FORWARD_CHUNK``, where they divide it (else whole)."""
        bk = self.tiles.block_k
        return FORWARD_CHUNK if self._large and bk % FORWARD_CHUNK == 0 else bk

    @property
    def backward_chunk(self) -> int:
        """The queries the ``dk``/``dv`` kernel computes at once: with dropout, a query
        tile of ``PIECES_FROM`` scores or more in pieces of ``BACKWARD_CHUNK``, where they
        divide it into whole blocks of stored flags (``_flash_dropout.Bits``); else whole."""
        bq = self.tiles.block_q
        whole_blocks = BACKWARD_CHUNK % self.bits.rows == 0
        pieces = self.dropout and self._large and bq % BACKWARD_CHUNK == 0 and whole_blocks
        return BACKWARD_CHUNK if pieces else bq

    @property
    def _large(self) -> bool:
        """Whether a tile has ``PIECES_FROM`` scores or more (else it is computed whole)."""
        return self.tiles.block_q * self.tiles.block_k >= PIECES_FROM

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


@dataclasses.dataclass(frozen=True)
class Inputs:
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
    Inputs,
    data_fields=["q_state", "kv_state", "q_segments", "kv_segments", "flags", "scalars"],
    meta_fields=[],
)


def key_range(plan: bw.Plan, i: Any, key_tiles: Any) -> tuple[Any, Any]:
    lo, hi = bw.key_block_bounds(plan, i)
    return lo, jnp.minimum(hi, key_tiles)


def query_range(plan: bw.Plan, j: Any, key_tiles: Any) -> tuple[Any, Any]:
    lo, hi = bw.query_block_bounds(plan, j)
    return lo, jnp.where(j < key_tiles, hi, lo)


def visited(lo: Any, hi: Any, t: Any, count: int) -> Any:
    """The tile to fetch at step ``t`` of a loop over ``[lo, hi)``: ``t`` clamped into it
    (and into ``[0, count)``), so a skipped step fetches the tile already there."""
    last = jnp.maximum(hi - 1, lo)
    return jnp.clip(jnp.clip(t, lo, last), 0, count - 1)


def flag_tiles(flash: Flash, row: Any, i: Any, key_tiles: Any) -> tuple[Any, Any]:
    """The key tiles of query tile ``i`` whose flags a row of the stored flags holds:
    those some head row visits."""
    plan = flash.tiles
    if plan.broadcast_dropout:  # one mask for every batch row, whatever its padding
        return key_range(plan, i, plan.n_k)
    return key_range(plan, i, key_tiles[row // plan.heads])


def consistent(flash: Flash, dtype: Any) -> Flash:
    """``flash`` for a differentiated call: with float32 operands at the default
    precision, whose products round their operands to bfloat16, the forward kernel
    multiplies the weights by ``v`` in two products (their bfloat16 high part and the
    rest), and by ``v / keep`` where weights are dropped, so that the output, and with
    it ``rowsum(dO * O)``, is the sum the backward's ``dP`` products round to; each
    ``dP`` is taken with ``v / keep``. Otherwise that row sum misses ``rowsum(P * dP)``
    by the weights' rounding, an error every ``dS`` of the row carries (about 1.6x XLA's
    gradient error in ``dq``, emulated on a CPU). Interpreted, products do not round."""
    f32 = jnp.dtype(dtype) == jnp.dtype(jnp.float32)
    rounds = f32 and flash.precision == lax.Precision.DEFAULT and not flash.interpret
    return dataclasses.replace(flash, consistent=rounds)
