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
rounds (lane rotations and lane gathers measured slower). The select and scale run in
the same kernel, so neither the flags nor a residual reaches memory, and the
generator's work hides under the copy.

The default on a TPU with one device. On a v5e at [8192, 8192], rate 0.1, a call of
the kernel takes 1.01x / 1.09x the time of XLA's ``x * c`` (f32 / bf16, forward;
``benchmarks/bench_tpu.py``), where XLA's per-element path takes 2.10x / 4.05x; in a
4-layer Transformer train step the dropout that
``swap_dropout(attention=False)`` replaces costs 1.09x the step without dropout with
the kernel (1.35x by the XLA path, 1.57x Flax's), and adds 0.16 s to its compilation
where Flax's adds 80.8 s (``docs/dropout_speed.md``, "The TPU"). With more than one
device the XLA path stays the default: the kernel has no sharding rule yet, so under
``jit`` XLA would gather a sharded input to one device first. :func:`enabled`
(``dropmask.testing.tpu_kernels``) chooses either way, whatever the devices.

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
from ._threefry import threefry4x32

__all__ = ["TpuKernel", "kernel_for", "masked_linear", "scalars_of"]

_SPAN = 1024  # columns per delivery: 128 calls, one per lane
_CALLS = _SPAN // FIELDS.per_call  # 128
# Input bytes per grid step: 1 MiB measured as fast on a v5e; 4 MiB overflowed the
# kernel's 16 MiB of scoped VMEM.
_BLOCK_BYTES = 2 * 2**20
_U32 = np.uint32
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

Combine = Callable[[Any, jax.Array, Any], Any]


@dataclasses.dataclass(frozen=True)
class TpuKernel:
    """Everything static about one kernel; hashable (a primitive's parameter).

    Attributes:
      shape: the array's shape; the kernel sees it as ``[lead, rows, cols]``.
      dtype: float32 or bfloat16.
      value: the threshold when static (None: a run-time one in scalar memory).
      realised: the keep probability when static.
      block: ``(rows, cols)`` of a grid step.
      chunk: rows the kernel computes at a time (16 or 32).
      interpret: run in Pallas's TPU interpreter (tests on a CPU).
    """

    shape: tuple[int, ...]
    dtype: Any
    value: int | None
    realised: float | None
    block: tuple[int, int]
    chunk: int
    interpret: bool = False

    @property
    def view(self) -> tuple[int, int, int]:
        cols = self.shape[-1]
        rows = self.shape[-2] if len(self.shape) > 1 else 1
        return (math.prod(self.shape[:-2]), rows, cols)


def kernel_for(
    shape: tuple[int, ...],
    dtype: Any,
    thr: Threshold,
    *,
    interpret: bool = False,
) -> TpuKernel | None:
    """The kernel for a mask of ``shape`` over an array of ``dtype``, or None where it
    does not serve: the last axis must be the packing axis and a multiple of 128 long
    (whole vector registers), the rows of a step a multiple of the chunk, and the dtype
    float32 or bfloat16. Merging the axes before the last two is free in a TPU's tiled
    layout; any other reshape would copy the array."""
    if jnp.dtype(dtype) not in DTYPES or len(shape) == 0:
        return None
    cols = shape[-1]
    rows = shape[-2] if len(shape) > 1 else 1
    if cols % 128 or math.prod(shape) == 0:
        return None
    check_word_count((math.prod(shape) // LANES,))
    chunk = 32 if rows % 32 == 0 else 16 if rows % 16 == 0 else 0
    if not chunk:
        return None
    itemsize = jnp.dtype(dtype).itemsize
    block_cols = cols if cols <= 4 * _SPAN else 2 * _SPAN
    fit = max(chunk, _BLOCK_BYTES // (block_cols * itemsize) // chunk * chunk)
    block_rows = min(rows, fit)
    static = isinstance(thr.value, int)
    return TpuKernel(
        tuple(shape),
        jnp.dtype(dtype),
        thr.value if static else None,
        thr.realised if static else None,
        (block_rows, block_cols),
        chunk,
        interpret,
    )


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
    ``[rows, cols]``, or as ``[cols, rows]`` when ``transposed`` (the rows along lanes).

    Row ``r`` of the tile starts at word ``row_word[r] + first_word`` (``uint32``; ``row_word``
    ``[rows, 1]``, or ``[1, rows]`` when transposed); ``cols`` is a multiple of 32. Each call
    is computed once, its 8 flags packed into a byte, and the byte spread to its 8
    elements by a product on the matrix unit (exact: a byte is an integer below 256).
    """
    rows, cols = shape
    calls = cols // FIELDS.per_call
    along = 0 if transposed else 1
    grid = (calls, rows) if transposed else (rows, calls)
    m = lax.broadcasted_iota(_U32, grid, along)
    word = row_word + (jnp.asarray(first_word).astype(_U32) + (m >> _U32(2)))
    packed = call_bytes(word, m & _U32(FIELDS.calls - 1), key, thr)
    packed = packed.astype(jnp.float32).astype(jnp.bfloat16)
    spread = spread_matrix(calls, transposed=transposed)
    if transposed:
        values = jnp.dot(spread, packed, preferred_element_type=jnp.float32)
    else:
        values = jnp.dot(packed, spread, preferred_element_type=jnp.float32)
    return own_bits(values.astype(jnp.int32), along)


def _kernel(spec: TpuKernel, combine: Combine, scalars_ref: Any, x_ref: Any, o_ref: Any) -> None:
    key = [scalars_ref[i].astype(_U32) for i in range(4)]
    block_rows, block_cols = spec.block
    if spec.value is None:
        thr: Any = scalars_ref[4]
        realised_bits = jnp.full((1, 1), scalars_ref[5], jnp.int32)
        realised: Any = lax.bitcast_convert_type(realised_bits, jnp.float32)
    else:
        thr, realised = np.int32(spec.value), spec.realised
    _, rows, cols = spec.view
    words_per_row = cols // LANES
    first_row = pl.program_id(0) * rows + pl.program_id(1) * block_rows
    first_word = pl.program_id(2) * (block_cols // LANES)
    ch = spec.chunk
    spread = spread_matrix()

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
                preferred_element_type=jnp.float32,
            ).astype(jnp.int32)
            cols_ = pl.ds(s0, width)
            o_ref[0, pl.ds(r0, ch), cols_] = combine(
                x_ref[0, pl.ds(r0, ch), cols_], own_bits(values[:, :width]), realised
            ).astype(o_ref.dtype)
        return carry

    lax.fori_loop(0, block_rows // ch, step, 0)


def _pallas(spec: TpuKernel, combine: Combine, x: jax.Array, scalars: jax.Array) -> jax.Array:
    lead, rows, cols = spec.view
    block_rows, block_cols = spec.block
    grid = (lead, pl.cdiv(rows, block_rows), pl.cdiv(cols, block_cols))
    block = pl.BlockSpec((1, block_rows, block_cols), lambda b, i, j: (b, i, j))
    out = pl.pallas_call(
        functools.partial(_kernel, spec, combine),
        grid=grid,
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), block],
        out_specs=block,
        out_shape=jax.ShapeDtypeStruct(spec.view, x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")
        ),
        interpret=spec.interpret,
    )(scalars, x.reshape(spec.view))
    return out.reshape(spec.shape)


def scalars_of(words: jax.Array, thr: Threshold) -> jax.Array:
    """The kernel's scalar operands (int32): the key words, then for a run-time rate the
    threshold and the bits of the realised keep probability."""
    parts = [lax.bitcast_convert_type(words.astype(_U32), jnp.int32)]
    if not isinstance(thr.value, int):
        parts.append(jnp.reshape(thr.value.astype(jnp.int32), (1,)))
        realised = jnp.asarray(thr.realised, jnp.float32)
        parts.append(jnp.reshape(lax.bitcast_convert_type(realised, jnp.int32), (1,)))
    return jnp.concatenate(parts)


def _xla_path(x: jax.Array, scalars: jax.Array, spec: TpuKernel, combine: Combine) -> jax.Array:
    """What the kernel computes, by XLA (the same bits): under ``vmap``, and where the
    kernel fails to lower. ``scalars`` as :func:`scalars_of` made them."""
    words = lax.bitcast_convert_type(scalars[:4], _U32)
    if spec.value is None:
        realised = lax.bitcast_convert_type(scalars[5], jnp.float32)
        thr = Threshold(scalars[4].astype(_U32), realised)
    else:
        thr = Threshold(spec.value, spec.realised)
    flags = keep_from_words(words, spec.shape, thr, path="per_element")
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
    del scalars, params
    return jax.core.ShapedArray(x.shape, x.dtype)


def _lower(ctx: Any, x: Any, scalars: Any, *, spec: Any, combine: Any) -> Any:
    """The kernel, or where it fails to lower (a Mosaic that lacks an op it uses), the XLA
    path, which draws the same mask."""
    try:
        kernel = lambda x, s: _pallas(spec, combine, x, s)  # noqa: E731
        return mlir.lower_fun(kernel, multiple_results=False)(ctx, x, scalars)
    except Exception:  # noqa: BLE001 - any lowering failure falls back, never crashes
        xla = lambda x, s: _xla_path(x, s, spec, combine)  # noqa: E731
        return mlir.lower_fun(xla, multiple_results=False)(ctx, x, scalars)


def _jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    x, scalars = primals
    tx, _ = tangents
    out = masked_linear_p.bind(x, scalars, **params)
    if type(tx) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)  # pyright: ignore[reportAttributeAccessIssue]
    return out, masked_linear_p.bind(tx, scalars, **params)


def _transpose(ct: Any, x: Any, scalars: Any, **params: Any) -> Any:
    del x
    if type(ct) is ad.Zero:
        return [ad.Zero(ct.aval), None]
    return [masked_linear_p.bind(ct, scalars, **params), None]


def _batch(args: Any, dims: Any, *, spec: Any, combine: Any) -> Any:
    out = jax.vmap(lambda x, s: _xla_path(x, s, spec, combine), in_axes=dims)(*args)
    return out, 0


masked_linear_p.def_abstract_eval(_abstract)
mlir.register_lowering(masked_linear_p, _lower)
ad.primitive_jvps[masked_linear_p] = _jvp
ad.primitive_transposes[masked_linear_p] = _transpose
batching.primitive_batchers[masked_linear_p] = _batch
