"""Experimental, not used by dropmask: dropout as one fused Pallas (Triton) GPU kernel.

Each Threefry-4x32 call serves the ``E`` consecutive elements that the "fast" mask
assigns to it (8 at 16 bits per element), so the kernel reads ``x`` and writes ``y``
once and generates the mask in registers; it gives the same output as
``dropmask.dropout`` bit for bit. Three layouts of the ``[N / E, E]`` view are kept
for measurement:

* ``"rows"``: a ``[rows, E]`` block; the call's words are broadcast along the row.
* ``"columns"``: the block is handled one column at a time (``E`` strided ``[rows]``
  loads and stores), so each call is computed once per row in a 1-D layout.
* ``"joined"``: each call's ``E`` fields are computed on ``[rows]`` vectors and put
  side by side with ``jnp.stack`` pairs (Triton's ``join``, which keeps the new axis in
  one thread's registers), then reshaped to ``[rows, E]``: meant to give one thread a
  whole call, where ``"rows"`` seems to split an f32 call over two threads. Not yet
  timed on a GPU.

Static rates, ``x.shape[-1] % 32 == 0``, no ``broadcast_dims``; forward only (the
backward pass of dropout is the same kernel applied to the cotangent).

Its times on a GPU are in ``benchmarks/RESULTS.md`` (``python -m benchmarks.bench_gpu``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from dropmask import testing
from dropmask.testing import threefry4x32

_U32 = jnp.uint32


def _log2(n: int) -> int:
    return int(math.log2(n))


def _call_words(words_ref: Any, rows: int, calls_per_word: int) -> list[jax.Array]:
    """The four output words of the ``rows`` Threefry calls of this program."""
    call = (pl.program_id(0) * rows + jnp.arange(rows, dtype=jnp.int32)).astype(_U32)
    word = call >> _U32(_log2(calls_per_word)) if calls_per_word > 1 else call
    j = call & _U32(calls_per_word - 1)
    zero = jnp.zeros_like(call)
    return threefry4x32((word, j, zero, zero), [words_ref[i] for i in range(4)])


def _apply(x: jax.Array, field: jax.Array, nbits: int, thr: int, scale: float) -> jax.Array:
    if nbits < 32:
        field = field & _U32(2**nbits - 1)
    y = x.astype(jnp.float32) * jnp.float32(scale)
    return jnp.where(field < _U32(thr), y, jnp.float32(0)).astype(x.dtype)


def _rows_kernel(words_ref, x_ref, o_ref, *, rows, calls_per_word, nbits, thr, scale):
    width = x_ref.shape[1]
    outs = _call_words(words_ref, rows, calls_per_word)
    col = jnp.arange(width, dtype=jnp.int32)[None, :].astype(_U32)
    per_output = 32 // nbits
    o = col >> _U32(_log2(per_output))
    chosen = jnp.broadcast_to(outs[0][:, None], (rows, width))
    for k in range(1, 4):
        chosen = jnp.where(o == _U32(k), outs[k][:, None], chosen)
    if per_output > 1:
        chosen = chosen >> ((col & _U32(per_output - 1)) * _U32(nbits))
    o_ref[...] = _apply(x_ref[...], chosen, nbits, thr, scale)


def _columns_kernel(words_ref, x_ref, o_ref, *, rows, calls_per_word, nbits, thr, scale):
    width = x_ref.shape[1]
    outs = _call_words(words_ref, rows, calls_per_word)
    per_output = 32 // nbits
    for k in range(width):
        field = outs[k // per_output]
        bit = (k % per_output) * nbits
        if bit:
            field = field >> _U32(bit)
        o_ref[:, k] = _apply(x_ref[:, k], field, nbits, thr, scale)


def _side_by_side(fields: list[jax.Array]) -> jax.Array:
    """``[rows, 2, ..., 2]`` whose row-major flattening lists ``fields`` in order."""
    if len(fields) == 1:
        return fields[0]
    return jnp.stack([_side_by_side(fields[0::2]), _side_by_side(fields[1::2])], axis=-1)


def _joined_kernel(words_ref, x_ref, o_ref, *, rows, calls_per_word, nbits, thr, scale):
    width = x_ref.shape[1]
    outs = _call_words(words_ref, rows, calls_per_word)
    per_output = 32 // nbits
    fields = []
    for k in range(width):
        field = outs[k // per_output]
        bit = (k % per_output) * nbits
        fields.append(field >> _U32(bit) if bit else field)
    field = _side_by_side(fields).reshape(rows, width)
    o_ref[...] = _apply(x_ref[...], field, nbits, thr, scale)


def fused_dropout(
    x: jax.Array,
    words: jax.Array,
    keep_prob: float,
    *,
    layout: str = "rows",
    rows: int = 512,
    num_warps: int = 4,
    interpret: bool = False,
) -> jax.Array:
    """``dropmask.dropout(x, 1 - keep_prob, key)`` for ``words = key_words(key)``."""
    thr = testing.threshold(keep_prob)
    if not isinstance(thr.value, int) or x.ndim == 0 or x.shape[-1] % testing.LANES:
        raise ValueError("static rate and x.shape[-1] % 32 == 0 only")
    width = min(128 // testing.FIELD_BITS, testing.LANES)
    view = x.reshape(x.size // width, width)
    kernel = {"rows": _rows_kernel, "columns": _columns_kernel, "joined": _joined_kernel}[layout]
    kernel = functools.partial(
        kernel,
        rows=rows,
        calls_per_word=testing.LANES // width,
        nbits=testing.FIELD_BITS,
        thr=thr.value,
        scale=1.0 / thr.realised,
    )
    compiler_params = None
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        compiler_params = plgpu.CompilerParams(num_warps=num_warps, num_stages=1)
    block = pl.BlockSpec((rows, width), lambda i: (i, 0))
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(view.shape, x.dtype),
        grid=(pl.cdiv(view.shape[0], rows),),
        in_specs=[pl.BlockSpec((4,), lambda i: (0,)), block],
        out_specs=block,
        interpret=interpret,
        compiler_params=compiler_params,
    )(words, view)
    return out.reshape(x.shape)
