"""How keep-masks are drawn from a JAX key: the one entry point for all mask RNG.

Every caller (``dropout``, ``alpha_dropout``, ``word_dropout``, ``keep_mask``, attention
dropout) goes through :func:`draw`: jitted, checkpointed functions keyed by a hashable
:class:`MaskSpec` that draw the mask and hand it to the caller's ``combine``.

Two generators:

* ``"fast"`` (the default): counter-based, on Threefry-4x32-13 (``_threefry``), cut
  into bit-packed words (``_fast_mask``). An element depends only on the key and its
  global position, so the mask is the same under ``jit`` or not, under ``vmap`` over
  keys and for any sharding; kept values are scaled by the keep probability that the
  integer threshold realises.
* ``"flax"``: ``jax.random.bernoulli(key, keep_prob, shape)``, exactly what
  ``flax.linen.Dropout`` and ``flax.nnx.Dropout`` draw, so outputs match Flax bit for
  bit for the same key.

Backward pass. With ``residual="mask"`` (the default) reverse-mode autodiff keeps the
packed keep-words of the CPU and CUDA paths (1 bit per element, named
``"dropout_mask"``) and the backward pass unpacks them: a second Threefry pass costs
more than writing and reading one bit per element. With ``residual="none"`` it keeps
only the key (two words; four for a non-Threefry key) and draws the mask again.
Backends on the per-element path (TPU, ROCm) always draw again. A ``jax.checkpoint``
around the caller decides instead with its own policy:
``save_only_these_names("dropout_mask")`` keeps the words, a policy that saves nothing
draws again.

Rates. A Python or NumPy number is a compile-time constant; a JAX scalar, concrete or
traced, is always a run-time value, so one program serves every value and an eager call
draws the same mask as a jitted one. ``"fast"`` draws both at one precision: the keep
probability ``1 - rate``, computed in float32, rounded to a multiple of ``2**-16``; so a
rate and the same rate as a float32 scalar draw the same mask, in programs of the same
size. A static rate that this rounds to 0 or 1 (within ``2**-17`` of either end) is
refused rather than drawn as another rate. A run-time rate outside ``[0, 1]`` makes the
drawn probability NaN: floating outputs become NaN, and nothing is kept
(:func:`keep_mask` is all False); under ``checkify.checkify(f, errors=checkify.user_checks)``
it is an error instead.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from .._checks import (
    check_impl,
    check_key,
    check_rate,
    check_shape,
    normalize_broadcast_dims,
)
from .._errors import DropmaskValueError, RateError, call_name, named, rate_name, user_error
from ._fast_mask import (
    MASK_NAME,
    Threshold,
    default_path,
    keep_from_words,
    key_source,
    packed_words,
    threshold,
    unpack_words,
    words_of,
)
from ._placement import auto_partitioned, tpu_interpret, tpu_kernels_run
from ._sharding import Block, explicit_split, local_block, local_shape
from ._tpu_flags import (
    bytes_linear,
    flags_kernel_for,
    flags_of,
    keep_bytes,
    keep_bytes_on_each_device,
    mask_block,
)
from ._tpu_mask import kernel_for, masked_linear, scalars_of

__all__ = ["Impl", "Kept", "Linear", "Residual", "keep_mask", "kept"]

Impl = Literal["fast", "flax"]
DEFAULT_IMPL: Impl = "fast"
Residual = Literal["mask", "none"]
DEFAULT_RESIDUAL: Residual = "mask"


def mask_shape(shape: Sequence[int], axes: Sequence[int]) -> tuple[int, ...]:
    """The shape a mask is drawn at: ``shape`` with every (normalized) axis in ``axes`` 1."""
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def probability(
    rate: Any, value: float | None, *, keep: bool, caller: str, impl: str | None = DEFAULT_IMPL
) -> Any:
    """The probability that a drawn flag is True: ``1 - rate`` if ``keep``, else ``rate``.

    One encoding per rate type: a Python or NumPy number (``value``, already checked)
    stays a Python float; a JAX scalar becomes a float32 array even when concrete, so
    eager and jitted calls take the same threshold. A traced rate is checked at run time
    only under ``checkify``. For ``"fast"`` a static ``1 - rate`` is computed in float32,
    as it is for a JAX scalar, so that both give one threshold; ``"flax"`` keeps
    Flax's float64 ``1.0 - rate``. ``impl`` is the generator that draws with it (None:
    none does, e.g. Gaussian noise's variance).

    Raises:
      RateError: a static rate that ``"fast"`` would draw as 0 or 1 (within ``2**-17``
        of either), named as the caller named it (:func:`~dropmask._errors.rate_name`).
    """
    if not isinstance(rate, jax.Array):
        static = float(rate) if value is None else value
        if not keep:
            p = static
        elif impl == "flax":
            return 1.0 - static
        else:
            p = float(np.float32(1.0) - np.float32(static))
        if impl == "fast":
            _check_resolution(static, p, keep, caller)
        return p
    rate = jnp.asarray(rate, jnp.float32)
    if value is None:
        checkify.debug_check(
            (rate >= 0) & (rate <= 1),
            f"{caller}: {rate_name()} must be in [0, 1], got {{rate}}.",
            rate=rate,
        )
    return 1.0 - rate if keep else rate


def _check_resolution(rate: float, p: float, keep: bool, caller: str) -> None:
    """Refuses a static rate whose flag probability ``p`` the ``"fast"`` threshold would
    round to 0 or 1."""
    realised = threshold(p).realised
    if realised in (0.0, 1.0) and p not in (0.0, 1.0):
        name = rate_name()
        rounded = 1.0 - realised if keep else realised
        raise user_error(
            RateError,
            f"{name} must be 0, 1, or more than 2**-17 from both (masks are drawn to "
            f"2**-16), got {name}={rate:.6g}, which rounds to {rounded:g}",
            f"Pass {name}={rounded:g} exactly, or a value further from it (or impl='flax', "
            "where the function takes one).",
            caller=caller,
        )


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """Everything static about one mask draw; hashable, so it keys the jit cache.

    Attributes:
      shape: the shape the mask is drawn at (broadcast axes are 1).
      impl: ``"fast"`` or ``"flax"``.
      value: the ``"fast"`` integer threshold (None when the probability is a
        run-time value).
      realised: the probability a flag is True, when static.
      global_shape: for a block of a sharded mask, the global mask shape.
      save_words: whether reverse-mode autodiff keeps the packed words (named
        ``MASK_NAME``) instead of drawing them again in the backward pass.
    """

    shape: tuple[int, ...]
    impl: str
    value: int | None = None
    realised: float | None = None
    global_shape: tuple[int, ...] | None = None
    save_words: bool = False


Combine = Callable[[Any, jax.Array, Any], Any]


@dataclasses.dataclass(frozen=True)
class Linear:
    """A ``combine`` that is linear in ``x`` and diagonal, as dropout's select and scale:
    its own transpose. Where the kernel runs (by default on a TPU, see ``_placement``; inside
    ``tpu_kernels()`` on any backend, not inside ``tpu_kernels(False)``), :func:`draw`
    runs it in the kernel that draws the mask (``_tpu_mask``), forward and backward, on
    the shapes the kernel serves; elsewhere it is ``fn`` itself."""

    fn: Combine

    def __call__(self, x: Any, flags: jax.Array, realised: Any) -> Any:
        return self.fn(x, flags, realised)


def _on_tpu(
    spec: MaskSpec, combine: Combine, x: Any, thr: Threshold, source: Any, offset: Any
) -> Any:
    """``combine(x, flags, realised)`` with the TPU kernels, or None where they do not
    serve: a linear combine, where the kernels are traced (``_placement``), not in a
    program XLA partitions itself. Over an array of the mask's own shape whose last axis
    is whole registers, the dropout kernel draws and combines at once, and where that is
    differentiated the flags kernel's bytes and XLA's select (:func:`_kernel_or_bytes`);
    the same under a mesh of explicit axes on each device's block (:func:`_per_device`),
    and on a block the caller placed (``global_shape``/``offset`` inside ``shard_map``)
    where it does not split the last axis (whose offset must be a whole number of
    words). Elsewhere (a last axis that is not whole registers,
    ``broadcast_dims``, float16) :func:`_by_flags`."""
    if not (isinstance(combine, Linear) and isinstance(x, jax.Array)):
        return None
    if not tpu_kernels_run() or auto_partitioned(x):
        return None
    words = words_of(source)
    split = explicit_split(x)
    if split is not None:
        if spec.global_shape is not None or not _broadcasts_to(spec.shape, x.shape):
            return None
        return _per_device(combine, x, thr, words, *split, spec.shape)
    block = _block(spec, offset)
    if x.shape == spec.shape and (block is None or block.global_shape[-1] == spec.shape[-1]):
        global_shape = None if block is None else block.global_shape
        kernel = kernel_for(
            spec.shape, x.dtype, thr, interpret=tpu_interpret(), global_shape=global_shape
        )
        if kernel is not None:
            scalars = scalars_of(words, thr, () if block is None else block.offset)
            fusible = flags_kernel_for(
                spec.shape, thr, interpret=tpu_interpret(), global_shape=global_shape
            )
            if fusible is not None:
                return _kernel_or_bytes(combine, x, scalars, kernel, fusible, spec.shape)
            return masked_linear(x, scalars, spec=kernel, combine=combine)
    return None if block is not None else _by_flags(spec, combine, x, thr, words)


def _kernel_or_bytes(
    combine: Combine,
    x: jax.Array,
    scalars: jax.Array,
    kernel: Any,
    bytes_kernel: Any,
    shape: tuple[int, ...],
) -> jax.Array:
    """Dropout over a whole mask by the dropout kernel where it is not differentiated,
    by the flags kernel's bytes and XLA's select where it is (``jax.grad``, ``jax.jvp``),
    forward and backward: the same values.

    Alone, the kernel runs at ``x * c``'s speed, where the bytes' select reads ``x``
    and the bytes after a kernel that writes them (on a v5e at [8192, 8192], forward:
    1.11x / 2.16x ``x * c`` in bfloat16, 1.01x / 1.56x in float32). Inside a train
    step the kernel is a fusion barrier: it reads and writes its activation once more
    in each pass, where XLA fuses the select into the ops around it. In a 4-layer
    Transformer step (residual and MLP sites, bfloat16) the bytes take 1.14x / 1.11x /
    1.09x the step without dropout at ViT-B [64, 197, 768], BERT-base [32, 512, 768]
    and [8, 128, 768], the kernel 1.30x / 1.24x / 1.30x (docs/dropout_speed.md, "Dropout
    that XLA fuses"). Differentiated is the train step's case, so that is the split."""

    @jax.custom_jvp
    def apply(x: jax.Array, scalars: jax.Array) -> jax.Array:
        return masked_linear(x, scalars, spec=kernel, combine=combine)

    @apply.defjvp
    def _(primals: Any, tangents: Any) -> Any:
        (x, scalars), (tx, _) = primals, tangents
        by_bytes = functools.partial(bytes_linear, spec=bytes_kernel, shape=shape, combine=combine)
        return by_bytes(x, scalars), by_bytes(tx, scalars)

    return apply(x, scalars)


def _by_flags(spec: MaskSpec, combine: Combine, x: Any, thr: Threshold, words: Any) -> Any:
    """``combine`` by XLA with flags the kernel drew as bytes (``_tpu_flags``), at the
    mask's shape (broadcast against ``x`` by ``combine``), drawn again in the backward
    pass: XLA's select reads a byte a flag inside its own fusion, where XLA's draw would
    compute a Threefry call for every element. None where that kernel does not serve (a
    packing axis that is not the last, a mesh of explicit axes: there a mask of ``x``'s
    own shape takes :func:`_per_device`)."""
    if _in_explicit_mesh():
        return None
    kernel = flags_kernel_for(spec.shape, thr, interpret=tpu_interpret())
    if kernel is None:
        return None
    scalars = scalars_of(words, thr)
    return bytes_linear(x, scalars, spec=kernel, shape=spec.shape, combine=combine)


def _broadcasts_to(mask: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a mask of shape ``mask`` is ``shape`` or broadcasts along some of its axes
    (``broadcast_dims``: 1 there, same rank)."""
    return len(mask) == len(shape) and all(m in (1, n) for m, n in zip(mask, shape, strict=True))


def _per_device(
    combine: Combine,
    x: jax.Array,
    thr: Threshold,
    words: jax.Array,
    mesh: Any,
    split: Any,
    shape: tuple[int, ...],
) -> Any:
    """The kernels on each device's block of ``x``, sharded as ``split`` over ``mesh`` (a
    mesh of explicit axes), for a mask of ``shape`` (``x``'s, or 1 along the axes it
    broadcasts): the dropout kernel, and differentiated the flags kernel's bytes and
    XLA's select (:func:`_kernel_or_bytes`), each lowered inside ``shard_map``, each
    block drawing at its global place, so the mask is the unsharded one, with no
    collective; where the dropout kernel does not take the blocks (float16, a last axis
    that is not whole registers, ``broadcast_dims``: each device then draws its block
    of the mask, whole along the broadcast axes), the bytes in both passes, as
    :func:`_by_flags` on one device. None where the blocks are not served (uneven, or a
    shape neither kernel takes).

    On a v5e, ViT-B's 4-layer bf16 train step (residual and MLP sites swapped) over a
    one-device mesh of explicit axes took 0.98x the same step unsharded with the bytes
    on each block, where the dropout kernel in both passes (a fusion barrier) took
    1.14x."""
    local = local_shape(x.shape, mesh, split)
    if local is None:
        return None
    kernel = None
    if shape == x.shape:
        kernel = kernel_for(local, x.dtype, thr, interpret=tpu_interpret(), global_shape=shape)
    block = mask_block(shape, local)
    fusible = flags_kernel_for(block, thr, interpret=tpu_interpret(), global_shape=shape)
    scalars = scalars_of(words, thr)
    if fusible is not None:
        fusible = dataclasses.replace(fusible, split=(mesh, split))
    if kernel is None:  # float16, a last axis not whole registers, broadcast: bytes alone
        if fusible is None:
            return None
        return bytes_linear(x, scalars, spec=fusible, shape=shape, combine=combine)
    kernel = dataclasses.replace(kernel, split=(mesh, split))
    if fusible is None:
        return masked_linear(x, scalars, spec=kernel, combine=combine)
    return _kernel_or_bytes(combine, x, scalars, kernel, fusible, x.shape)


def _draw_and_combine(
    spec: MaskSpec, combine: Combine, x: Any, source: Any, dynamic: Any, offset: Any
) -> Any:
    """``combine(x, flags, realised)`` with ``flags: bool[spec.shape]`` drawn from ``source``
    (``key_source(key)`` for ``"fast"``, the key for ``"flax"``)."""
    value, realised = (spec.value, spec.realised) if dynamic is None else dynamic
    if spec.impl == "flax":
        p: Any = realised if dynamic is None else value  # unclipped, as Flax draws it
        flags = jax.random.bernoulli(source, p=p, shape=spec.shape)
    else:
        block = None if spec.global_shape is None else Block(spec.global_shape, tuple(offset))
        thr = Threshold(value, realised)
        flags = keep_from_words(source, spec.shape, thr, block)
    return combine(x, flags, realised)


SAVE_MASK_WORDS = jax.checkpoint_policies.save_only_these_names(MASK_NAME)
SAVE_NOTHING = jax.checkpoint_policies.nothing_saveable


def _checkpointed(
    spec: MaskSpec, combine: Combine, x: Any, source: Any, dynamic: Any, offset: Any
) -> Any:
    """``_draw_and_combine`` under ``jax.checkpoint``, so that reverse-mode autodiff keeps
    only what ``spec.save_words`` asks for (the packed words, or just the key's words) and
    recomputes the rest, never a per-element array of flags or scaled values; ``jvp``
    still works. Where the TPU kernels serve (:func:`_on_tpu`), their primitives, linear
    in ``x``, keep only the key's words by themselves: no checkpoint, whose backward pass
    recomputes behind an ``optimization_barrier`` over its inputs (the cotangent among
    them), which would keep XLA from fusing the bytes' select into its neighbours."""
    if spec.impl == "fast":
        value, realised = (spec.value, spec.realised) if dynamic is None else dynamic
        out = _on_tpu(spec, combine, x, Threshold(value, realised), source, offset)
        if out is not None:
            return out
    policy = SAVE_MASK_WORDS if spec.save_words else SAVE_NOTHING
    body = jax.checkpoint(_draw_and_combine, policy=policy, static_argnums=(0, 1))
    return body(spec, combine, x, source, dynamic, offset)


def _words(spec: MaskSpec, source: Any, dynamic: Any, offset: Any) -> jax.Array:
    """The packed words of a ``"fast"`` mask that keeps them (``spec.save_words``)."""
    value, realised = (spec.value, spec.realised) if dynamic is None else dynamic
    return packed_words(
        source, spec.shape, Threshold(value, realised), _block(spec, offset), apart=_apart()
    )


def _unpack_and_combine(
    spec: MaskSpec, combine: Combine, x: Any, words: jax.Array, dynamic: Any, offset: Any
) -> Any:
    realised = spec.realised if dynamic is None else dynamic[1]
    return combine(x, unpack_words(words, spec.shape, _block(spec, offset)), realised)


def _block(spec: MaskSpec, offset: Any) -> Block | None:
    return None if spec.global_shape is None else Block(spec.global_shape, tuple(offset))


def _apart() -> bool:
    return default_path() == "packed"


# Jitted and module-level, so that eager calls hit a compilation cache instead of
# re-tracing op by op; under an outer jit they are inlined.
_draw_and_combine_jit = jax.jit(_checkpointed, static_argnums=(0, 1))
# A mask that keeps its packed words draws them outside the checkpoint, in a jit of
# their own whose inputs carry no tangent: differentiating a caller binds the generator
# as one call, and the checkpoint holds only the unpacking and the combine, so neither
# JAX's transposition nor XLA sees a second copy of the rounds (one site's compiled
# gradient: 756 lines, against 799 with the words named inside the checkpoint). The
# words are the checkpoint's input, so its backward pass reads them as the saving
# policy did.
_words_jit = jax.jit(_words, static_argnums=0)
_unpack_and_combine_jit = jax.jit(
    jax.checkpoint(_unpack_and_combine, policy=SAVE_NOTHING, static_argnums=(0, 1)),
    static_argnums=(0, 1),
)


@dataclasses.dataclass(frozen=True)
class Kept:
    """A drawn mask as a caller that writes its own backward pass keeps it: where the
    TPU kernels are traced, the flags as bytes that the dropout kernel drew once
    (``form="bytes"``, ``_tpu_flags``); else the packed words where the backend packs
    them (1 bit per flag), else the key's words, from which :meth:`flags` draws the
    flags again. A pytree whose leaves are those arrays (``spec`` and ``form`` are
    static), so it can be a ``custom_vjp`` residual."""

    spec: MaskSpec
    words: Any
    source: Any
    dynamic: Any
    offset: Any
    form: str = "words"

    def flags(self) -> jax.Array:
        """``bool[spec.shape]``, the flags ``draw`` hands a ``combine`` for the same key."""
        if self.form == "bytes":
            return flags_of(self.words)
        if self.words is not None:
            return unpack_words(self.words, self.spec.shape, _block(self.spec, self.offset))
        return _draw_and_combine_jit(
            self.spec, _flags, None, self.source, self.dynamic, self.offset
        )

    @property
    def realised(self) -> Any:
        """The probability that a flag is True (a float, or a float32 array)."""
        return self.spec.realised if self.dynamic is None else self.dynamic[1]


jax.tree_util.register_dataclass(
    Kept, data_fields=["words", "source", "dynamic", "offset"], meta_fields=["spec", "form"]
)


def kept(x: Any, flags: jax.Array, realised: Any) -> Any:
    """A ``combine`` for :func:`draw` that returns the mask as a :class:`Kept` instead
    of flags (``"fast"`` only): for callers with a backward pass of their own. ``x``, an
    array traced beside the mask, tells whether XLA partitions the program (where the
    TPU's bytes kernel does not go)."""
    del x, flags, realised
    raise AssertionError("draw hands this combine a Kept, never flags")


def _entry(spec: MaskSpec, combine: Combine, x: Any, source: Any, dynamic: Any, offset: Any) -> Any:
    """``combine(x, flags, realised)`` of every mask drawn: a ``"fast"`` mask that keeps
    its packed words draws them apart. With ``combine=kept``, the mask as a
    :class:`Kept`."""
    if combine is kept and spec.impl == "fast":
        flags = _kept_on_tpu(spec, x, source, dynamic)
        if flags is not None:
            return Kept(spec, flags, None, dynamic, offset, form="bytes")
    if spec.impl == "fast" and spec.save_words and spec.shape and default_path() != "per_element":
        words = _words_jit(spec, source, dynamic, offset)
        if combine is kept:
            return Kept(spec, words, None, dynamic, offset)
        return _unpack_and_combine_jit(spec, combine, x, words, dynamic, offset)
    if combine is kept:
        return Kept(spec, None, source, dynamic, offset)
    return _draw_and_combine_jit(spec, combine, x, source, dynamic, offset)


def _kept_on_tpu(spec: MaskSpec, x: Any, source: Any, dynamic: Any) -> jax.Array | None:
    """A kept mask's flags as bytes, drawn once by the dropout kernel where the kernels
    are traced (``_tpu_flags``), or None where it does not serve: a block of a sharded
    mask, a program XLA partitions itself (told by ``x``, an array traced beside the
    mask; none given, none served). Under a mesh of explicit axes ``x`` is the mask's
    own type, a ``jax.ShapeDtypeStruct`` whose sharding says each device's block
    (:func:`_kept_on_each_device`); an array there is not served."""
    if not tpu_kernels_run() or spec.global_shape is not None:
        return None
    value, realised = (spec.value, spec.realised) if dynamic is None else dynamic
    thr = Threshold(value, realised)
    if _in_explicit_mesh():
        return _kept_on_each_device(spec, x, thr, source)
    if not isinstance(x, jax.Array) or auto_partitioned(x):
        return None
    kernel = flags_kernel_for(spec.shape, thr, interpret=tpu_interpret())
    if kernel is None:
        return None
    return _keep_bytes_jit(kernel, spec.shape, source, dynamic)


def _kept_on_each_device(spec: MaskSpec, x: Any, thr: Threshold, source: Any) -> Any:
    """The bytes of a kept mask of type ``x`` (its shape and sharding over a mesh of
    explicit axes), each device's block drawn at its global place; None where the
    blocks are not served (uneven, or a block the flags kernel does not take)."""
    sharding = getattr(x, "sharding", None)
    if not isinstance(x, jax.ShapeDtypeStruct) or x.shape != spec.shape or sharding is None:
        return None
    local = local_shape(spec.shape, sharding.mesh, sharding.spec)
    if local is None:
        return None
    kernel = flags_kernel_for(local, thr, interpret=tpu_interpret(), global_shape=spec.shape)
    if kernel is None:
        return None
    return keep_bytes_on_each_device(words_of(source), thr, kernel, sharding.mesh, sharding.spec)


def _in_explicit_mesh() -> bool:
    """Whether values are traced under a mesh with an explicit axis, where a bytes kernel
    drawing a whole mask (one device's program, its output typed without a sharding)
    does not go. Inside ``shard_map`` (manual axes) it draws each device's own."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and jax.sharding.AxisType.Explicit in mesh.axis_types


@functools.partial(jax.jit, static_argnums=(0, 1))
def _keep_bytes_jit(kernel: Any, shape: tuple[int, ...], source: Any, dynamic: Any) -> jax.Array:
    value, realised = (kernel.value, kernel.realised) if dynamic is None else dynamic
    return keep_bytes(words_of(source), shape, Threshold(value, realised), kernel)


def _packs_words() -> bool:
    """Whether the default backend may take a packed path (CPU, CUDA), unless the kernel
    runs (``tpu_kernels()`` there). Elsewhere, a TPU included whichever way it draws, the
    words never exist, and a saving policy would only add a zero-filled residual (ROCm
    also reports ``"gpu"``, so there it does)."""
    return jax.default_backend() in ("cpu", "gpu") and not tpu_kernels_run()


def draw(
    key: Any,
    shape: tuple[int, ...],
    p: Any,
    impl: str,
    combine: Combine,
    x: Any = None,
    block: Block | None = None,
    *,
    residual: str = DEFAULT_RESIDUAL,
    caller: str,
) -> Any:
    """``combine(x, flags, realised)``: ``flags: bool[shape]`` True with probability ``p``.

    ``realised`` is the probability the flags realise (what dropout divides by for an
    unbiased output): ``p`` itself for ``"flax"``, the integer threshold's for
    ``"fast"``; NaN when a run-time ``p`` is outside ``[0, 1]``. ``residual`` is what
    the backward pass keeps: ``"mask"`` the packed words where the backend packs them,
    ``"none"`` only the key's words.
    """
    if impl == "flax" and block is not None:
        raise user_error(
            DropmaskValueError,
            "global_shape/offset need impl='fast', got impl='flax' (its masks are not blockwise)",
            "Drop impl='flax', or draw the global mask outside shard_map.",
            caller=caller,
        )
    save = residual == "mask" and _packs_words()
    global_shape = None if block is None else block.global_shape
    offset = None if block is None else block.offset
    if impl == "flax" and isinstance(p, float):
        # Only the draw goes through the entry point: the caller's arithmetic runs op by
        # op as in Flax, so that outputs and gradients stay bit-identical to Flax's.
        flags = _entry(MaskSpec(shape, impl, realised=p), _flags, None, key, None, None)
        return combine(x, flags, p)
    if impl == "flax":
        realised = jnp.where((p >= 0) & (p <= 1), p, jnp.nan)
        return _entry(MaskSpec(shape, impl), combine, x, key, (p, realised), None)
    thr = threshold(p)
    if isinstance(thr.value, int):  # a static rate: the threshold is a compile-time constant
        spec = MaskSpec(shape, impl, thr.value, thr.realised, global_shape, save)
        return _entry(spec, combine, x, key_source(key), None, offset)
    spec = MaskSpec(shape, impl, global_shape=global_shape, save_words=save)
    return _entry(spec, combine, x, key_source(key), (thr.value, thr.realised), offset)


def _flags(x: Any, flags: jax.Array, realised: Any) -> jax.Array:
    del x, realised
    return flags


def flags_only(x: Any, flags: jax.Array, realised: Any) -> jax.Array:
    """The drawn flags themselves; all False when a run-time probability is invalid."""
    del x
    if isinstance(realised, float):
        return flags
    return flags & ~jnp.isnan(realised)


@named("keep_mask")
def keep_mask(
    key: Any,
    shape: Sequence[int],
    rate: float | jax.Array,
    *,
    broadcast_dims: int | Sequence[int] = (),
    impl: Impl = DEFAULT_IMPL,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
) -> jax.Array:
    """The boolean keep-mask that :func:`dropmask.dropout` applies for this key.

    Args:
      key: a JAX PRNG key (``jax.random.key`` or a raw ``uint32[2]`` key).
      shape: the shape of the array to be masked (non-negative Python ints).
      rate: probability of dropping an element, in ``[0, 1]``: a Python float, or a
        JAX scalar (one compilation for all values; the same mask eagerly and under
        ``jit``).
      broadcast_dims: axes along which one mask value is shared (an int or ints).
      impl: the generator: ``"fast"`` (counter-based, sharding-invariant) or
        ``"flax"`` (matches ``flax.linen.Dropout`` bit for bit).
      global_shape: inside ``shard_map``, the shape of the whole array ``shape`` is a
        block of; with ``offset`` (the block's first global index per axis) the local
        mask equals the matching block of the global one (``impl="fast"`` only).
      offset: see ``global_shape``.

    Returns:
      ``bool[*shape]``, True where the element is kept. A traced ``rate`` outside
      ``[0, 1]`` keeps nothing (all False) rather than being clipped; wrap the caller
      in ``checkify.checkify(..., errors=checkify.user_checks)`` to raise instead.

    Raises:
      DropmaskTypeError: ``shape`` is not ints, ``rate`` not a real scalar, or ``key``
        not a PRNG key.
      RateError: a known ``rate`` outside ``[0, 1]``.
      AxisError: a ``broadcast_dims`` axis out of range.
      MissingKeyError: ``key`` is None and the mask is random.

    Example:
      >>> import jax, dropmask
      >>> m = dropmask.keep_mask(jax.random.key(0), (2, 3), 0.5, broadcast_dims=(0,))
      >>> bool((m[0] == m[1]).all())
      True
    """
    caller = call_name()
    shape = check_shape(shape, caller=caller)
    value = check_rate(rate, caller=caller)
    check_impl(impl, caller=caller)
    axes = normalize_broadcast_dims(broadcast_dims, len(shape), caller=caller)
    block = local_block(shape, global_shape, offset, axes, caller=caller)
    if key is not None or value not in (0.0, 1.0):
        check_key(key, caller=caller)
    if value == 0.0:
        return jnp.ones(shape, dtype=bool)
    if value == 1.0:
        return jnp.zeros(shape, dtype=bool)
    p = probability(rate, value, keep=True, caller=caller, impl=impl)
    mask = draw(key, mask_shape(shape, axes), p, impl, flags_only, block=block, caller=caller)
    return jnp.broadcast_to(mask, shape)
