"""The functional dropout family: one implementation that every module calls.

Channel ("spatial") dropout is ordinary :func:`dropout` with ``broadcast_dims``:
for images ``x: [batch, height, width, channels]`` pass ``broadcast_dims=(1, 2)`` to
drop whole feature maps; for sequences ``x: [batch, time, features]`` pass
``broadcast_dims=(1,)`` to drop the same features at every time step (variational
dropout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._errors import (
    DtypeError,
    check_floating,
    check_key,
    check_rate,
    concrete_value,
    normalize_axes,
)
from ._fast_mask import Block, Threshold, keep_from_words, key_words, local_block, threshold
from ._random import DEFAULT_IMPL, Impl, check_impl, draw_keep, mask_shape

__all__ = ["alpha_dropout", "drop_path", "dropout", "gaussian_dropout", "word_dropout"]

# SELU's fixed point: the value a dropped unit takes in alpha dropout is
# -scale * alpha, the SELU output for x -> -inf (Klambauer et al., 2017).
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_ALPHA_PRIME = -_SELU_SCALE * _SELU_ALPHA


def _check_common(x: Any, rate: Any, key: Any, deterministic: bool, fn: str) -> float | None:
    check_floating(x, fn=fn, hint="" if fn != "dropout" else ", or use word_dropout for token ids")
    static_rate = check_rate(rate)
    if needs_key(rate, deterministic):
        check_key(key, fn=fn)
    return static_rate


def needs_key(rate: Any, deterministic: bool) -> bool:
    """Whether a call draws randomness: not in eval mode, and unless ``rate`` is 0 or 1.

    Modules use this to decide whether to fetch a key, so that (as in Flax) a layer
    with rate 0 or 1, given as a float or a concrete JAX scalar, consumes none.
    """
    return not deterministic and concrete_value(rate) not in (0.0, 1.0)


def _nan_if_invalid(rate: jax.Array, out: jax.Array) -> jax.Array:
    """A traced rate cannot be checked at trace time: poison the output instead of clipping."""
    valid = (rate >= 0) & (rate <= 1)
    return jnp.where(valid, out, jnp.array(jnp.nan, out.dtype))


Combine = Callable[[jax.Array, jax.Array, Any], jax.Array]


def _with_keep_mask(
    x: jax.Array,
    key: Any,
    bshape: tuple[int, ...],
    keep_prob: Any,
    impl: str,
    combine: Combine,
    block: Block | None = None,
) -> jax.Array:
    """``combine(x, keep, realised_keep_prob)`` with ``keep: bool[x.shape]`` drawn from ``key``.

    With ``impl="fast"`` the mask is computed inside ``jax.checkpoint``, so reverse-mode
    autodiff saves only the four key words and regenerates the mask in the backward
    pass: no per-element residual, and forward-mode (``jvp``, ``hessian``) still works.
    """
    if impl == "flax":
        mask, realised = draw_keep(key, bshape, keep_prob, impl, block)
        return combine(x, jnp.broadcast_to(mask, x.shape), realised)
    thr = threshold(keep_prob)
    global_shape, offset = (None, None) if block is None else (block.global_shape, block.offset)
    static = (bshape, thr.nbits, thr.shift, global_shape, combine)
    if isinstance(thr.value, int):  # a static rate: the threshold is a compile-time constant
        return _regenerate_static(*static, x, key_words(key), offset, thr.value, thr.realised)
    return _regenerate_traced(*static, x, key_words(key), offset, thr.value, thr.realised)


def _regenerate(
    bshape: tuple[int, ...],
    nbits: int,
    shift: int,
    global_shape: tuple[int, ...] | None,
    combine: Combine,
    x: jax.Array,
    words: jax.Array,
    offset: tuple[Any, ...] | None,
    value: Any,
    realised: Any,
) -> jax.Array:
    block = None if global_shape is None or offset is None else Block(global_shape, offset)
    keep = keep_from_words(words, bshape, Threshold(nbits, shift, value, realised), block)
    return combine(x, jnp.broadcast_to(keep, x.shape), realised)


_SAVE_NOTHING = jax.checkpoint_policies.nothing_saveable
# Module-level and jitted, so that eager calls hit a compilation cache instead of
# re-tracing the checkpointed body op by op; under an outer jit they are inlined.
_STATIC_SHAPE_ARGS = (0, 1, 2, 3, 4)
_regenerate_traced = jax.jit(
    jax.checkpoint(_regenerate, policy=_SAVE_NOTHING, static_argnums=_STATIC_SHAPE_ARGS),
    static_argnums=_STATIC_SHAPE_ARGS,
)
_regenerate_static = jax.jit(
    jax.checkpoint(_regenerate, policy=_SAVE_NOTHING, static_argnums=(*_STATIC_SHAPE_ARGS, 8, 9)),
    static_argnums=(*_STATIC_SHAPE_ARGS, 8, 9),
)


def _compute_dtype(dtype: Any) -> Any:
    """Half-precision inputs are scaled in f32 so that ``1/keep`` is not rounded first."""
    return jnp.promote_types(dtype, jnp.float32)


def _scale_and_fill(realised: Any, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``1/realised`` (0 when nothing is kept) and the value for dropped elements (0).

    Both are NaN when ``realised`` is NaN (a traced rate outside [0, 1]), so that the
    whole output is NaN; they are scalars, so no per-element residual is needed.
    """
    realised = jnp.asarray(realised, dtype)
    positive = realised > 0
    scale = jnp.where(positive, 1.0 / jnp.where(positive, realised, 1.0), 0.0)
    invalid = jnp.isnan(realised)
    return jnp.where(invalid, jnp.nan, scale), jnp.where(invalid, jnp.nan, 0.0)


