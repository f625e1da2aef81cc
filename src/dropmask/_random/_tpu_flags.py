"""The ``"fast"`` keep-flags on a TPU as bytes: for a caller that keeps the mask, for
differentiated dropout, and for dropout the dropout kernel does not take.

Dense attention keeps its weights' mask for the backward pass (``_draw.Kept``). Off a
TPU it keeps the packed words; on a TPU XLA's paths draw each flag compute-bound (each
element computes a Threefry call of its own), in the forward pass and again in the
backward. Here the dropout kernel (``_tpu_mask``) draws them once, each call computed
once and its 8 flags spread by the matrix unit, and writes them as ``int8`` (1 byte a
flag, as the ``bool`` mask Flax's dropout keeps), which XLA reads inside the fusions
that select the weights, forward and backward. Dropout over an array the dropout kernel
does not take (a last axis that is not whole registers, ``broadcast_dims``, float16)
selects with the same bytes inside XLA's fusion (``_draw._by_flags``), drawn in the
forward pass and again in the backward, where XLA's draw computed a call per element.
So does differentiated dropout over the arrays the dropout kernel takes
(``_draw._kernel_or_bytes``): in a train step that kernel is a fusion barrier, where
XLA fuses the select into the ops around it. The select is bound as one primitive
linear in ``x`` (:func:`bytes_linear`), so that neither pass keeps a residual of
``x``'s size or stands behind a ``jax.checkpoint``'s barrier.

The kernel's columns are whole vector registers: a last axis that is not a multiple of
128 long (197 keys) is padded in the output, whose padding's flags are garbage (they
read the next row's words) and sliced off by XLA inside the consumer's fusion; the words
are numbered by the mask's own width, so the flags are the mask's bit for bit.
Lowered for another platform, or where Mosaic cannot lower the kernel, XLA draws the
same flags.

Many devices, as the dropout kernel (``_tpu_mask``): a block of a larger mask draws at
its global place from its offsets (``global_shape``, run-time scalars); under a mesh of
explicit axes, :func:`bytes_linear` over the whole array lowers to the kernel and the
select on each device's block inside ``shard_map`` (``TpuKernel.split``); inside a
user's ``shard_map`` the bytes are typed as varying over the axes their scalars vary
over; a kept mask under a mesh of explicit axes is drawn on each device's block of the
sharding its caller names (:func:`keep_bytes_on_each_device`; dense attention names
its weights'). Dropout whose mask broadcasts against its input (``broadcast_dims``)
is not drawn as bytes under such a mesh: its mask would be drawn whole, typed without
a sharding.

On a v5e, dense attention forward and backward with a mask per head (bf16, rate 0.1)
took 4.37 ms against 6.34 with XLA's draw at ViT-B's [64, 197, 12, 64], 1.27 against
1.86 at [16, 256, 8, 64] causal, 2.62 against 5.21 at 512 tokens, and compiled in
2.4 s against 26.4 (docs/dropout_speed.md, "The dense attention path's mask on the
TPU"). The price is the residual: a byte a weight, where XLA's draw kept the key.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir

from ._fast_mask import LANES, Threshold, check_word_count, keep_from_words
from ._placement import mosaic_lowers_here
from ._sharding import Block
from ._tpu_mask import (
    _BLOCK_BYTES,
    _SPAN,
    TpuKernel,
    _kernel,
    chunk_rows,
    scalars_of,
    self_transposed,
    with_offsets,
    words_and_threshold,
)
from ._tpu_mask import (
    _xla_path as _masked_by_xla,
)

__all__ = [
    "bytes_linear",
    "flags_kernel_for",
    "flags_of",
    "keep_bytes",
    "keep_bytes_on_each_device",
    "mask_block",
]

_CHUNK = 32  # rows an int8 vector register holds
_FLAGS_DTYPE = jnp.dtype(jnp.int8)
_MIN_WIDTH = 64  # a last axis this long or shorter: padded to 128 columns, over half waste


def flags_kernel_for(
    shape: tuple[int, ...],
    thr: Threshold,
    *,
    interpret: bool,
    global_shape: tuple[int, ...] | None = None,
) -> TpuKernel | None:
    """The kernel that writes the flags of a mask of ``shape`` (its packing axis the
    last), or None where it does not serve: an empty mask, a last axis of 1 (another
    packing axis), or of 64 or less, which the kernel's 128 columns would pad to more
    than twice its size (XLA's draw is cheap at such widths' few words a row).

    ``global_shape``: ``shape`` is one device's block of a mask of that shape (same
    rank), whose offsets are run-time scalars (``_tpu_mask.TpuKernel``). A block that
    splits the last axis must be whole registers wide (no padded columns, whose words
    would belong to the next device's block); its offset there is a multiple of 32, as
    an even split of such rows is."""
    if len(shape) == 0 or math.prod(shape) == 0 or shape[-1] <= _MIN_WIDTH:
        return None
    cols = shape[-1]
    rows = shape[-2] if len(shape) > 1 else 1
    padded = -(-cols // 128) * 128
    if global_shape is not None:
        if len(global_shape) != len(shape):
            return None
        if global_shape[-1] != cols and padded != cols:
            return None
    whole = global_shape or shape
    check_word_count((math.prod(whole[:-1]) * -(-whole[-1] // LANES),))
    block_cols = padded if padded <= 4 * _SPAN else 2 * _SPAN
    chunk = chunk_rows(rows, block_cols, _CHUNK)
    fit = max(chunk, _BLOCK_BYTES // block_cols // chunk * chunk)
    static = isinstance(thr.value, int)
    return TpuKernel(
        (*shape[:-1], padded),
        _FLAGS_DTYPE,
        thr.value if static else None,
        thr.realised if static else None,
        (min(-(-rows // chunk) * chunk, fit), block_cols),
        chunk,
        interpret,
        None if global_shape is None else tuple(global_shape),
        width=cols if padded != cols else None,
    )


def keep_bytes(
    words: jax.Array, shape: tuple[int, ...], thr: Threshold, spec: TpuKernel
) -> jax.Array:
    """``int8[*shape]``: 1 where kept, for the key words ``words`` (``uint32[4]``), drawn
    by the kernel ``spec`` (:func:`flags_kernel_for`) where it is lowered for a TPU."""
    return _bytes(scalars_of(words, thr), shape, spec)


def keep_bytes_on_each_device(
    words: jax.Array, thr: Threshold, spec: TpuKernel, mesh: Any, partition: Any
) -> jax.Array:
    """:func:`keep_bytes` of a whole mask sharded as ``partition`` over ``mesh`` (a mesh
    of explicit axes): each device's block drawn at its global place by the kernel
    ``spec`` (:func:`flags_kernel_for` of the block, with the mask's ``global_shape``)
    inside ``shard_map``, so the bytes are the unsharded mask's, with no collective."""
    local = (*spec.shape[:-1], spec.width or spec.shape[-1])

    def body(scalars: jax.Array) -> jax.Array:
        return _bytes(with_offsets(scalars, local, partition), local, spec)

    replicated = jax.sharding.PartitionSpec()
    return jax.shard_map(
        body, mesh=mesh, in_specs=replicated, out_specs=partition, check_vma=False
    )(scalars_of(words, thr))


def _bytes(scalars: jax.Array, shape: tuple[int, ...], spec: TpuKernel) -> jax.Array:
    """:func:`keep_bytes` from :func:`scalars_of`'s operands: the kernel's output, its
    padding's columns sliced off."""
    return keep_flags_p.bind(scalars, spec=spec)[..., : shape[-1]].reshape(shape)


def flags_of(keep: jax.Array) -> jax.Array:
    """``bool``: :func:`keep_bytes`' bytes as flags."""
    return lax.ne(keep, jnp.zeros((), keep.dtype))


def _as_byte(x: Any, flags: jax.Array, realised: Any) -> jax.Array:
    del x, realised
    return jnp.where(flags, 1, 0)


def _pallas(spec: TpuKernel, scalars: jax.Array, *, interpret: bool) -> jax.Array:
    lead, rows, cols = spec.view
    block_rows, block_cols = spec.block
    return pl.pallas_call(
        functools.partial(_kernel, spec, _as_byte),
        grid=(lead, pl.cdiv(rows, block_rows), pl.cdiv(cols, block_cols)),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec((1, block_rows, block_cols), lambda b, i, j: (b, i, j)),
        out_shape=jax.ShapeDtypeStruct(spec.view, _FLAGS_DTYPE),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")
        ),
        interpret=interpret,
    )(scalars)


def _xla_path(scalars: jax.Array, spec: TpuKernel) -> jax.Array:
    """The kernel's output by XLA: the same flags, the padding's columns 0."""
    words, thr = words_and_threshold(scalars, spec)
    cols = spec.shape[-1]
    width = spec.width or cols
    block = None
    if spec.global_shape is not None:
        block = Block(spec.global_shape, tuple(scalars[4 + a] for a in range(spec.offsets)))
    shape = (*spec.shape[:-1], width)
    flags = keep_from_words(words, shape, thr, block, path="per_element").reshape(
        spec.view[:2] + (width,)
    )
    flags = jnp.pad(flags, ((0, 0), (0, 0), (0, cols - width)))
    return flags.astype(_FLAGS_DTYPE)


keep_flags_p = jex_core.Primitive("dropmask_tpu_keep_flags")


def _abstract(scalars: Any, *, spec: TpuKernel) -> Any:
    """Inside ``shard_map``, varying over the mesh axes the scalars (a block's offsets)
    vary over."""
    mat = getattr(scalars, "mat", None)
    if mat is None or not mat.varying:
        return jax.core.ShapedArray(spec.view, _FLAGS_DTYPE)
    sharding = scalars.sharding.update(spec=jax.sharding.PartitionSpec())
    return scalars.update(shape=spec.view, dtype=_FLAGS_DTYPE, sharding=sharding)


def _lower(ctx: Any, scalars: Any, *, spec: TpuKernel, kernel: bool) -> Any:
    """The kernel where it runs (compiled for a TPU where Mosaic lowers here, interpreted
    off a TPU when forced on), else XLA's path."""
    interpret = not kernel
    if (kernel and mosaic_lowers_here(ctx)) or (interpret and spec.interpret):
        try:
            fn = functools.partial(_pallas, spec, interpret=interpret)
            return mlir.lower_fun(fn, multiple_results=False)(ctx, scalars)
        except Exception:  # noqa: BLE001 - any lowering failure falls back, never crashes
            pass
    fn = functools.partial(_xla_path, spec=spec)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, scalars)


