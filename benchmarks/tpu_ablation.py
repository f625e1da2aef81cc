"""Where dropout's time goes inside a Transformer train step on a TPU, by ablation.

Experimental, not used by dropmask. The step is ``bench_tpu``'s 4-layer pre-LayerNorm
layer (relu MLP) with dropout at rate 0.1 on the attention output and both MLP
branches (no attention-weight dropout), at a model shape of ``bench_tpu.MODEL_SHAPES``.
Each variant replaces the dropout with something that keeps one cost and drops the
others, all timed in one process against the step without dropout:

* ``default``: ``dropmask.dropout`` as it is (on a TPU, differentiated: the flags
  kernel's bytes, selected by XLA); ``kernel``: the same called undifferentiated in
  each pass of a ``custom_vjp``, where the dropout kernel draws and selects at once in
  both passes (what ``default`` was before the bytes); ``xla``: ``default`` under
  ``tpu_kernels(False)``.
* ``barrier``: ``x * c`` in a Pallas kernel, forward and backward: the memory passes
  and lost fusions of a kernel at each site, no generator.
* ``bytes``: a byte per element, computed by a cheap hash and kept apart from the
  consumer by ``optimization_barrier``, expanded by XLA's ``select`` in the consumer's
  fusion, forward and backward: a written mask with a near-free generator.
* ``bits_rows`` / ``bits_lead``: the same with 1 bit per element, 32 rows packed in a
  word (``(l, g, c)`` bit ``k`` = element ``(l, 32 g + k, c)``) or 32 entries of the
  leading axis (``(g, r, c)`` bit ``j`` = element ``(32 g + j, r, c)``; a short leading
  axis takes rows folded into it).
* ``kernel_rows`` / ``kernel_lead``: those two layouts written by a Pallas kernel that
  draws the "fast" mask (bit for bit ``dropmask.keep_mask``'s), expanded by XLA.

Usage: ``python -m benchmarks.tpu_ablation --out FILE [--shapes ViT-B/16,BERT-base]
[--variants none,kernel,...] [--per-call]``; off a TPU the Pallas kernels run in the
interpreter (``--shapes tiny`` checks the script on a CPU).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import dropmask
from benchmarks.bench_tpu import MODEL_SHAPES, _step_ms
from benchmarks.bench_transformer_step import step_fn
from dropmask import testing
from dropmask.testing import LANES, key_words, threshold, tpu_keep_tile

RATE = 0.1
SHAPES = {
    **MODEL_SHAPES,
    "tiny": {"batch": 2, "length": 40, "width": 256, "heads": 2, "mlp_dim": 256},
}
_U32 = np.uint32
_SPAN = 1024  # columns a delivery of the mask takes: 128 Threefry calls, one a lane


def _interpret() -> bool:
    return jax.default_backend() != "tpu"


def _view(shape: tuple[int, ...]) -> tuple[int, int, int]:
    return (math.prod(shape[:-2]), shape[-2] if len(shape) > 1 else 1, shape[-1])


_THRESHOLD = threshold(1.0 - RATE)


def _scale(x: jax.Array) -> jax.Array:
    return x * jnp.asarray(1.0 / _THRESHOLD.realised, x.dtype)


def _keep_words(words0: Any, key: list[Any], thr: Any, first_word: int, width: int) -> jax.Array:
    """``bool[32, width]``: the keep-flags of 32 rows whose first words are ``words0``,
    from column ``32 * first_word`` on."""
    return tpu_keep_tile(key, thr, words0, _U32(first_word), (32, width))


def _scalars(key: jax.Array) -> jax.Array:
    """The key words as ``int32``: a kernel's scalar operands."""
    return lax.bitcast_convert_type(key_words(key), jnp.int32)


# --- bits over rows -------------------------------------------------------------------