def _select_scaled(x: jax.Array, keep: jax.Array, realised: Any) -> jax.Array:
    """``x / realised`` where kept, 0 elsewhere; finite (zero) when ``realised == 0``."""
    dtype = _compute_dtype(x.dtype)
    scale, fill = _scale_and_fill(realised, dtype)
    return lax.select(keep, x.astype(dtype) * scale, jnp.broadcast_to(fill, x.shape)).astype(
        x.dtype
    )


def dropout(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    broadcast_dims: Sequence[int] = (),
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
) -> jax.Array:
    """Zeroes each element with probability ``rate`` and scales the rest by ``1/(1-rate)``.

    Args:
      x: floating array of any shape ``[...]`` (f16, bf16, f32, f64; dtype preserved).
      rate: probability of dropping, in ``[0, 1]``: a Python float, or a JAX scalar
        (e.g. from a schedule) that does not trigger recompilation per value.
      key: a JAX PRNG key; needed unless ``deterministic`` or ``rate == 0``.
      broadcast_dims: axes that share one mask value (negative axes allowed).
      deterministic: if True, return ``x`` unchanged.
      impl: mask generator: ``"fast"`` (default; counter-based Threefry, mask
        regenerated in the backward pass, same bits under any jit/vmap/sharding) or
        ``"flax"`` (bit-identical to ``flax.linen.Dropout``).
      global_shape: inside ``shard_map``: the global shape ``x`` is a block of. With
        ``offset`` the local result equals the matching block of the global dropout.
      offset: the global index of ``x``'s first element, one per axis (may be traced).

    Returns:
      An array like ``x``. ``rate == 0`` or ``deterministic`` returns ``x`` itself;
      ``rate == 1`` returns zeros, with zero (not NaN) gradients. A traced ``rate``
      outside ``[0, 1]`` makes the output NaN rather than being clipped.

    Raises:
      DtypeError: ``x`` is not floating point.
      RateError: a static ``rate`` outside ``[0, 1]`` or NaN.
      AxisError: a ``broadcast_dims`` axis out of range.
      MissingKeyError: ``key`` is None in training mode.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> y = dropmask.dropout(jnp.ones((2, 4)), 0.5, jax.random.key(0))
      >>> sorted(set(y.ravel().tolist())) in ([0.0, 2.0], [2.0], [0.0])
      True
    """
    static_rate = _check_common(x, rate, key, deterministic, "dropout")
    x = jnp.asarray(x)
    check_impl(impl)
    bshape = mask_shape(x.shape, broadcast_dims)
    block = local_block(x.shape, global_shape, offset, broadcast_dims)
    if deterministic or static_rate == 0.0:
        return x
    if static_rate == 1.0:
        return jnp.zeros_like(x)
    if impl == "flax" and block is not None:
        raise ValueError(
            "global_shape/offset need impl='fast'; impl='flax' masks are not blockwise."
        )
    if impl == "flax" and static_rate is not None:
        # Python float arithmetic exactly as Flax does it, for bit-identical outputs.
        keep_prob = 1.0 - static_rate
        mask, _ = draw_keep(key, bshape, keep_prob, impl)
        mask = jnp.broadcast_to(mask, x.shape)
        return lax.select(mask, x / keep_prob, jnp.zeros_like(x))
    if static_rate is not None:
        return _with_keep_mask(x, key, bshape, 1.0 - static_rate, impl, _select_scaled, block)
    rate = jnp.asarray(rate, dtype=jnp.float32)
    if impl == "flax":
        out = _with_keep_mask(x, key, bshape, 1.0 - rate, impl, _select_scaled, block)
        return _nan_if_invalid(rate, out)
    return _with_keep_mask(x, key, bshape, 1.0 - rate, impl, _select_scaled, block)