def _batch(args: Any, dims: Any, *, spec: TpuKernel) -> Any:
    (scalars,), (dim,) = args, dims
    return jax.vmap(functools.partial(_xla_path, spec=spec), in_axes=dim)(scalars), 0


keep_flags_p.def_abstract_eval(_abstract)
mlir.register_lowering(keep_flags_p, functools.partial(_lower, kernel=False))
mlir.register_lowering(keep_flags_p, functools.partial(_lower, kernel=True), platform="tpu")
batching.primitive_batchers[keep_flags_p] = _batch


def _selected(
    x: jax.Array, scalars: jax.Array, *, spec: TpuKernel, shape: tuple[int, ...], combine: Any
) -> jax.Array:
    """``combine(x, flags, realised)`` with the flags the kernel ``spec`` draws as bytes
    (a mask of ``shape``, broadcast against ``x`` by ``combine``), selected by XLA."""
    _, thr = words_and_threshold(scalars, spec)
    return combine(x, flags_of(_bytes(scalars, shape, spec)), thr.realised)


# Dropout's select by XLA over the bytes, as one self-transposed primitive (the module
# docstring says why).
bytes_linear_p = jex_core.Primitive("dropmask_tpu_bytes_linear")


def bytes_linear(
    x: jax.Array, scalars: jax.Array, *, spec: TpuKernel, shape: tuple[int, ...], combine: Any
) -> jax.Array:
    """``combine(x, flags, realised)`` with the flags of a mask of ``shape`` drawn as bytes
    by the kernel ``spec`` (:func:`flags_kernel_for`) and selected by XLA, inside its
    fusions. ``combine`` must be linear in ``x`` and diagonal (dropout's select and
    scale), so that it is its own transpose."""
    return bytes_linear_p.bind(x, scalars, spec=spec, shape=shape, combine=combine)


