"""The ``"fast"`` mask on a TPU: a Pallas (Mosaic) kernel that draws it where dropout uses it.

The mask is ``_fast_mask``'s, bit for bit. Along a packing axis that is the last axis
and a multiple of 32 long, element ``(r, c)`` of the array seen as ``[rows, n]`` lies in
word ``r * n / 32 + c // 32``, whose four Threefry-4x32-13 calls ``j`` at counters
``(word, j, 0, 0)`` give 8 fields of 16 bits each; the element compares field ``c % 8``
of call ``(c % 32) // 8`` with the integer threshold. So 8 neighbouring lanes share one
call.

XLA's paths on a TPU draw this mask compute-bound (each element computes a call, or a
packed word is unpacked across lanes). The kernel computes each call once and delivers
its 8 flags to their 8 lanes: it takes 1024 columns of a chunk of rows at a time (128
calls a row, one per lane of a vector register), compares the 8 fields of each call and
packs their flags into one byte, then spreads each byte to its 8 lanes, where each lane
tests its own bit. The spread is a product on the matrix unit, ``bytes [rows, 128] @
spread [128, 1024]`` with ``spread[m, c] = (c // 8 == m)``, exact in bfloat16 (a byte
is an integer below 256) with a float32 result, so the vector unit is left to the
rounds (lane rotations and lane gathers measured slower). A block narrower than 1024
columns (197 keys padded to 256, a width of 768) has fewer than 128 calls a row, which
would leave lanes idle: there 128 rows run along the lanes and each row's calls down
the sublanes, and the product ``bytes^T @ spread`` spreads them (``rows_along_lanes``).
The select and scale run in the same kernel, so neither the flags nor a residual reaches
memory, and the generator's work hides under the copy.

The default on a TPU, with any number of devices (``_placement``). On a v5e at [8192,
8192], rate 0.1, a call of the kernel takes 1.01x / 1.09x the time of XLA's ``x * c``
(f32 / bf16, forward; ``benchmarks/bench_tpu.py``), where XLA's per-element path takes
2.10x / 4.05x; in a 4-layer Transformer train step the dropout that
``swap_dropout(attention=False)`` replaces costs 1.09x the step without dropout with
the kernel (1.35x by the XLA path, 1.57x Flax's) at [16, 1024, 1024], and adds 0.16 s
to its compilation where Flax's adds 80.8 s (``docs/dropout_speed.md``, "The TPU").
The platform is chosen when the program is lowered: lowered for a TPU the kernel, for
any other platform XLA's path, the same bits. Many devices: under a mesh of explicit
axes the primitive takes the whole array and its sharding (``TpuKernel.split``) and
lowers to the kernel on each device's block inside ``shard_map``, each block drawing at
its global place (a block's offsets, scalar operands); inside a user's ``shard_map`` it
takes the block and the offsets given; a program XLA partitions itself takes XLA's path.

No ``input_output_aliases``. Aliasing the output to ``x`` lets the kernel write over
its input, which a timing loop that feeds each output back in rewards (f32 forward
0.82 ms, as ``x * c``, against 1.62 without, where XLA copies the carry each pass); but
a call whose input is not donated then gets a copy of ``x`` first (2.28 ms against
1.42). In the train step neither copy appears, and aliasing changed nothing. So the
kernel writes a fresh output.

Differentiation. Dropout's combine is linear in ``x`` and diagonal, so it is its own
transpose: the kernel is bound as a linear primitive, whose tangent (``jax.jvp``) and
cotangent (``jax.grad``) are the same kernel applied to ``t`` or ``g`` with the same key
(the backward pass draws the mask again rather than reading a residual). Under ``vmap``,
and where the kernel fails to lower, the primitive computes the same values by XLA.
Dropout over a whole mask takes this path only where it is not differentiated; where
it is, the flags kernel's bytes and XLA's select, which fuse into a train step's ops
(``_draw._kernel_or_bytes``, ``_tpu_flags``), on each device's block too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from ._fast_mask import FIELDS, LANES, Threshold, check_word_count, keep_from_words
from ._placement import mosaic_lowers_here
from ._sharding import Block, block_from_spec
from ._threefry import threefry4x32

__all__ = [
    "TpuKernel",
    "kernel_for",
    "masked_linear",
    "scalars_of",
    "self_transposed",
    "with_offsets",
]

_SPAN = 1024  # columns per delivery: 128 calls, one per lane
_CALLS = _SPAN // FIELDS.per_call  # 128
# Input bytes per grid step: 1 MiB measured as fast on a v5e; 4 MiB overflowed the
# kernel's 16 MiB of scoped VMEM.
_BLOCK_BYTES = 2 * 2**20
_U32 = np.uint32
# The spreading product of bytes (integers below 256, exact in bfloat16 in one pass) on
# the matrix unit, named: a user's jax.default_matmul_precision("highest") would otherwise
# reach it and ask Mosaic for a float32 contraction of bfloat16 operands, which it refuses.
_ONE_PASS = lax.Precision.DEFAULT
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

Combine = Callable[[Any, jax.Array, Any], Any]


@dataclasses.dataclass(frozen=True)
class TpuKernel:
    """Everything static about one kernel; hashable (a primitive's parameter).

    Attributes:
      shape: the array's shape; the kernel sees it as ``[lead, rows, cols]``.
      dtype: float32 or bfloat16 (int8 for the flags kernel's output, ``_tpu_flags``).
      value: the threshold when static (None: a run-time one in scalar memory).
      realised: the keep probability when static.
      block: ``(rows, cols)`` of a grid step.
      chunk: rows the kernel computes at a time: 16 or 32, or 128 along the lanes in a
        block narrower than 1024 columns (:func:`chunk_rows`).
      interpret: lowered for a platform other than a TPU, run the kernel in Pallas's
        TPU interpreter (tests on a CPU) rather than take XLA's path.
      global_shape: where the array is one device's block of a larger one, that
        array's shape; the block's offset per axis is then a run-time scalar operand.
      split: ``(mesh, spec)`` where the primitive takes the whole array, sharded as
        ``spec`` over a mesh of explicit axes: lowered, the kernel runs on each device's
        block (``shape``) inside ``shard_map``, which adds the block's offsets to the
        scalars there; the primitive's own scalars then carry none.
      width: the mask's last axis where the kernel's columns pad it (a kernel that
        writes flags only, ``_tpu_flags``); words are numbered by it.
    """

    shape: tuple[int, ...]
    dtype: Any
    value: int | None
    realised: float | None
    block: tuple[int, int]
    chunk: int
    interpret: bool = False
    global_shape: tuple[int, ...] | None = None
    split: tuple[Any, Any] | None = None
    width: int | None = None

    @property
    def words_per_row(self) -> int:
        """Words of a row of the mask (whole, where ``shape`` is a device's block): the
        packing axis's length, ``width`` where the kernel's columns pad it, over 32
        rounded up (a row's last word may be part padding)."""
        cols = self.width or (self.global_shape or self.shape)[-1]
        return -(-cols // LANES)

    @property
    def narrow(self) -> bool:
        """Whether a block is one delivery narrower than 1024 columns, drawn with its rows
        along lanes (:func:`rows_along_lanes`), a chunk of 128 rows at a time."""
        return rows_along_lanes(self.chunk, self.block[1])

    @property
    def view(self) -> tuple[int, int, int]:
        return _view(self.shape)

    @property
    def offsets(self) -> int:
        """How many offset scalars follow the key words in the kernel: one per axis of a
        block."""
        return 0 if self.global_shape is None else len(self.shape)

    def on_each_device(self, run: Callable[[Any, jax.Array, jax.Array], Any]) -> Any:
        """``run(spec, x, scalars)`` as a function of the primitive's operands: itself, or
        with :attr:`split`, on each device's block inside ``shard_map`` with the block's
        offsets spliced into its scalars (``spec`` then the block's)."""
        if self.split is None:
            return lambda x, scalars: run(self, x, scalars)
        mesh, spec = self.split
        local = dataclasses.replace(self, split=None)

        def body(x: jax.Array, scalars: jax.Array) -> Any:
            return run(local, x, with_offsets(scalars, x.shape, spec, self.global_shape))

        replicated = jax.sharding.PartitionSpec()
        return jax.shard_map(
            body, mesh=mesh, in_specs=(spec, replicated), out_specs=spec, check_vma=False
        )


def with_offsets(
    scalars: jax.Array, local: tuple[int, ...], spec: Any, mask: tuple[int, ...] | None = None
) -> jax.Array:
    """:func:`scalars_of`'s operands made without offsets, with this device's block's
    offsets spliced in after the key words: inside ``shard_map``, for a block of shape
    ``local`` of an array sharded as ``spec`` (a ``PartitionSpec``). ``mask``: the whole
    mask's shape where it broadcasts along some of the array's axes (1 there), whose
    offsets are then 0 (each device draws the mask whole along them)."""
    block = block_from_spec(local, spec, caller="dropout")
    offsets = (
        block.offset
        if mask is None
        else [0 if size == 1 else o for size, o in zip(mask, block.offset, strict=True)]
    )
    offset = jnp.stack([jnp.asarray(o, jnp.int32) for o in offsets])
    return jnp.concatenate([scalars[:4], offset, scalars[4:]])


def _view(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``shape`` as ``[lead, rows, cols]``: the axes before the last two merged (free in a
    TPU's tiled layout)."""
    cols = shape[-1]
    rows = shape[-2] if len(shape) > 1 else 1
    return (math.prod(shape[:-2]), rows, cols)


def kernel_for(
    shape: tuple[int, ...],
    dtype: Any,
    thr: Threshold,
    *,
    interpret: bool = False,
    global_shape: tuple[int, ...] | None = None,
) -> TpuKernel | None:
    """The kernel for a mask of ``shape`` over an array of ``dtype``, or None where it
    does not serve: the last axis must be the packing axis and a multiple of 128 long
    (whole vector registers), and the dtype float32 or bfloat16. Merging the axes before
    the last two is free in a TPU's tiled layout; any other reshape would copy the array.

    Any row count: a grid step takes whole chunks of rows, and where the array's last
    block is shorter (197 tokens), Pallas reads it padded and writes back only its rows;
    the padding's rows are computed and dropped (at most 31 a block). The kernel body
    would pad a short last axis the same way, but a block that overhangs the lanes has
    not been run through Mosaic on a TPU, so such widths (and the shapes and dtypes this
    kernel does not take) draw their flags with ``_tpu_flags``' kernel, whose output pads
    its columns, and XLA's select reads them (``_draw._by_flags``).

    ``global_shape``: ``shape`` is one device's block of an array of that shape (same
    rank). The caller guarantees that the block's offset along the last axis is a
    multiple of 32 (a whole number of words), as an even split of 128-lane rows is."""
    if jnp.dtype(dtype) not in DTYPES or len(shape) == 0:
        return None
    cols = shape[-1]
    rows = shape[-2] if len(shape) > 1 else 1
    if cols % 128 or math.prod(shape) == 0:
        return None
    if global_shape is not None and len(global_shape) != len(shape):
        return None
    check_word_count((math.prod(global_shape or shape) // LANES,))
    itemsize = jnp.dtype(dtype).itemsize
    block_cols = cols if cols <= 4 * _SPAN else 2 * _SPAN
    chunk = chunk_rows(rows, block_cols, 16 if rows % 32 and rows % 16 == 0 else 32)
    fit = max(chunk, _BLOCK_BYTES // (block_cols * itemsize) // chunk * chunk)
    block_rows = min(-(-rows // chunk) * chunk, fit)
    static = isinstance(thr.value, int)
    return TpuKernel(
        tuple(shape),
        jnp.dtype(dtype),
        thr.value if static else None,
        thr.realised if static else None,
        (block_rows, block_cols),
        chunk,
        interpret,
        None if global_shape is None else tuple(global_shape),
    )


def chunk_rows(rows: int, block_cols: int, short: int) -> int:
    """Rows a grid step of ``block_cols`` columns computes at a time: ``short``, a row's
    calls along the lanes, or 128 rows along the lanes (:func:`rows_along_lanes`) where
    a block is narrower than one delivery and that computes fewer calls: a row's ``c <
    128`` calls leave ``128 - c`` lanes idle, where chunks of 128 rows pad ``rows``
    further (197 rows of 197 columns: 256 x 32 calls against 224 x 128)."""
    if block_cols >= _SPAN:
        return short
    along_lanes = -(-rows // 128) * 128 * (block_cols // FIELDS.per_call)
    along_calls = -(-rows // short) * short * _CALLS
    return 128 if along_lanes < along_calls else short


def call_bytes(word: jax.Array, call: jax.Array, key: list[jax.Array], thr: Any) -> jax.Array:
    """``int32``, one per Threefry call at counter ``(word, call, 0, 0)`` (``uint32``
    arrays of one shape): the keep-flags of its 8 fields, bit ``f`` for field ``f``."""
    outs = threefry4x32((word, call, _U32(0), _U32(0)), key)
    packed = None
    for f in range(FIELDS.per_call):
        _, o, bit = FIELDS.locate(f)
        field = outs[o] >> _U32(bit) if bit else outs[o] & _U32(2**FIELDS.nbits - 1)
        keep = jnp.where(field.astype(jnp.int32) < thr, np.int32(1 << f), np.int32(0))
        packed = keep if packed is None else packed | keep
    assert packed is not None
    return packed


def _call_bytes(word0: Any, key: list[jax.Array], thr: Any, rows: int) -> jax.Array:
    """``int32[rows, 128]``: the flag bytes of 128 consecutive calls of each row;
    ``word0`` (``uint32[rows, 1]``) is each row's first word."""
    lane = lax.broadcasted_iota(_U32, (rows, _CALLS), 1)
    return call_bytes(word0 + (lane >> _U32(2)), lane & _U32(FIELDS.calls - 1), key, thr)


def spread_matrix(calls: int = _CALLS, *, transposed: bool = False) -> jax.Array:
    """``bf16[calls, 8 * calls]``: 1 where column ``c`` reads call ``m`` (``c // 8 == m``);
    its transpose when ``transposed``."""
    shape = (8 * calls, calls) if transposed else (calls, 8 * calls)
    m = lax.broadcasted_iota(jnp.int32, shape, 1 if transposed else 0)
    c = lax.broadcasted_iota(jnp.int32, shape, 0 if transposed else 1)
    return jnp.where((c >> 3) == m, 1.0, 0.0).astype(jnp.bfloat16)


def own_bits(spread: jax.Array, axis: int = 1) -> jax.Array:
    """Each element's own bit (``c % 8``, ``c`` its index along ``axis``) of the byte
    spread to it, moved to the sign."""
    c = lax.broadcasted_iota(jnp.int32, spread.shape, axis)
    return (spread << (31 - (c & 7))) < 0


def keep_tile(
    key: list[jax.Array],
    thr: Any,
    row_word: Any,
    first_word: Any,
    shape: tuple[int, int],
    *,
    transposed: bool = False,
) -> jax.Array:
    """``bool``: the keep-flags of a tile of rows whose packing axis is the last axis, as
    ``[rows, cols]``, or as ``[cols, rows]`` when ``transposed``.

    Row ``r`` of the tile starts at word ``row_word[r] + first_word`` (``uint32``);
    ``cols`` is a multiple of 32. Each call is computed once, its 8 flags packed into a
    byte, and the byte spread to its 8 elements by a product on the matrix unit (exact: a
    byte is an integer below 256). ``row_word`` is ``[rows, 1]`` or ``[1, rows]``, which
    says how the calls are laid out: with ``[rows, 1]`` a row's calls run along the
    lanes, with ``[1, rows]`` the rows do (and a row's calls down the sublanes), which a
    transposed tile needs, and which an untransposed one narrower than 1024 columns
    wants where its rows fill the lanes (:func:`rows_along_lanes`): its fewer than 128
    calls a row would leave lanes idle.
    """
    rows, cols = shape
    calls = cols // FIELDS.per_call
    on_lanes = transposed or (rows > 1 and jnp.shape(row_word) == (1, rows))
    grid = (calls, rows) if on_lanes else (rows, calls)
    m = lax.broadcasted_iota(_U32, grid, 0 if on_lanes else 1)
    word = row_word + (jnp.asarray(first_word).astype(_U32) + (m >> _U32(2)))
    packed = call_bytes(word, m & _U32(FIELDS.calls - 1), key, thr)
    packed = packed.astype(jnp.float32).astype(jnp.bfloat16)
    spread = spread_matrix(calls, transposed=transposed)
    if transposed:  # spread^T @ packed: [cols, rows]
        values = jnp.dot(spread, packed, precision=_ONE_PASS, preferred_element_type=jnp.float32)
    elif on_lanes:  # packed^T @ spread: [rows, cols]
        values = lax.dot_general(
            packed,
            spread,
            (((0,), (0,)), ((), ())),
            precision=_ONE_PASS,
            preferred_element_type=jnp.float32,
        )
    else:
        values = jnp.dot(packed, spread, precision=_ONE_PASS, preferred_element_type=jnp.float32)
    return own_bits(values.astype(jnp.int32), 0 if transposed else 1)


def rows_along_lanes(rows: int, cols: int) -> bool:
    """Whether :func:`keep_tile` should compute an untransposed ``[rows, cols]`` tile with
    its rows along the lanes: a row of fewer than 1024 columns has fewer than 128 calls,
    which along the lanes would leave some idle, and the rows fill whole registers of
    lanes. On a v5e, flags of ViT-B's attention weights ([64, 12, 197, 197], bf16 rate
    0.1) took 0.90 ms against 1.54 with the calls along lanes, BERT-base's ([32, 12,
    512, 512]) 0.94 against 1.62, and [64, 197, 768] 0.21 against 0.23."""
    return cols < _SPAN and rows % 128 == 0


def _first_row(spec: TpuKernel, scalars_ref: Any, lead: Any) -> Any:
    """The global row (of the array seen as ``[rows, cols]``) of local lead index
    ``lead``'s first row: its own where the array is whole; else the local lead
    coordinates, unravelled, plus the block's offsets, ravelled in the global shape."""
    _, rows, _ = spec.view
    if spec.global_shape is None:
        return lead * rows
    offset = [scalars_ref[4 + axis] for axis in range(len(spec.shape))]
    lead_shape, global_lead = spec.shape[:-2], spec.global_shape[:-2]
    global_index: Any = 0
    for axis, (size, whole) in enumerate(zip(lead_shape, global_lead, strict=True)):
        coord = lead // math.prod(lead_shape[axis + 1 :]) % size
        global_index = global_index * whole + coord + offset[axis]
    global_rows = _view(spec.global_shape)[1]
    row_offset = offset[-2] if len(spec.shape) > 1 else 0
    return global_index * global_rows + row_offset


def _kernel(spec: TpuKernel, combine: Combine, scalars_ref: Any, *refs: Any) -> None:
    """One grid step: ``combine(x, flags, realised)`` into the output block, or with no
    ``x`` operand (``refs`` the output alone) ``combine(None, flags, realised)``."""
    x_ref, o_ref = refs if len(refs) == 2 else (None, refs[0])
    key = [scalars_ref[i].astype(_U32) for i in range(4)]
    block_rows, block_cols = spec.block
    if spec.value is None:
        at = 4 + spec.offsets
        thr: Any = scalars_ref[at]
        realised_bits = jnp.full((1, 1), scalars_ref[at + 1], jnp.int32)
        realised: Any = lax.bitcast_convert_type(realised_bits, jnp.float32)
    else:
        thr, realised = np.int32(spec.value), spec.realised
    words_per_row = spec.words_per_row
    first_row = _first_row(spec, scalars_ref, pl.program_id(0)) + pl.program_id(1) * block_rows
    first_word = pl.program_id(2) * (block_cols // LANES)
    if spec.global_shape is not None:
        first_word = first_word + scalars_ref[3 + spec.offsets] // LANES
    ch = spec.chunk
    spread = spread_matrix()

    def narrow(c: Any, carry: Any) -> Any:
        # A block narrower than one delivery: its rows along lanes (rows_along_lanes).
        r0 = pl.multiple_of(c * ch, ch)
        row = first_row + r0 + lax.broadcasted_iota(jnp.int32, (1, ch), 1)
        row_word = row.astype(_U32) * _U32(words_per_row)
        flags = keep_tile(key, thr, row_word, first_word, (ch, block_cols))
        x = None if x_ref is None else x_ref[0, pl.ds(r0, ch), :]
        o_ref[0, pl.ds(r0, ch), :] = combine(x, flags, realised).astype(o_ref.dtype)
        return carry

    def step(c: Any, carry: Any) -> Any:
        r0 = pl.multiple_of(c * ch, ch)
        row = first_row + r0 + lax.broadcasted_iota(jnp.int32, (ch, 1), 0)
        for s0 in range(0, block_cols, _SPAN):
            width = min(_SPAN, block_cols - s0)
            word0 = row.astype(_U32) * _U32(words_per_row) + (first_word + s0 // LANES).astype(_U32)
            packed = _call_bytes(word0, key, thr, ch)
            values = jnp.dot(
                packed.astype(jnp.float32).astype(jnp.bfloat16),
                spread,
                precision=_ONE_PASS,
                preferred_element_type=jnp.float32,
            ).astype(jnp.int32)
            cols_ = pl.ds(s0, width)
            x = None if x_ref is None else x_ref[0, pl.ds(r0, ch), cols_]
            o_ref[0, pl.ds(r0, ch), cols_] = combine(
                x, own_bits(values[:, :width]), realised
            ).astype(o_ref.dtype)
        return carry

    lax.fori_loop(0, block_rows // ch, narrow if spec.narrow else step, 0)


def _pallas(
    spec: TpuKernel, combine: Combine, x: jax.Array, scalars: jax.Array, *, interpret: bool
) -> jax.Array:
    lead, rows, cols = spec.view
    block_rows, block_cols = spec.block
    # Inside shard_map the output varies where ``x`` or the offsets do (as _abstract says).
    extra = tuple(sorted(_varying(jax.typeof(scalars)) - _varying(jax.typeof(x))))
    if extra:
        x = lax.pcast(x, extra, to="varying")
    grid = (lead, pl.cdiv(rows, block_rows), pl.cdiv(cols, block_cols))
    block = pl.BlockSpec((1, block_rows, block_cols), lambda b, i, j: (b, i, j))
    out = pl.pallas_call(
        functools.partial(_kernel, spec, combine),
        grid=grid,
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), block],
        out_specs=block,
        out_shape=jax.ShapeDtypeStruct(
            spec.view, x.dtype, manual_axis_type=getattr(jax.typeof(x), "mat", None)
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")
        ),
        interpret=interpret,
    )(scalars, x.reshape(spec.view))
    return out.reshape(spec.shape)


def scalars_of(words: jax.Array, thr: Threshold, offset: tuple[Any, ...] = ()) -> jax.Array:
    """The kernel's scalar operands (int32): the key words, a block's offset per axis
    (where the array is one device's block), then for a run-time rate the threshold and
    the bits of the realised keep probability."""
    parts = [lax.bitcast_convert_type(words.astype(_U32), jnp.int32)]
    if offset:
        parts.append(jnp.stack([jnp.asarray(o, jnp.int32) for o in offset]))
    if not isinstance(thr.value, int):
        parts.append(jnp.reshape(thr.value.astype(jnp.int32), (1,)))
        realised = jnp.asarray(thr.realised, jnp.float32)
        parts.append(jnp.reshape(lax.bitcast_convert_type(realised, jnp.int32), (1,)))
    return jnp.concatenate(parts)


def words_and_threshold(scalars: jax.Array, spec: TpuKernel) -> tuple[jax.Array, Threshold]:
    """The key words (``uint32[4]``) and the threshold in :func:`scalars_of`'s operands
    for ``spec``."""
    words = lax.bitcast_convert_type(scalars[:4], _U32)
    if spec.value is not None:
        return words, Threshold(spec.value, spec.realised)
    at = 4 + spec.offsets
    realised = lax.bitcast_convert_type(scalars[at + 1], jnp.float32)
    return words, Threshold(scalars[at].astype(_U32), realised)


def _xla_path(x: jax.Array, scalars: jax.Array, spec: TpuKernel, combine: Combine) -> jax.Array:
    """What the kernel computes, by XLA (the same bits): under ``vmap``, and where the
    kernel fails to lower. ``scalars`` as :func:`scalars_of` made them; with
    ``spec.split``, the whole array's mask (no block)."""
    if spec.split is not None:  # the whole mask: its global shape (x's, or broadcast)
        spec = dataclasses.replace(spec, shape=spec.global_shape, global_shape=None, split=None)
    words, thr = words_and_threshold(scalars, spec)
    block = None
    if spec.global_shape is not None:
        block = Block(spec.global_shape, tuple(scalars[4 + a] for a in range(spec.offsets)))
    flags = keep_from_words(words, spec.shape, thr, block, path="per_element")
    return combine(x, flags, thr.realised)


# The kernel as a primitive, linear in ``x``: ``jax.jvp`` and ``jax.grad`` apply the same
# kernel to the tangent or cotangent (a pallas_call has neither rule of its own).
masked_linear_p = jex_core.Primitive("dropmask_tpu_masked_linear")


def masked_linear(
    x: jax.Array, scalars: jax.Array, *, spec: TpuKernel, combine: Combine
) -> jax.Array:
    """``combine(x, keep, realised)`` with the keep-flags drawn inside the kernel.

    ``combine`` must be linear in ``x`` and diagonal (dropout's select and scale), so
    that it is its own transpose.
    """
    return masked_linear_p.bind(x, scalars, spec=spec, combine=combine)


def _abstract(x: Any, scalars: Any, **params: Any) -> Any:
    """``x``'s type (shape, dtype, sharding), varying inside ``shard_map`` over the mesh
    axes that ``x`` or the scalars (a block's offsets) vary over."""
    del params
    varying = _varying(x) | _varying(scalars)
    if varying == _varying(x):
        return x
    return x.update_manual_axis_type(x.mat.update(varying=varying))


def _varying(aval: Any) -> frozenset[str]:
    """The mesh axes a value varies over inside ``shard_map`` (none outside)."""
    mat = getattr(aval, "mat", None)
    return frozenset() if mat is None else mat.varying


def _lower_xla(ctx: Any, x: Any, scalars: Any, *, spec: Any, combine: Any) -> Any:
    xla = spec.on_each_device(lambda spec, x, s: _xla_path(x, s, spec, combine))
    return mlir.lower_fun(xla, multiple_results=False)(ctx, x, scalars)


def _lower_kernel(ctx: Any, x: Any, scalars: Any, *, spec: Any, combine: Any, interpret: bool):
    kernel = spec.on_each_device(
        lambda spec, x, s: _pallas(spec, combine, x, s, interpret=interpret)
    )
    return mlir.lower_fun(kernel, multiple_results=False)(ctx, x, scalars)


def _lower_tpu(ctx: Any, x: Any, scalars: Any, *, spec: Any, combine: Any) -> Any:
    """Lowered for a TPU: the kernel, compiled, where Mosaic can lower it (one device;
    each device's block inside ``shard_map``, the user's or ``spec.split``'s; not a
    program XLA partitions itself), or where it fails to lower (a Mosaic that lacks an
    op it uses), XLA's path, which draws the same mask."""
    if spec.split is not None or mosaic_lowers_here(ctx):
        try:
            return _lower_kernel(ctx, x, scalars, spec=spec, combine=combine, interpret=False)
        except Exception:  # noqa: BLE001 - any lowering failure falls back, never crashes
            pass
    return _lower_xla(ctx, x, scalars, spec=spec, combine=combine)


def _lower_elsewhere(ctx: Any, x: Any, scalars: Any, *, spec: Any, combine: Any) -> Any:
    """Lowered for another platform (a CPU computation on a TPU host, one platform of a
    multi-platform export): XLA's path, or where the kernels are forced on off a TPU
    (tests), the kernel in Pallas's TPU interpreter. The interpreter cannot run inside a
    ``shard_map`` that checks varying axes (its loops start from values that vary over
    none); there too XLA's path draws the same mask."""
    if spec.interpret:
        try:
            return _lower_kernel(ctx, x, scalars, spec=spec, combine=combine, interpret=True)
        except Exception:  # noqa: BLE001 - the interpreter's limits fall back, never crash
            pass
    return _lower_xla(ctx, x, scalars, spec=spec, combine=combine)


def self_transposed(prim: jex_core.Primitive) -> None:
    """Registers the autodiff rules of ``prim(x, scalars, **params)``, linear in ``x`` and
    diagonal (``scalars`` not differentiated): its tangent and its cotangent are ``prim``
    applied to ``t`` or ``g`` with the same ``scalars``."""

    def jvp(primals: Any, tangents: Any, **params: Any) -> Any:
        (x, scalars), (tx, _) = primals, tangents
        out = prim.bind(x, scalars, **params)
        if type(tx) is ad.Zero:
            return out, ad.Zero.from_primal_value(out)  # pyright: ignore[reportAttributeAccessIssue]
        return out, prim.bind(tx, scalars, **params)

    def transpose(ct: Any, x: Any, scalars: Any, **params: Any) -> Any:
        del x
        if type(ct) is ad.Zero:
            return [ad.Zero(ct.aval), None]
        return [prim.bind(ct, scalars, **params), None]

    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose


def _batch(args: Any, dims: Any, *, spec: Any, combine: Any) -> Any:
    out = jax.vmap(lambda x, s: _xla_path(x, s, spec, combine), in_axes=dims)(*args)
    return out, 0


masked_linear_p.def_abstract_eval(_abstract)
mlir.register_lowering(masked_linear_p, _lower_elsewhere)
mlir.register_lowering(masked_linear_p, _lower_tpu, platform="tpu")
self_transposed(masked_linear_p)
batching.primitive_batchers[masked_linear_p] = _batch