def drop_path(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    batch_axis: int = 0,
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
) -> jax.Array:
    """Stochastic depth: drops whole examples of a residual branch, scaling the rest.

    Args:
      x: ``[batch, ...]`` floating residual-branch output.
      rate: probability of dropping an example's branch.
      key: PRNG key (needed in training mode).
      batch_axis: the axis that indexes examples; one decision is drawn per index.
      deterministic: if True, return ``x``.
      impl: mask generator, as in :func:`dropout`.

    Returns:
      ``x`` with each example either zeroed or scaled by ``1/(1-rate)``.
    """
    x_arr = jnp.asarray(x)
    (axis,) = normalize_axes((batch_axis,), max(x_arr.ndim, 1), name="batch_axis")
    others = tuple(i for i in range(x_arr.ndim) if i != axis)
    return dropout(x_arr, rate, key, broadcast_dims=others, deterministic=deterministic, impl=impl)


def word_dropout(
    tokens: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    unk_id: int,
    broadcast_dims: Sequence[int] = (),
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
) -> jax.Array:
    """Replaces each token id with ``unk_id`` with probability ``rate`` (no rescaling).

    Args:
      tokens: integer token ids ``[..., time]``.
      rate: probability of replacing a token.
      key: PRNG key (needed in training mode).
      unk_id: the id dropped tokens become; must fit ``tokens.dtype``.
      broadcast_dims: axes that share one decision (e.g. drop a word type per batch).
      deterministic: if True, return ``tokens``.
      impl: ``"flax"`` draws ``bernoulli(key, rate)`` as the SST-2 example's
        ``WordDropout`` does, so the replaced positions match it bit for bit.

    Returns:
      Token ids of the same shape and dtype.
    """
    tokens = jnp.asarray(tokens)
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise DtypeError(
            f"word_dropout expects integer token ids, got dtype {tokens.dtype}. "
            f"For floating activations use dropout instead."
        )
    info = np.iinfo(tokens.dtype)
    if isinstance(unk_id, bool) or not isinstance(unk_id, int | np.integer):
        raise TypeError(f"unk_id must be a Python int, got {type(unk_id).__name__}.")
    if not info.min <= int(unk_id) <= info.max:
        raise ValueError(
            f"unk_id={unk_id} does not fit the token dtype {tokens.dtype} (range "
            f"[{info.min}, {info.max}]). Use a wider dtype, e.g. tokens.astype(jnp.int32)."
        )
    static_rate = check_rate(rate)
    check_impl(impl)
    bshape = mask_shape(tokens.shape, broadcast_dims)
    if deterministic or static_rate == 0.0:
        return tokens
    if static_rate == 1.0:
        return jnp.full_like(tokens, unk_id)
    check_key(key, fn="word_dropout")
    drop, _ = draw_keep(key, bshape, rate, impl)
    drop = jnp.broadcast_to(drop, tokens.shape)
    return jnp.where(drop, jnp.asarray(unk_id, tokens.dtype), tokens)