def rows_layout(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``(lead, rows, cols, word rows)``: word rows a multiple of 8 (whole tiles)."""
    lead, rows, cols = _view(shape)
    return lead, rows, cols, -(-rows // 256) * 8


def _rows_kernel(rows: int, cols: int, block: int, thr: Any, scalars_ref: Any, o_ref: Any):
    key = [scalars_ref[i].astype(_U32) for i in range(4)]
    base = pl.program_id(0) * rows + pl.program_id(1) * (block * 32)
    sub = lax.broadcasted_iota(jnp.int32, (8, 1), 0)
    shift = lax.broadcasted_iota(jnp.int32, (32, 1), 0)

    def tile(t: Any, carry: Any) -> Any:
        for s0 in range(0, cols, _SPAN):
            width = min(_SPAN, cols - s0)

            def group(j: Any, acc: Any, s0: int = s0, width: int = width) -> Any:
                row = base + t * 256 + j * 32 + lax.broadcasted_iota(jnp.int32, (32, 1), 0)
                words0 = row.astype(_U32) * _U32(cols // LANES)
                keep = _keep_words(words0, key, thr, s0 // LANES, width)
                bits = jnp.where(keep, jnp.int32(1) << shift, 0)
                v = bits[0:8] | bits[8:16] | bits[16:24] | bits[24:32]
                for step in (4, 2, 1):  # every sublane ends with the OR of all eight
                    v = v | pltpu.roll(v, step, 0)
                return jnp.where(sub == j, v, acc)

            acc = lax.fori_loop(0, 8, group, jnp.zeros((8, width), jnp.int32))
            o_ref[0, pl.ds(pl.multiple_of(t * 8, 8), 8), pl.ds(s0, width)] = acc
        return carry

    lax.fori_loop(0, block // 8, tile, 0)


def _words_call(kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], shape: tuple[int, ...]):
    """``kernel`` as a call that writes ``int32[shape]`` words in ``block``s over ``grid``
    from the key's words (scalar memory)."""
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(block, lambda g, i: (g, i, 0)),
        out_shape=jax.ShapeDtypeStruct(shape, jnp.int32),
        interpret=_interpret(),
    )


