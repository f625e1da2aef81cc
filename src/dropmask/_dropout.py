"""The functional dropout family: one implementation that every module calls.

Channel ("spatial") dropout is ordinary :func:`dropout` with ``broadcast_dims``:
for images ``x: [batch, height, width, channels]`` pass ``broadcast_dims=(1, 2)`` to
drop whole feature maps; for sequences ``x: [batch, time, features]`` pass
``broadcast_dims=(1,)`` to drop the same features at every time step (variational
dropout).

Every variant validates its arguments through one path (``_validate``: input, dtype,
rate, impl, residual, axes, sharding block, key, in that order) and draws its mask through the
one entry point ``_random.draw``. The Linen and NNX layers call these same functions;
their errors name the layer (``_errors.naming``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._checks import (
    check_array,
    check_floating,
    check_impl,
    check_int,
    check_key,
    check_rate,
    check_residual,
    concrete_value,
    normalize_axes,
    normalize_broadcast_dims,
)
from ._errors import DropmaskValueError, DtypeError, call_name, named, user_error
from ._random import (
    DEFAULT_IMPL,
    DEFAULT_RESIDUAL,
    Block,
    Impl,
    Linear,
    Residual,
    block_from_spec,
    draw,
    local_block,
    mask_shape,
    probability,
    sharded_as,
)

__all__ = ["alpha_dropout", "drop_path", "dropout", "gaussian_dropout", "word_dropout"]

# SELU's fixed point: the value a dropped unit takes in alpha dropout is
# -scale * alpha, the SELU output for x -> -inf (Klambauer et al., 2017).
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_ALPHA_PRIME = -_SELU_SCALE * _SELU_ALPHA


def needs_key(rate: Any, deterministic: bool, *, caller: str = "dropout") -> bool:
    """Whether a call draws randomness: not in eval mode, and unless ``rate`` is 0 or 1.

    Modules use this to decide whether to fetch a key, so that (as in Flax) a layer
    with rate 0 or 1, given as a float or a concrete JAX scalar, consumes none. The
    rate is validated first, so a bad rate is reported before a missing key.
    """
    check_rate(rate, caller=caller)
    return not deterministic and concrete_value(rate) not in (0.0, 1.0)


def layer_block(
    x: Any, shard_spec: Any, global_shape: Any, offset: Any, deterministic: bool, *, caller: str
) -> tuple[Any, Any]:
    """The ``(global_shape, offset)`` a layer hands to the core for this call.

    Call-time ``global_shape`` / ``offset`` win (either one alone is passed on, so that
    the core reports the missing half). Otherwise, with a ``shard_spec`` and in training
    mode, the block this device holds inside ``shard_map`` (``block_from_spec``); in
    evaluation nothing is drawn, so no block is needed.
    """
    if shard_spec is None or deterministic or global_shape is not None or offset is not None:
        return global_shape, offset
    block = block_from_spec(jnp.shape(x), shard_spec, caller=caller)
    return block.global_shape, block.offset


class _Call(NamedTuple):
    """A validated call: the input as an array, the rate when known, the mask's axes."""

    x: jax.Array
    value: float | None
    axes: tuple[int, ...]
    block: Block | None


def _validate(
    x: Any,
    rate: Any,
    key: Any,
    deterministic: bool,
    *,
    kind: str = "inexact",
    broadcast_dims: Any = (),
    batch_axis: Any = None,
    impl: Any = DEFAULT_IMPL,
    residual: Any = DEFAULT_RESIDUAL,
    allow_one: bool = True,
    global_shape: Any = None,
    offset: Any = None,
) -> _Call:
    """The one validation path of every dropout variant, in one order: input, dtype,
    rate, impl, residual, axes, sharding block, key. Raises before any array work."""
    caller = call_name()
    name = "tokens" if kind == "integer" else "x"
    arr = check_array(x, caller=caller, name=name)
    if kind == "integer":
        if not jnp.issubdtype(arr.dtype, jnp.integer):
            raise user_error(
                DtypeError,
                f"{caller} expects integer token ids, got dtype {arr.dtype}",
                "For floating activations use dropout instead.",
                caller=None,
            )
    else:
        hint = ", or use word_dropout for token ids" if caller == "dropout" else ""
        check_floating(arr, caller=caller, hint=hint, allow_complex=kind == "inexact")
    value = check_rate(rate, caller=caller, allow_one=allow_one)
    if impl is not None:
        check_impl(impl, caller=caller)
    check_residual(residual, caller=caller)
    if batch_axis is not None:
        (axis,) = normalize_axes(batch_axis, arr.ndim, name="batch_axis", caller=caller)
        axes = tuple(i for i in range(arr.ndim) if i != axis)
    else:
        axes = normalize_broadcast_dims(broadcast_dims, arr.ndim, caller=caller)
    block = local_block(arr.shape, global_shape, offset, axes, caller=caller)
    if key is not None or (not deterministic and value not in (0.0, 1.0)):
        check_key(key, caller=caller)
    return _Call(arr, value, axes, block)