def gaussian_dropout(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    broadcast_dims: Sequence[int] = (),
    deterministic: bool = False,
) -> jax.Array:
    """Multiplies ``x`` by noise drawn from ``N(1, rate / (1 - rate))``.

    The noise has the same mean and variance as the ``mask / keep_prob`` factor of
    :func:`dropout` at the same rate (Srivastava et al., 2014, section 10).

    Args:
      x: floating array ``[...]``; noise is drawn in f32 and the result cast back.
      rate: in ``[0, 1)``; ``rate == 1`` would need infinite variance.
      key: PRNG key (needed in training mode).
      broadcast_dims: axes that share one noise value.
      deterministic: if True, return ``x``.

    Returns:
      An array like ``x``.
    """
    check_floating(x, fn="gaussian_dropout")
    static_rate = check_rate(rate, allow_one=False)
    x = jnp.asarray(x)
    bshape = mask_shape(x.shape, broadcast_dims)
    if deterministic or static_rate == 0.0:
        return x
    check_key(key, fn="gaussian_dropout")
    rate_arr = jnp.asarray(rate, jnp.float32)
    std = jnp.sqrt(rate_arr / jnp.where(rate_arr < 1, 1.0 - rate_arr, 1.0))
    noise = 1.0 + std * jax.random.normal(key, bshape, dtype=jnp.float32)
    out = (x.astype(jnp.float32) * noise).astype(x.dtype)
    if static_rate is None:
        out = jnp.where(rate_arr < 1, out, jnp.array(jnp.nan, x.dtype))
        out = _nan_if_invalid(rate_arr, out)
    return out


def _alpha_affine(x: jax.Array, keep: jax.Array, realised: Any) -> jax.Array:
    """``a * where(keep, x, alpha') + b`` with the (a, b) that preserve mean 0, variance 1."""
    dtype = _compute_dtype(x.dtype)
    realised = jnp.asarray(realised, dtype)
    drop = 1.0 - realised
    safe_keep = jnp.where(realised > 0, realised, 1.0)
    a = lax.rsqrt(safe_keep * (1.0 + drop * _ALPHA_PRIME**2))
    b = -a * _ALPHA_PRIME * drop
    y = jnp.where(keep, x.astype(dtype), jnp.asarray(_ALPHA_PRIME, dtype))
    _, fill = _scale_and_fill(realised, dtype)
    return jnp.where(realised > 0, a * y + b, fill).astype(x.dtype)


def alpha_dropout(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    broadcast_dims: Sequence[int] = (),
    deterministic: bool = False,
    impl: Impl = DEFAULT_IMPL,
) -> jax.Array:
    """Dropout for SELU networks: keeps zero mean and unit variance of the activations.

    Dropped units are set to SELU's saturation value ``-scale * alpha`` and the result
    is transformed by ``a * y + b`` so that a standardised input stays standardised
    (Klambauer et al., 2017).

    Args:
      x: floating activations ``[...]``, ideally SELU outputs.
      rate: probability of dropping, in ``[0, 1]``; ``rate == 1`` returns zeros (the
        mean of the SELU fixed point), with zero gradients.
      key: PRNG key (needed in training mode).
      broadcast_dims: axes that share one mask value.
      deterministic: if True, return ``x``.
      impl: mask generator, as in :func:`dropout`.

    Returns:
      An array like ``x``.
    """
    static_rate = _check_common(x, rate, key, deterministic, "alpha_dropout")
    x = jnp.asarray(x)
    bshape = mask_shape(x.shape, broadcast_dims)
    if deterministic or static_rate == 0.0:
        return x
    if static_rate == 1.0:
        return jnp.zeros_like(x)
    rate_arr = jnp.asarray(rate, jnp.float32)
    keep_prob = 1.0 - rate_arr if static_rate is None else 1.0 - static_rate
    out = _with_keep_mask(x, key, bshape, keep_prob, impl, _alpha_affine)
    if static_rate is None and impl == "flax":
        out = _nan_if_invalid(rate_arr, out)
    return out