def _linear_batch(args: Any, dims: Any, **params: Any) -> Any:
    """Over ``x`` alone (per-example gradients), the same primitive, the mask broadcast
    along the batch axis; over keys, each key's bytes by XLA's draw (the flags
    primitive's own batching). Under a mesh's ``split``, whose ``shard_map`` takes ``x``
    at the mask's rank (its shape, as ``_draw`` binds it there), XLA's draw of the whole
    mask either way, as the dropout kernel's batching draws it."""
    (x, scalars), (x_dim, scalars_dim) = args, dims
    spec, combine = params["spec"], params["combine"]
    if spec.split is not None:
        whole = functools.partial(_masked_by_xla, spec=spec, combine=combine)
        return jax.vmap(whole, in_axes=dims)(*args), 0
    if scalars_dim is None:  # not mapped
        return bytes_linear_p.bind(jnp.moveaxis(x, x_dim, 0), scalars, **params), 0
    return jax.vmap(functools.partial(_selected, **params), in_axes=dims)(*args), 0


def mask_block(mask: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    """The block of a mask of shape ``mask`` (1 along the axes it broadcasts) that a
    device holding ``block`` of the masked array draws: the block, whole (1) along the
    broadcast axes."""
    return tuple(1 if whole == 1 else n for whole, n in zip(mask, block, strict=True))


def _linear_abstract(x: Any, scalars: Any, **params: Any) -> Any:
    del scalars, params
    return x


def _linear_lower(
    ctx: Any, x: Any, scalars: Any, *, spec: TpuKernel, shape: tuple[int, ...], combine: Any
) -> Any:
    """For any platform: the flags primitive (the kernel where it runs, else XLA's draw,
    chosen by its own lowering) and XLA's select. With ``spec.split`` (a mesh of explicit
    axes), both on each device's block inside ``shard_map``, the flags drawn at the
    block's global place."""
    if spec.split is None:
        selected = functools.partial(_selected, spec=spec, shape=shape, combine=combine)
    else:
        selected = spec.on_each_device(
            lambda local, x, s: _selected(
                x, s, spec=local, shape=mask_block(shape, x.shape), combine=combine
            )
        )
    return mlir.lower_fun(selected, multiple_results=False)(ctx, x, scalars)


bytes_linear_p.def_abstract_eval(_linear_abstract)
mlir.register_lowering(bytes_linear_p, _linear_lower)
self_transposed(bytes_linear_p)
batching.primitive_batchers[bytes_linear_p] = _linear_batch