def _per_part(f: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """``f`` on a real array; on a complex one, on its real and imaginary parts apart, so
    that both get the same mask and a non-finite part never leaks into the other."""
    if jnp.iscomplexobj(x):
        return lax.complex(f(jnp.real(x)), f(jnp.imag(x)))
    return f(x)


def _compute_dtype(dtype: Any) -> Any:
    """Half-precision inputs are scaled in f32 so that ``1/keep`` is not rounded first."""
    return jnp.promote_types(dtype, jnp.float32)


def scale_and_fill(realised: Any, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``1/realised`` (0 when nothing is kept) and the value for dropped elements (0).

    Both are NaN when ``realised`` is NaN (a traced rate outside [0, 1]), so that the
    whole output is NaN; they are scalars, so no per-element residual is needed.
    """
    if isinstance(realised, float):  # a static rate: constants, no ops in the program
        kind = np.dtype(dtype).type
        scale = kind(1) / kind(realised) if realised > 0 else kind(0)
        return jnp.asarray(scale, dtype), jnp.zeros((), dtype)
    realised = jnp.asarray(realised, dtype)
    positive = realised > 0
    scale = jnp.where(positive, 1.0 / jnp.where(positive, realised, 1.0), 0.0)
    invalid = jnp.isnan(realised)
    return jnp.where(invalid, jnp.nan, scale), jnp.where(invalid, jnp.nan, 0.0)


def _select_and_scale(x: jax.Array, keep: jax.Array, realised: Any) -> jax.Array:
    """``x / realised`` where kept, 0 elsewhere; finite (zero) when ``realised == 0``."""
    keep = sharded_as(jnp.broadcast_to(keep, x.shape), x)

    def apply(part: jax.Array) -> jax.Array:
        dtype = _compute_dtype(part.dtype)
        scale, fill = scale_and_fill(realised, dtype)
        scaled = part.astype(dtype) * scale
        dropped = dropped_value(keep, realised, fill, dtype)
        return lax.select(keep, scaled, dropped).astype(part.dtype)

    return _per_part(apply, x)


# Linear in x and diagonal: on a TPU the kernel that draws the mask applies it, forward
# and backward.
_select_scaled = Linear(_select_and_scale)


def dropped_value(keep: jax.Array, realised: Any, fill: Any, dtype: Any) -> jax.Array:
    """The value of dropped elements, ``fill`` from :func:`scale_and_fill` (0, or NaN
    for an invalid run-time rate), in ``keep``'s shape, built from the flags:
    ``convert(False)`` is 0.

    Not a broadcast constant: differentiating a scan (``nn.scan``), JAX computes what
    depends on no carried or scanned value once, before the loop, and holds it whole, so
    a broadcast fill would be an array of ``x``'s size read back at every iteration. A
    run-time rate's fill is added as a scalar, which needs no broadcast of its own.
    """
    dropped = lax.convert_element_type(keep, dtype)
    return dropped if isinstance(realised, float) else dropped + fill


def flags_and_realised(x: Any, flags: jax.Array, realised: Any) -> tuple[jax.Array, Any]:
    """A ``combine`` for :func:`draw` that returns the flags and the realised keep
    probability, for callers that apply the mask themselves (attention)."""
    del x
    return flags, realised


def _flax_select(x: jax.Array, keep: jax.Array, keep_prob: Any) -> jax.Array:
    """Flax's own arithmetic (a Python-float divide in the input dtype), for bit-identity."""
    keep = sharded_as(jnp.broadcast_to(keep, x.shape), x)
    # Flax's zeros_like(x) too, though a differentiated scan hoists it (dropped_value):
    # the fusions downstream, and so how XLA rounds a tanh after them, stay Flax's.
    return lax.select(keep, x / keep_prob, jnp.zeros_like(x))


@named("dropout")
def dropout(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    broadcast_dims: int | Sequence[int] = (),
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
    residual: Residual = DEFAULT_RESIDUAL,
) -> jax.Array:
    """Zeroes each element with probability ``rate`` and scales the rest by ``1/(1-rate)``.

    Args:
      x: floating or complex array of any shape ``[...]`` (f16, bf16, f32, f64, c64,
        c128; dtype preserved). A complex element is kept or dropped whole: its real
        and imaginary parts share one mask.
      rate: probability of dropping, in ``[0, 1]``: a Python float, or a JAX scalar
        (e.g. from a schedule) that does not trigger recompilation per value; a JAX
        scalar draws the same mask eagerly and under ``jit``.
      key: a JAX PRNG key; needed unless ``deterministic`` or ``rate`` is 0 or 1. An
        int seed is not a key: pass ``jax.random.key(seed)``.
      broadcast_dims: axes that share one mask value: an int or ints, negative axes
        allowed, repeats merged (as in Flax).
      deterministic: if True, return ``x`` unchanged.
      impl: mask generator: ``"fast"`` (default; counter-based Threefry, same bits
        under any jit/vmap/sharding) or ``"flax"`` (bit-identical to
        ``flax.linen.Dropout``).
      global_shape: inside ``shard_map``: the global shape ``x`` is a block of. With
        ``offset`` the local result equals the matching block of the global dropout.
      offset: the global index of ``x``'s first element, one per axis (may be traced).
      residual: what reverse-mode autodiff keeps for the backward pass with
        ``impl="fast"``: ``"mask"`` (default) the packed keep-flags, 1 bit per element;
        ``"none"`` only the key, and the backward pass draws the mask again. Masks,
        outputs and gradients are the same in both. What each costs, and how a
        ``jax.checkpoint`` policy chooses (the flags are named ``"dropout_mask"``):
        ``docs/dropout_speed.md``, "What the backward pass keeps".

    Returns:
      An array like ``x``. ``rate == 0`` or ``deterministic`` returns ``x`` itself;
      ``rate == 1`` returns zeros, with zero (not NaN) gradients. A traced ``rate``
      outside ``[0, 1]`` makes the output NaN rather than being clipped (under
      ``checkify.checkify(..., errors=checkify.user_checks)`` it is an error).

    Raises:
      DropmaskTypeError: ``x`` is not an array, ``rate`` is not a real scalar, or
        ``key`` is not a PRNG key.
      DtypeError: ``x`` is not floating point or complex.
      RateError: a known ``rate`` outside ``[0, 1]`` or NaN.
      AxisError: a ``broadcast_dims`` axis out of range.
      MissingKeyError: ``key`` is None in training mode.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> y = dropmask.dropout(jnp.ones((2, 4)), 0.5, jax.random.key(0))
      >>> sorted(set(y.ravel().tolist())) in ([0.0, 2.0], [2.0], [0.0])
      True
    """
    call = _validate(
        x,
        rate,
        key,
        deterministic,
        broadcast_dims=broadcast_dims,
        impl=impl,
        global_shape=global_shape,
        offset=offset,
        residual=residual,
    )
    return _masked(call, rate, key, deterministic, impl, residual, combine=None)


def _masked(
    call: _Call,
    rate: Any,
    key: Any,
    deterministic: bool,
    impl: Any,
    residual: Any,
    *,
    combine: Callable[..., jax.Array] | None,
) -> jax.Array:
    """A checked call's output: ``x`` as is in evaluation or at rate 0, zeros at rate 1,
    else ``combine(x, keep-mask, ...)`` over the call's mask shape (None: dropout's own,
    Flax's select for ``impl="flax"`` at a compile-time rate)."""
    x, caller = call.x, call_name()
    if deterministic or call.value == 0.0:
        return x
    if call.value == 1.0:
        return jnp.zeros_like(x)
    p = probability(rate, call.value, keep=True, caller=caller, impl=impl)
    bshape = mask_shape(x.shape, call.axes)
    if combine is None:
        combine = _flax_select if impl == "flax" and isinstance(p, float) else _select_scaled
    return draw(key, bshape, p, impl, combine, x, call.block, residual=residual, caller=caller)


@named("drop_path")
def drop_path(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    batch_axis: int = 0,
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
    residual: Residual = DEFAULT_RESIDUAL,
) -> jax.Array:
    """Stochastic depth: drops whole examples of a residual branch, scaling the rest.

    Args:
      x: ``[batch, ...]`` floating (or complex) residual-branch output, at least 1-d.
      rate: probability of dropping an example's branch.
      key: PRNG key (needed in training mode).
      batch_axis: the axis that indexes examples; one decision is drawn per index.
      deterministic: if True, return ``x``.
      impl: mask generator, as in :func:`dropout`.
      global_shape: inside ``shard_map``: the global shape ``x`` is a block of, as in
        :func:`dropout`. Only the batch axis is drawn, so devices that split another
        axis make the same decision for an example.
      offset: the global index of ``x``'s first element, one per axis (may be traced).
      residual: what the backward pass keeps, as in :func:`dropout`.

    Returns:
      ``x`` with each example either zeroed or scaled by ``1/(1-rate)``.

    Raises:
      AxisError: ``batch_axis`` out of range (a 0-d ``x`` has no batch axis).
      DropmaskError: the other errors of :func:`dropout`.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> y = dropmask.drop_path(jnp.ones((4, 3)), 0.5, jax.random.key(0))
      >>> bool((y == y[:, :1]).all())  # one decision per example
      True
    """
    call = _validate(
        x,
        rate,
        key,
        deterministic,
        batch_axis=batch_axis,
        impl=impl,
        global_shape=global_shape,
        offset=offset,
        residual=residual,
    )
    return _masked(call, rate, key, deterministic, impl, residual, combine=None)


def _replace_dropped(x: tuple[jax.Array, jax.Array], drop: jax.Array, realised: Any) -> jax.Array:
    """``unk_id`` where dropped; every token when a run-time rate is invalid (never clipped)."""
    tokens, unk = x
    drop = jnp.broadcast_to(drop, tokens.shape)
    if not isinstance(realised, float):
        drop = drop | jnp.isnan(realised)
    return jnp.where(drop, unk, tokens)


@named("word_dropout")
def word_dropout(
    tokens: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    unk_id: int,
    broadcast_dims: int | Sequence[int] = (),
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
) -> jax.Array:
    """Replaces each token id with ``unk_id`` with probability ``rate`` (no rescaling).

    Args:
      tokens: integer token ids ``[..., time]``.
      rate: probability of replacing a token. A traced ``rate`` outside ``[0, 1]``
        replaces every token (nothing is clipped).
      key: PRNG key (needed in training mode).
      unk_id: the id dropped tokens become; must fit ``tokens.dtype``.
      broadcast_dims: axes that share one decision (e.g. drop a word type per batch).
      deterministic: if True, return ``tokens``.
      impl: ``"flax"`` draws ``bernoulli(key, rate)`` as the SST-2 example's
        ``WordDropout`` does, so the replaced positions match it bit for bit.
      global_shape: inside ``shard_map``: the global shape ``tokens`` is a block of;
        with ``offset`` the local result is the matching block of the global call, as
        in :func:`dropout` (needs ``impl="fast"``).
      offset: the global index of ``tokens``' first element, one per axis (may be
        traced).

    Returns:
      Token ids of the same shape and dtype.

    Raises:
      DtypeError: ``tokens`` is not an integer array.
      DropmaskTypeError: ``unk_id`` is not an int.
      DropmaskValueError: ``unk_id`` does not fit the token dtype, or a bad block.
      DropmaskError: the other errors of :func:`dropout`.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> t = dropmask.word_dropout(jnp.arange(2, 10), 0.5, jax.random.key(0), unk_id=1)
      >>> bool(((t == 1) | (t == jnp.arange(2, 10))).all())
      True
    """
    caller = call_name()
    call = _validate(
        tokens,
        rate,
        key,
        deterministic,
        kind="integer",
        broadcast_dims=broadcast_dims,
        impl=impl,
        global_shape=global_shape,
        offset=offset,
    )
    tokens = call.x
    info = np.iinfo(tokens.dtype)
    check_int(
        unk_id,
        caller=caller,
        name="unk_id",
        fix=" Pass the id of the unknown-word token, e.g. unk_id=1.",
    )
    if not info.min <= int(unk_id) <= info.max:
        raise user_error(
            DropmaskValueError,
            f"unk_id={unk_id} does not fit the token dtype {tokens.dtype} (range [{info.min}, "
            f"{info.max}])",
            "Use a wider dtype, e.g. tokens.astype(jnp.int32).",
            caller=caller,
        )
    if deterministic or call.value == 0.0:
        return tokens
    if call.value == 1.0:
        return jnp.full_like(tokens, unk_id)
    p = probability(rate, call.value, keep=False, caller=caller, impl=impl)
    unk = jnp.asarray(unk_id, tokens.dtype)
    bshape = mask_shape(tokens.shape, call.axes)
    return draw(key, bshape, p, impl, _replace_dropped, (tokens, unk), call.block, caller=caller)


@named("gaussian_dropout")
def gaussian_dropout(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    broadcast_dims: int | Sequence[int] = (),
    deterministic: bool = False,
) -> jax.Array:
    """Multiplies ``x`` by noise drawn from ``N(1, rate / (1 - rate))``.

    The noise has the same mean and variance as the ``mask / keep_prob`` factor of
    :func:`dropout` at the same rate (Srivastava et al., 2014, section 10).

    Args:
      x: floating or complex array ``[...]``; noise is real, drawn in f32, applied to
        the real and imaginary parts alike, and the result cast back.
      rate: in ``[0, 1)``; ``rate == 1`` would need infinite variance.
      key: PRNG key (needed in training mode).
      broadcast_dims: axes that share one noise value.
      deterministic: if True, return ``x``.

    Returns:
      An array like ``x``; NaN for a traced ``rate`` outside ``[0, 1)``.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> y = dropmask.gaussian_dropout(jnp.ones(10_000), 0.5, jax.random.key(0))
      >>> bool(abs(y.mean() - 1) < 0.05 and abs(y.var() - 1) < 0.1)  # N(1, 0.5 / 0.5)
      True
    """
    call = _validate(
        x,
        rate,
        key,
        deterministic,
        broadcast_dims=broadcast_dims,
        impl=None,
        allow_one=False,
    )
    x = call.x
    if deterministic or call.value == 0.0:
        return x
    p = probability(rate, call.value, keep=False, caller=call_name(), impl=None)
    rate_arr = jnp.asarray(p, jnp.float32)
    std = jnp.sqrt(rate_arr / jnp.where(rate_arr < 1, 1.0 - rate_arr, 1.0))
    noise = 1.0 + std * jax.random.normal(key, mask_shape(x.shape, call.axes), dtype=jnp.float32)
    out = _per_part(lambda part: (part.astype(jnp.float32) * noise).astype(part.dtype), x)
    if call.value is None:
        valid = (rate_arr >= 0) & (rate_arr < 1)
        out = jnp.where(valid, out, jnp.array(jnp.nan, x.dtype))
    return out


def _alpha_constants(realised: Any, dtype: Any) -> tuple[Any, Any, Any]:
    """``(a, b, dropped)``: alpha dropout's kept units become ``a * x + b`` and its dropped
    ones ``dropped = a * alpha' + b``, so that mean 0 and variance 1 are kept when a
    fraction ``realised`` of the units is kept. All three are NaN for NaN ``realised``
    (an invalid run-time rate); ``dropped`` is 0 when nothing is kept.

    A static rate's are computed on the host (NumPy), as :func:`scale_and_fill` computes
    dropout's scale, and a run-time rate's in the program, by the same correctly rounded
    operations in ``dtype`` in the same order, so that both give the same bits. XLA
    would round some of them otherwise, so none is left for it to rewrite: no product is
    added to anything (a product and a sum fuse into an FMA, rounded once), so ``keep *
    (1 + drop * alpha'**2)`` is computed as ``keep * alpha'**2 * (drop + 1 /
    alpha'**2)`` and ``a * alpha' + b`` as ``a * alpha' * keep``; and barriers keep ``(1 -
    keep) + c`` from becoming ``(1 + c) - keep`` and ``1 / sqrt`` from becoming ``rsqrt``,
    which is not correctly rounded.
    """
    if isinstance(realised, float):
        kind = np.dtype(dtype).type
        keep = kind(realised)
        drop = kind(1) - keep
        safe_keep = keep if keep > 0 else kind(1)
        root = np.sqrt(safe_keep * kind(_ALPHA_PRIME**2) * (drop + kind(1 / _ALPHA_PRIME**2)))
        a = kind(1) / root
        return a, -a * kind(_ALPHA_PRIME) * drop, a * kind(_ALPHA_PRIME) * keep
    keep = jnp.asarray(realised, dtype)
    drop = lax.optimization_barrier(1.0 - keep)
    safe_keep = jnp.where(keep > 0, keep, 1.0)
    root = jnp.sqrt(safe_keep * _ALPHA_PRIME**2 * (drop + 1 / _ALPHA_PRIME**2))
    a = 1.0 / lax.optimization_barrier(root)
    return a, -a * _ALPHA_PRIME * drop, a * _ALPHA_PRIME * keep


def _alpha_affine(x: jax.Array, keep: jax.Array, realised: Any) -> jax.Array:
    """``a * x + b`` where kept, ``a * alpha' + b`` where dropped: the (a, b) that keep a
    standardised input standardised."""
    keep = sharded_as(jnp.broadcast_to(keep, x.shape), x)
    dtype = _compute_dtype(x.dtype)
    a, b, dropped = _alpha_constants(realised, dtype)
    # x is selected by the flags before the affine, so that XLA cannot fold a * x + b
    # (rounded twice) where x is a constant; the dropped value comes from the flags, not
    # a broadcast constant (see dropped_value): False converts to 0.
    zeros = lax.convert_element_type(keep, dtype)
    kept = a * lax.select(keep, x.astype(dtype), zeros) + b
    return lax.select(keep, kept, zeros + dropped).astype(x.dtype)


@named("alpha_dropout")
def alpha_dropout(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    broadcast_dims: int | Sequence[int] = (),
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
    residual: Residual = DEFAULT_RESIDUAL,
) -> jax.Array:
    """Dropout for SELU networks: keeps zero mean and unit variance of the activations.

    Dropped units are set to SELU's saturation value ``-scale * alpha`` and the result
    is transformed by ``a * y + b`` so that a standardised input stays standardised
    (Klambauer et al., 2017).

    Args:
      x: real floating activations ``[...]``, ideally SELU outputs.
      rate: probability of dropping, in ``[0, 1]``; ``rate == 1`` returns zeros (the
        mean of the SELU fixed point), with zero gradients.
      key: PRNG key (needed in training mode).
      broadcast_dims: axes that share one mask value.
      deterministic: if True, return ``x``.
      impl: mask generator, as in :func:`dropout`.
      global_shape: inside ``shard_map``: the global shape ``x`` is a block of; with
        ``offset`` the local result is the matching block of the global call, as in
        :func:`dropout`.
      offset: the global index of ``x``'s first element, one per axis (may be traced).
      residual: what the backward pass keeps, as in :func:`dropout`.

    Returns:
      An array like ``x``; NaN for a traced ``rate`` outside ``[0, 1]``.

    Raises:
      DropmaskError: the errors of :func:`dropout`; ``DtypeError`` also for complex ``x``.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> x = jax.random.normal(jax.random.key(0), (10_000,))  # standardised
      >>> y = dropmask.alpha_dropout(x, 0.2, jax.random.key(1))
      >>> bool(abs(y.mean()) < 0.05 and abs(y.std() - 1) < 0.05)  # still standardised
      True
    """
    call = _validate(
        x,
        rate,
        key,
        deterministic,
        kind="floating",
        broadcast_dims=broadcast_dims,
        impl=impl,
        global_shape=global_shape,
        offset=offset,
        residual=residual,
    )
    return _masked(call, rate, key, deterministic, impl, residual, combine=_alpha_affine)