def rows_words(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    lead, rows, cols, word_rows = rows_layout(shape)
    fit = max(256, (2 * 2**20 // (cols * jnp.dtype(dtype).itemsize)) // 256 * 256)
    block = min(word_rows, fit // 32)
    kernel = functools.partial(_rows_kernel, rows, cols, block, np.int32(_THRESHOLD.value))
    grid = (lead, pl.cdiv(word_rows, block))
    return _words_call(kernel, grid, (1, block, cols), (lead, word_rows, cols))(_scalars(key))


def rows_keep(words: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    lead, rows, cols, _ = rows_layout(shape)
    k = lax.broadcasted_iota(jnp.int32, (1, 1, 32, 1), 2)
    bits = (words[:, :, None, :] >> k) & 1
    return (bits.reshape(lead, words.shape[1] * 32, cols)[:, :rows] != 0).reshape(shape)


# --- bits over the leading axis -------------------------------------------------------


def lead_layout(shape: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """``(lead, rows, cols, word groups, padded rows)`` with rows folded into a leading
    axis shorter than 32 where they split into whole tiles."""
    lead, rows, cols = _view(shape)
    if lead < 32 and rows % 32 == 0:
        fold = rows
        while fold % 64 == 0 and lead * rows // fold < 32:
            fold //= 2
        lead, rows = lead * rows // fold, fold
    return lead, rows, cols, -(-lead // 32), -(-rows // 32) * 32


def _lead_kernel(rows: int, cols: int, block: int, thr: Any, scalars_ref: Any, o_ref: Any):
    key = [scalars_ref[i].astype(_U32) for i in range(4)]
    first = pl.program_id(1) * block
    g0 = pl.program_id(0) * 32

    def chunk(c: Any, carry: Any) -> Any:
        r0 = pl.multiple_of(c * 32, 32)
        row_in = first + r0 + lax.broadcasted_iota(jnp.int32, (32, 1), 0)
        for s0 in range(0, cols, _SPAN):
            width = min(_SPAN, cols - s0)

            def one(j: Any, acc: Any, s0: int = s0, width: int = width) -> Any:
                row = (g0 + j) * rows + row_in
                words0 = row.astype(_U32) * _U32(cols // LANES)
                keep = _keep_words(words0, key, thr, s0 // LANES, width)
                return acc | jnp.where(keep, jnp.int32(1) << j, 0)

            acc = lax.fori_loop(0, 32, one, jnp.zeros((32, width), jnp.int32))
            o_ref[0, pl.ds(r0, 32), pl.ds(s0, width)] = acc
        return carry

    lax.fori_loop(0, block // 32, chunk, 0)


def lead_words(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    del dtype
    _, rows, cols, groups, padded = lead_layout(shape)
    block = min(padded, max(32, (2**20 // (cols * 4)) // 32 * 32))
    kernel = functools.partial(_lead_kernel, rows, cols, block, np.int32(_THRESHOLD.value))
    grid = (groups, pl.cdiv(padded, block))
    return _words_call(kernel, grid, (1, block, cols), (groups, padded, cols))(_scalars(key))


def lead_keep(words: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    lead, rows, cols, _, _ = lead_layout(shape)
    j = lax.broadcasted_iota(jnp.int32, (1, 32, 1, 1), 1)
    bits = ((words[:, None] >> j) & 1).reshape(words.shape[0] * 32, words.shape[1], cols)
    return (bits[:lead, :rows] != 0).reshape(shape)


# --- the variants -----------------------------------------------------------------------


def _selected(keep: Callable[[jax.Array, tuple[int, ...]], jax.Array]) -> Callable[..., Any]:
    """``where(keep(mask, x.shape), x * c, 0)`` under a checkpoint that keeps only
    ``mask``: the backward pass reads the mask, the select fuses either way."""

    def apply(x: jax.Array, mask: jax.Array) -> jax.Array:
        return jnp.where(keep(mask, x.shape), _scale(x), jnp.zeros((), x.dtype))

    return jax.checkpoint(apply, policy=jax.checkpoint_policies.nothing_saveable)


def _hash(shape: tuple[int, ...], key: jax.Array) -> jax.Array:
    i = lax.iota(_U32, math.prod(shape)).reshape(shape)
    return lax.optimization_barrier((i * _U32(2654435761)) ^ jax.random.bits(key, (), _U32))


def _scale_kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = _scale(x_ref[...]).astype(o_ref.dtype)


def barrier(x: jax.Array) -> jax.Array:
    lead, rows, cols = _view(x.shape)
    width = min(cols, 1024)
    spec = pl.BlockSpec((1, rows, width), lambda b, j: (b, 0, j))
    call = pl.pallas_call(
        _scale_kernel,
        grid=(lead, pl.cdiv(cols, width)),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((lead, rows, cols), x.dtype),
        interpret=_interpret(),
    )

    @jax.custom_vjp
    def scaled(v: jax.Array) -> jax.Array:
        return call(v)

    scaled.defvjp(lambda v: (call(v), None), lambda _, g: (call(g),))
    return scaled(x.reshape(lead, rows, cols)).reshape(x.shape)


def _bytes(x: jax.Array, key: jax.Array) -> jax.Array:
    mask = ((_hash(x.shape, key) >> 24) < 230).astype(jnp.uint8)
    return _selected(lambda m, shape: m != 0)(x, mask)


def _hashed_words(shape_of: Callable[..., tuple[int, ...]], keep: Callable[..., Any]):
    """Words of a layout's shape from a cheap hash (no generator to speak of)."""

    def drop(x: jax.Array, key: jax.Array) -> jax.Array:
        words = lax.bitcast_convert_type(_hash(shape_of(x.shape), key), jnp.int32)
        return _selected(keep)(x, words)

    return drop


def _rows_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    lead, _, cols, word_rows = rows_layout(shape)
    return (lead, word_rows, cols)


def _lead_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    _, _, cols, groups, padded = lead_layout(shape)
    return (groups, padded, cols)


def _drawn(words: Callable[..., jax.Array], keep: Callable[..., Any]):
    return lambda x, key: _selected(keep)(x, words(key, x.shape, x.dtype))


@jax.custom_vjp
def _kernel(x: jax.Array, key: jax.Array) -> jax.Array:
    """``dropmask.dropout`` called undifferentiated in each pass (its own transpose, the
    same key): the dropout kernel, in both passes."""
    return dropmask.dropout(x, RATE, key)


def _kernel_fwd(x: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    return dropmask.dropout(x, RATE, key), key


def _kernel_bwd(key: jax.Array, g: jax.Array) -> tuple[jax.Array, None]:
    return dropmask.dropout(g, RATE, key), None


_kernel.defvjp(_kernel_fwd, _kernel_bwd)


XLA = "xla"
VARIANTS: dict[str, Any] = {
    "none": None,
    "default": lambda x, k: dropmask.dropout(x, RATE, k),
    "kernel": _kernel,
    XLA: lambda x, k: dropmask.dropout(x, RATE, k),  # traced under tpu_kernels(False)
    "barrier": lambda x, k: barrier(x),
    "bytes": _bytes,
    "bits_rows": _hashed_words(_rows_shape, rows_keep),
    "bits_lead": _hashed_words(_lead_shape, lead_keep),
    "kernel_rows": _drawn(rows_words, rows_keep),
    "kernel_lead": _drawn(lead_words, lead_keep),
}


class _Drop(nn.Module):
    fn: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return x if self.fn is None else self.fn(x, self.make_rng("dropout"))


class _Layer(nn.Module):
    fn: Any
    heads: int
    mlp_dim: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = nn.LayerNorm(dtype=self.dtype)(x)
        y = nn.MultiHeadDotProductAttention(num_heads=self.heads, dtype=self.dtype)(y, y)
        x = x + _Drop(self.fn)(y)
        z = nn.LayerNorm(dtype=self.dtype)(x)
        h = _Drop(self.fn)(nn.relu(nn.Dense(self.mlp_dim, dtype=self.dtype)(z)))
        return x + _Drop(self.fn)(nn.Dense(x.shape[-1], dtype=self.dtype)(h))


class _Model(nn.Module):
    fn: Any
    heads: int
    mlp_dim: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = False) -> jax.Array:
        del deterministic  # every variant drops (step_fn's call passes False)
        for _ in range(4):
            x = _Layer(self.fn, self.heads, self.mlp_dim, self.dtype)(x)
        return x


def _looped(model: _Model) -> Callable[..., Any]:
    """``bench_transformer_step``'s SGD step, ``n`` of them in a loop, a key each."""
    step = step_fn(model)  # pyright: ignore[reportArgumentType]

    def run(n: jax.Array, p: Any, x: jax.Array, k: jax.Array) -> Any:
        return lax.fori_loop(0, n, lambda i, p: step(p, x, jax.random.fold_in(k, i)), p)

    return run


def step_rows(name: str, variants: list[str], dtype: str, reps: int) -> list[dict[str, Any]]:
    """Each variant's step at shape ``name``: compiled first, then timed in turn (the
    order reversed every other repeat), the median over ``reps`` and its ratio to
    ``"none"``'s."""
    s = SHAPES[name]
    x = jax.random.normal(jax.random.key(0), (s["batch"], s["length"], s["width"]), dtype)
    params = _Model(None, s["heads"], s["mlp_dim"], dtype).init(jax.random.key(1), x)["params"]
    rows, exes = [], {}
    for variant in variants:
        row: dict[str, Any] = {"shape": name, "dtype": dtype, "variant": variant}
        run = _looped(_Model(VARIANTS[variant], s["heads"], s["mlp_dim"], dtype))
        t = time.perf_counter()
        with testing.tpu_kernels(False) if variant == XLA else contextlib.nullcontext():
            exe = jax.jit(run).lower(jnp.int32(2), params, x, jax.random.key(2)).compile()
        row["compile_s"] = time.perf_counter() - t
        row["temp_mib"] = exe.memory_analysis().temp_size_in_bytes / 2**20
        jax.block_until_ready(exe(jnp.int32(1), params, x, jax.random.key(2)))  # warm up
        exes[variant] = exe
        rows.append(row)
    times: dict[str, list[float]] = {v: [] for v in exes}
    for r in range(reps):
        for variant in list(exes) if r % 2 == 0 else list(reversed(exes)):
            times[variant].append(_step_ms(exes[variant], params, x))
    for row in rows:
        row["step_ms"] = float(np.median(times[row["variant"]]))
        if "none" in times:
            row["ratio"] = row["step_ms"] / float(np.median(times["none"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    from dropmask.cli import OneLineParser

    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", default=",".join(MODEL_SHAPES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    shapes, variants = args.shapes.split(","), args.variants.split(",")
    unknown = [n for n in shapes if n not in SHAPES] + [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(
            f"unknown shapes or variants {unknown}; shapes: {', '.join(SHAPES)}; "
            f"variants: {', '.join(VARIANTS)}"
        )
    rows: list[dict[str, Any]] = []
    for name in shapes:
        rows.extend(step_rows(name, variants, args.dtype, args.repeats))
        args.out.write_text(json.dumps(rows, indent=1))
        for row in rows[-len(variants) :]:
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
