"""Masked dot-product attention, a drop-in ``attention_fn`` for Flax.

It computes what ``flax.linen.dot_product_attention`` computes, except where Flax
is wrong: a query with no valid key outputs zeros (Flax and
``jax.nn.dot_product_attention`` output the mean of all values), with finite
gradients, and a query depends only on the keys its mask allows. A NaN or inf in a
key or value reaches exactly the queries that may attend to it, in values and in
gradients: Flax and ``jax.nn`` spread it to every query through ``0 * NaN`` in the
einsums (forward and backward).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from .._checks import (
    check_bool_mask,
    check_broadcastable,
    check_choice,
    check_floating,
    check_impl,
    check_int,
    check_integer_dtype,
    check_key,
    check_lengths,
    check_one_key,
    check_rate,
    check_window,
)
from .._errors import (
    DropmaskTypeError,
    DropmaskValueError,
    DtypeError,
    call_name,
    named,
    user_error,
)
from .._masks import as_array, sequence_mask
from .._random import (
    DEFAULT_IMPL,
    Impl,
    auto_partitioned,
    probability,
    tpu_interpret,
    tpu_kernels_run,
)
from .._reductions import compute_dtype
from . import _blockwise as bw
from . import _kernel_inputs as ki
from ._dense import Dense, dense, dense_jit, rank
from ._nonfinite import poison, prepared

__all__ = ["Algorithm", "dot_product_attention"]

Algorithm = Literal["auto", "dense", "blockwise", "pallas"]
_ALGORITHMS = ("auto", "dense", "blockwise", "pallas")
# "auto" takes the blockwise path from this many scores per (batch, head) on, by the
# inputs' itemsize: where it measured faster than the dense path in a Transformer
# encoder layer's train step with dropout on CPU, or where the dense weights would
# outgrow the machine (`python -m benchmarks.bench_transformer_step --paths`, in
# benchmarks/RESULTS.md). In bf16 the dense path is faster at 256 tokens and the
# blockwise one from 512 on; in f32 the dense path is faster through 2048 tokens.
AUTO_BLOCKWISE_SCORES = {2: 512 * 512, 4: 4096 * 4096}
# Where the Pallas TPU kernels run (a TPU, see ``_random.tpu_kernels_run``), "auto" takes
# them from this many scores on, in either dtype. On a v5e (bf16, dropout 0.1, forward
# and backward; a one-off comparison, not one of bench_tpu's rows) they took 0.72x the
# dense path's time at [4, 1024, 16, 64] and 0.68x at 2048 tokens, and in the 4-layer
# train step of benchmarks/bench_tpu.py (1024 tokens, 16 heads of 64) 0.42x; the dense
# path was faster only with few heads of 128 (0.97x the kernels' time at [1, 512, 8,
# 128] causal, 0.76x at 1024).
AUTO_FLASH_SCORES = 512 * 512

_HINT = (
    "Attention masks and biases are [batch..., heads, q_len, kv_len] (heads may be 1); "
    "build masks with dropmask.attention_mask, causal_mask or segment_mask."
)
_PAD_HINT = "kv_lengths is [batch...]; kv_mask and segment ids are [batch..., length]."


def _check_qkv(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if not q.ndim == k.ndim == v.ndim or q.ndim < 3:
        raise user_error(
            DropmaskValueError,
            "q, k, v must have the same rank >= 3 ([batch..., length, heads, depth]), got "
            f"shapes {q.shape}, {k.shape}, {v.shape}",
            caller=call_name(),
        )
    if not q.shape[:-3] == k.shape[:-3] == v.shape[:-3]:
        raise user_error(
            DropmaskValueError,
            f"q, k, v batch dims must match, got shapes {q.shape}, {k.shape}, {v.shape}",
            caller=call_name(),
        )
    if k.shape[-3] != v.shape[-3] or k.shape[-2] != v.shape[-2]:
        raise user_error(
            DropmaskValueError,
            f"k and v must have the same length and heads, got {k.shape} and {v.shape}",
            caller=call_name(),
        )
    if q.shape[-1] != k.shape[-1]:
        raise user_error(
            DropmaskValueError,
            f"q and k depths must match, got {q.shape[-1]} and {k.shape[-1]}",
            caller=call_name(),
        )
    if q.shape[-2] % k.shape[-2]:
        raise user_error(
            DropmaskValueError,
            f"query heads ({q.shape[-2]}) must be a multiple of key/value heads ({k.shape[-2]}) "
            "(grouped-query attention)",
            caller=call_name(),
        )


def _as_mask(mask: Any, logits_shape: tuple[int, ...]) -> jax.Array:
    """Bool mask of rank ``len(logits_shape)``; Flax 0/1 numeric masks are accepted."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        if not (jnp.issubdtype(mask.dtype, jnp.number)):
            raise user_error(
                DtypeError,
                f"mask must be boolean or numeric, got {mask.dtype}",
                caller=call_name(),
            )
        mask = mask != 0
    check_broadcastable(mask.shape, logits_shape, caller=call_name(), name="mask", hint=_HINT)
    return mask.reshape((1,) * (len(logits_shape) - mask.ndim) + mask.shape)


@named("dot_product_attention", rate="dropout_rate")
def dot_product_attention(
    q: jax.typing.ArrayLike,
    k: jax.typing.ArrayLike,
    v: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
    bias: jax.typing.ArrayLike | None = None,
    dropout_rate: float | jax.Array = 0.0,
    key: Any = None,
    deterministic: bool = True,
    broadcast_dropout: bool = True,
    is_causal: bool = False,
    window: int | tuple[int, int] | None = None,
    kv_lengths: jax.typing.ArrayLike | None = None,
    kv_mask: jax.typing.ArrayLike | None = None,
    q_segment_ids: jax.typing.ArrayLike | None = None,
    kv_segment_ids: jax.typing.ArrayLike | None = None,
    algorithm: Algorithm = "auto",
    block_q: int | None = None,
    block_k: int | None = None,
    dropout_rng: Any = None,
    dtype: Any = None,
    precision: Any = None,
    module: Any = None,
    force_fp32_for_softmax: bool = False,
    qk_attn_weights_einsum: Callable[..., jax.Array] | None = None,
    attn_weights_value_einsum: Callable[..., jax.Array] | None = None,
    impl: Impl = DEFAULT_IMPL,
) -> jax.Array:
    """Scaled dot-product attention with boolean masks, bias and attention dropout.

    Plugs into ``flax.linen.MultiHeadDotProductAttention(attention_fn=...)`` and
    ``flax.nnx.MultiHeadAttention(attention_fn=...)``: it accepts the keywords they
    pass (``dropout_rng``, ``dtype``, ``precision``, ``module``, ``is_causal``, ...).

    Two algorithms compute the same result. ``"dense"`` builds the weights
    ``[batch..., heads, q_len, kv_len]``. ``"blockwise"`` (FlashAttention-2) visits
    them in ``[block_q, block_k]`` tiles with an online softmax and recomputes the
    tiles in the backward pass, so memory grows linearly with the lengths; tiles that
    ``is_causal``, ``window``, key padding or segments mask entirely are skipped.
    Both drop exactly the same weights for the same key (``impl="fast"``).
    ``"pallas"`` runs the blockwise algorithm as Pallas kernels that draw the same
    dropout flags inside: Triton's on a GPU, Mosaic's on a TPU, with any number of
    devices (``docs/many_chips.md``), or inside ``dropmask.testing.tpu_kernels()``,
    Pallas's interpreter elsewhere.

    Args:
      q: ``[batch..., q_len, heads, depth]``.
      k: ``[batch..., kv_len, kv_heads, depth]``; ``heads`` must be a multiple of
        ``kv_heads`` (grouped-query attention, as in ``nnx``).
      v: ``[batch..., kv_len, kv_heads, v_depth]``.
      mask: broadcastable to ``[batch..., heads, q_len, kv_len]``; True (or, as in
        Flax, nonzero) = may attend. A query row with no valid key outputs zeros.
      bias: additive, broadcastable to ``[batch..., heads, q_len, kv_len]``; a -inf
        bias acts as a mask, a finite one (e.g. ``finfo.min``) does not.
      dropout_rate: probability of dropping an attention weight.
      key: PRNG key for dropout (``dropout_rng`` is Flax's name for it).
      deterministic: if True, no dropout.
      broadcast_dropout: share the dropout mask across batch and head dims, as Flax.
      is_causal: query ``i`` sees keys ``j <= i`` (:func:`causal_mask`'s alignment).
      window: sliding window, as :func:`sliding_window_mask`: query ``i`` sees keys
        ``i - left <= j <= i + right`` for ``window=(left, right)``; an int ``w`` means
        ``(w, w)``. With ``is_causal`` the right side is 0.
      kv_lengths: ``int[batch...]``: keys at index ``>= kv_lengths`` are padding.
      kv_mask: ``bool[batch..., kv_len]``: False marks padding keys.
      q_segment_ids: ``int[batch..., q_len]`` packed-sequence ids (0 = padding), as
        :func:`segment_mask`: a query sees keys of its own segment only.
      kv_segment_ids: ``int[batch..., kv_len]``; defaults to ``q_segment_ids`` when
        ``q_len == kv_len``.
      algorithm: ``"dense"``, ``"blockwise"``, ``"pallas"`` or ``"auto"``: blockwise from
        ``q_len * kv_len >= 512 * 512`` on for 16-bit inputs and from ``4096 * 4096``
        for f32 (where it measured faster, or the dense weights grow too large), dense
        below, and dense whenever the blockwise path cannot serve the call
        (``impl="flax"``, custom einsums, ``module`` to sow the weights into). The
        blockwise path is a ``custom_vjp``: ``jvp``, and second derivatives with
        ``is_causal`` or ``window``, need ``"dense"``. The dense path's dropout
        with ``impl="fast"`` is one too (its backward pass holds no dropped copy of
        the weights): ``jvp`` through dropout on the weights needs
        ``impl="flax"``. ``"pallas"`` takes no ``bias``; ``"auto"`` chooses it only
        where the TPU kernels run, from ``512 * 512`` scores on, when they serve the
        call (no dense ``mask``, float32 or bfloat16); on a TPU, ``"pallas"`` with what
        they do not serve takes the blockwise path. See ``docs/attention.md``.
      block_q, block_k: blockwise tile sizes (default 64 for a length up to 512, 128
        above; at most the length); any size gives the same result, sizes that do not
        divide the lengths included.
        For ``"pallas"``: powers of two >= 16 (default 64 and 32); on a TPU,
        ``block_q`` a multiple of 16 and ``block_k`` of 128 (default 512 and 1024).
      dropout_rng: alias of ``key``; pass one or the other.
      dtype: computation dtype; default: promote ``q``, ``k``, ``v``.
      precision: of the products, as for ``jnp.einsum`` (where None,
        ``jax.default_matmul_precision``'s). The TPU kernels have one bfloat16 pass
        (``DEFAULT``) and the float32 product (``HIGHEST``, also given for ``HIGH``); a
        precision they cannot give (a dot algorithm) takes the blockwise path.
      module: a Linen or NNX module to sow the weights into (``attention_weights``).
      force_fp32_for_softmax: accepted for Flax; the softmax always runs in float32
        for 16-bit inputs.
      qk_attn_weights_einsum: Linen's optional ``'...qhd,...khd->...hqk'`` einsum.
      attn_weights_value_einsum: Linen's optional ``'...hqk,...khd->...qhd'`` einsum.
      impl: dropout mask generator, as in :func:`dropmask.dropout`; ``"flax"`` draws
        the same mask as Flax's attention for the same key (bit-identical weights).

    Returns:
      ``[batch..., q_len, heads, v_depth]`` in the computation dtype.

      A query with no valid key outputs 0. A query that may attend to some key and
      meets NaN or inf (in its ``q``, a key or value it may attend to, or an allowed
      score) outputs NaN; every other output and gradient is as if those entries were
      finite. One convention on every path: ``docs/attention.md``, "Non-finite inputs
      and overflow".

    Raises:
      ValueError: mismatched q/k/v shapes, both ``key`` and ``dropout_rng``, custom
        einsums given without their partner or with ``precision``, an unknown
        ``algorithm``, ``algorithm="blockwise"`` or ``"pallas"`` with what only the
        dense path does (``impl="flax"``, custom einsums, ``module``), or
        ``algorithm="pallas"`` with what it does not take, or tiles that are not
        powers of two >= 16 (on a TPU: multiples of 16 and 128).
      MaskShapeError: ``mask``, ``bias``, ``kv_lengths``, ``kv_mask`` or segment ids
        do not broadcast to their shapes.
      RateError, MissingKeyError: as for :func:`dropmask.dropout`.
      DropmaskTypeError: forward mode (``jax.jvp``, ``jax.jacfwd``) reaches a path
        that is a ``custom_vjp`` (see ``algorithm``); the message names what to pass.
        A ``jax.jvp`` traced inside ``jax.jit``, or of a jitted function, fails only
        when the program compiles, outside this call: JAX's own ``TypeError``
        (``can't apply forward-mode autodiff (jvp) to a custom_vjp function``) then.

    Example:
      >>> import jax.numpy as jnp, dropmask
      >>> q = k = v = jnp.ones((1, 2, 1, 4))
      >>> mask = jnp.array([[True, True], [False, False]])
      >>> dropmask.dot_product_attention(q, k, v, mask=mask)[0, :, 0, 0].tolist()
      [1.0, 0.0]
      >>> dropmask.dot_product_attention(q, k, v, is_causal=True, algorithm="blockwise",
      ...                                block_k=1)[0, :, 0, 0].tolist()
      [1.0, 1.0]
    """
    c = _validate(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        dropout_rate=dropout_rate,
        key=key,
        dropout_rng=dropout_rng,
        deterministic=deterministic,
        is_causal=is_causal,
        window=window,
        kv_lengths=kv_lengths,
        kv_mask=kv_mask,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        dtype=dtype,
        precision=precision,
        einsums=(qk_attn_weights_einsum, attn_weights_value_einsum),
        impl=impl,
    )
    scores = c.q_len * c.kv_len

    def choose(flash: bool, on_tpu: bool) -> str:
        return _choose_path(
            algorithm,
            impl,
            module,
            qk_attn_weights_einsum is not None,
            scores >= AUTO_BLOCKWISE_SCORES[min(max(c.dtype.itemsize, 2), 4)],
            bias=bias is not None,
            flash=flash,
            on_tpu=on_tpu,
        )

    path = choose(
        _flash_serves(c, bias is not None, precision)
        and (algorithm != "auto" or scores >= AUTO_FLASH_SCORES),
        tpu_kernels_run(),
    )
    if path == "flash":
        sizes = _flash_block_sizes(block_q, block_k, c.q_len, c.kv_len)
    elif path == "pallas":
        sizes = _pallas_block_sizes(block_q, block_k, c.q_len, c.kv_len)
    else:
        sizes = _block_sizes(block_q, block_k, c.q_len, c.kv_len)

    def run(path: str, sizes: tuple[int, int]) -> jax.Array:
        if path == "dense":
            einsums = (qk_attn_weights_einsum, attn_weights_value_einsum)
            return _run_dense(c, dropout_rate, broadcast_dropout, precision, impl, module, einsums)
        return _run_tiled(c, path, sizes, dropout_rate, broadcast_dropout, precision)

    try:
        if path == "flash" and not tpu_interpret():
            # The kernels where the program is lowered for a TPU, else the path the call
            # takes without them (a CPU computation on a TPU host; each platform of a
            # multi-platform export): the same function, the same mask.
            other = choose(False, True)
            other_sizes = _block_sizes(block_q, block_k, c.q_len, c.kv_len)
            return lax.platform_dependent(
                tpu=lambda: run(path, sizes), default=lambda: run(other, other_sizes)
            )
        return run(path, sizes)
    except TypeError as err:
        forward = _forward_mode_error(err, path, algorithm, impl, c.drops)
        if forward is None:
            raise
        raise forward from None


@dataclasses.dataclass(frozen=True)
class _Checked:
    """One call's checked arguments: arrays in their final form, and the shapes."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    dtype: Any
    rng: Any
    rate: Any
    drops: bool
    batch: tuple[int, ...]
    kv_heads: int
    groups: int
    q_len: int
    kv_len: int
    logits_shape: tuple[int, ...]
    mask: Any
    bias: Any
    span: tuple[int | None, int | None]
    kv_valid: Any
    q_seg: Any
    kv_seg: Any


def _validate(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any,
    bias: Any,
    dropout_rate: Any,
    key: Any,
    dropout_rng: Any,
    deterministic: bool,
    is_causal: bool,
    window: Any,
    kv_lengths: Any,
    kv_mask: Any,
    q_segment_ids: Any,
    kv_segment_ids: Any,
    dtype: Any,
    precision: Any,
    einsums: tuple[Any, Any],
    impl: Any,
) -> _Checked:
    """Every check of :func:`dot_product_attention`, in order, before any work."""
    rng, rate, drops = _check_options(
        einsums, precision, key, dropout_rng, dropout_rate, impl, deterministic
    )
    q, k, v = as_array(q), as_array(k), as_array(v)
    dtype = _check_dtype(q, k, v, dtype)
    _check_qkv(q, k, v)
    heads, kv_heads = q.shape[-2], k.shape[-2]
    groups = heads // kv_heads
    if groups > 1 and einsums[0] is not None:
        raise user_error(
            DropmaskValueError,
            "custom einsums do not support grouped-query attention",
            caller=call_name(),
        )
    batch = q.shape[:-3]
    q_len, kv_len = q.shape[-3], k.shape[-3]
    logits_shape = (*batch, heads, q_len, kv_len)
    m = None if mask is None else _as_mask(mask, logits_shape)
    if bias is not None:
        _check_bias(bias, logits_shape)
    span = _window(window, is_causal)
    kv_valid = _kv_valid(kv_lengths, kv_mask, batch, kv_len)
    q_seg, kv_seg = _segments(q_segment_ids, kv_segment_ids, batch, q_len, kv_len)
    return _Checked(
        q=q,
        k=k,
        v=v,
        dtype=dtype,
        rng=rng,
        rate=rate,
        drops=drops,
        batch=batch,
        kv_heads=kv_heads,
        groups=groups,
        q_len=q_len,
        kv_len=kv_len,
        logits_shape=logits_shape,
        mask=m,
        bias=bias,
        span=span,
        kv_valid=kv_valid,
        q_seg=q_seg,
        kv_seg=kv_seg,
    )


def _check_options(
    einsums: tuple[Any, Any],
    precision: Any,
    key: Any,
    dropout_rng: Any,
    dropout_rate: Any,
    impl: Any,
    deterministic: bool,
) -> tuple[Any, float | None, bool]:
    """The einsum, key, rate and ``impl`` checks; ``(key, rate, whether it drops)``."""
    qk_attn_weights_einsum, attn_weights_value_einsum = einsums
    if (qk_attn_weights_einsum is None) != (attn_weights_value_einsum is None):
        raise user_error(
            DropmaskValueError,
            "qk_attn_weights_einsum and attn_weights_value_einsum must be given together",
            caller=call_name(),
        )
    if qk_attn_weights_einsum is not None and precision is not None:
        raise user_error(
            DropmaskValueError,
            "precision and custom einsums are mutually exclusive",
            caller=call_name(),
        )
    rng = check_one_key(key, dropout_rng, caller=call_name())
    rate = check_rate(dropout_rate, caller=call_name())
    check_impl(impl, caller=call_name())
    drops = not deterministic and rate != 0.0
    if drops:
        check_key(rng, caller=call_name())
    return rng, rate, drops


def _check_dtype(q: jax.Array, k: jax.Array, v: jax.Array, dtype: Any) -> Any:
    """The computation dtype (``dtype`` or that of q, k and v); raises unless real floating."""
    dtype = jnp.result_type(q, k, v) if dtype is None else jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise user_error(
            DtypeError,
            f"q, k and v must be real, got dtype {dtype} (the softmax over scores needs an order)",
            "Attend over real features, e.g. concatenate x.real and x.imag on the depth axis.",
            caller=call_name(),
        )
    check_floating(jnp.zeros((), dtype), caller=f"{call_name()} (q, k, v)")
    return dtype


def _check_bias(bias: Any, logits_shape: tuple[int, ...]) -> None:
    """Raises unless ``bias`` broadcasts to the scores and is not boolean."""
    check_broadcastable(jnp.shape(bias), logits_shape, caller=call_name(), name="bias", hint=_HINT)
    if jnp.result_type(bias) == jnp.bool_:
        raise user_error(
            DtypeError,
            "bias is added to the scores, so a boolean bias would add 1 where True; got dtype bool",
            "Pass a boolean array as mask= (True = attend).",
            caller=call_name(),
        )


def _run_dense(
    c: _Checked,
    dropout_rate: Any,
    broadcast_dropout: bool,
    precision: Any,
    impl: Impl,
    module: Any,
    einsums: tuple[Any, Any],
) -> jax.Array:
    """The dense path for a checked call: through one jitted computation when it can."""
    spec = Dense(
        dtype=c.dtype,
        kv_heads=c.kv_heads,
        groups=c.groups,
        precision=precision,
        logits_shape=c.logits_shape,
        span=c.span,
        broadcast_dropout=broadcast_dropout,
        drops=c.drops,
        impl=impl,
        rate=None if c.drops and isinstance(dropout_rate, jax.Array) else c.rate,
    )
    run_time_rate = dropout_rate if c.drops and isinstance(dropout_rate, jax.Array) else None
    rng = c.rng if c.drops else None
    arrays = (c.q, c.k, c.v, c.mask, c.kv_valid, c.q_seg, c.kv_seg, c.bias, rng)
    if module is None and einsums[0] is None:
        # One jitted computation per static spec: a model's layers of one shape
        # trace it (and its derivative rules) once, not once per layer.
        return dense_jit(spec, None, *arrays, run_time_rate)
    return dense(spec, (module, einsums), *arrays, run_time_rate)


def _run_tiled(
    c: _Checked,
    path: str,
    sizes: tuple[int, int],
    dropout_rate: Any,
    broadcast_dropout: bool,
    precision: Any,
) -> jax.Array:
    """The blockwise or Pallas path for a checked call."""
    # Non-finite entries are zeroed before the einsums (whose backward multiplies by
    # every key and query, masked or not) and recorded per position instead.
    q, k, v, bad_q, bad_k, bad_v = prepared(c.q, c.k, c.v, c.dtype)
    # As in dropout: a Python number is a compile-time rate, a JAX scalar (even a
    # concrete one) a run-time value, so every path draws with the same threshold.
    keep = probability(dropout_rate, c.rate, keep=True, caller=call_name()) if c.drops else None
    static_keep = keep if isinstance(keep, float) else None
    plan = bw.Plan(
        batch=c.batch,
        kv_heads=c.kv_heads,
        groups=c.groups,
        q_len=c.q_len,
        kv_len=c.kv_len,
        block_q=sizes[0],
        block_k=sizes[1],
        left=c.span[0],
        right=c.span[1],
        keep=static_keep,
        dropout=c.drops,
        broadcast_dropout=broadcast_dropout,
        precision=precision,
        accumulate=compute_dtype(c.dtype),
    )
    run_keep = None if static_keep is not None else keep
    # What the kernels take beside q, k, v (the blockwise path takes them as a Side).
    kernel_inputs = ki.KernelInputs(
        kv_valid=c.kv_valid,
        q_segments=c.q_seg,
        kv_segments=c.kv_seg,
        bad_q=bad_q,
        bad_kv=bad_k | bad_v,
        key=c.rng,
        run_time_keep=run_keep,
    )
    if path == "flash":
        from . import _flash_sharding as fs
        from . import _flash_tpu as ft

        flash = ft.Flash(
            plan,
            segments=c.q_seg is not None,
            interpret=tpu_interpret(),
            precision=ft.kernel_precision(precision) or lax.Precision.DEFAULT,
        )
        split = fs.split_of(q, k, v)
        if split is not None:
            out, tainted = fs.sharded_flash_attention(split, flash, q, k, v, kernel_inputs)
        else:
            out, tainted = ft.flash_attention(flash, q, k, v, kernel_inputs)
        return poison(out, q, tainted)
    if path == "pallas":
        # Imported here: jax.experimental.pallas loads only for the path that runs it.
        from . import _pallas as pa

        kernel = pa.Kernel(
            plan,
            segments=c.q_seg is not None,
            interpret=jax.default_backend() != "gpu",
            mask_dims=None if c.mask is None else pa.mask_dims(c.mask, c.batch),
        )
        out, tainted = pa.pallas_attention(kernel, q, k, v, kernel_inputs, mask=c.mask)
        return poison(out, q, tainted)

    bias = c.bias
    side = bw.make_side(
        plan,
        kv_valid=c.kv_valid,
        q_segments=c.q_seg,
        kv_segments=c.kv_seg,
        mask=c.mask,
        bias=None if bias is None else rank(jnp.asarray(bias), len(c.logits_shape)),
        bad_q=bad_q,
        bad_kv=bad_k | bad_v,
    )
    out, tainted = bw.blockwise_attention(plan, q, k, v, side, bw.Dropout(c.rng, run_keep))
    return poison(out, q, tainted)


def _window(window: Any, is_causal: bool) -> tuple[int | None, int | None]:
    """``(left, right)`` reach of a query (None = unbounded) from ``window`` and causality."""
    left = right = None
    if window is not None:
        left, right = check_window(
            window, caller=call_name(), fix=" Pass e.g. window=(128, 0) for causal local attention."
        )
    if is_causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def _kv_valid(lengths: Any, kv_mask: Any, batch: tuple[int, ...], kv_len: int) -> Any:
    """``bool`` broadcastable to ``[*batch, kv_len]`` from ``kv_lengths`` and ``kv_mask``."""
    valid = None
    if lengths is not None:
        arr = check_lengths(lengths, kv_len, caller=call_name(), name="kv_lengths")
        check_broadcastable(arr.shape, batch, caller=call_name(), name="kv_lengths", hint=_PAD_HINT)
        valid = sequence_mask(arr, kv_len)
    if kv_mask is not None:
        km = check_bool_mask(kv_mask, caller=call_name(), name="kv_mask")
        check_broadcastable(
            km.shape, (*batch, kv_len), caller=call_name(), name="kv_mask", hint=_PAD_HINT
        )
        valid = km if valid is None else valid & km
    return valid


def _segments(
    q_ids: Any, kv_ids: Any, batch: tuple[int, ...], q_len: int, kv_len: int
) -> tuple[Any, Any]:
    if q_ids is None and kv_ids is None:
        return None, None
    if q_ids is None:
        raise user_error(
            DropmaskValueError,
            "kv_segment_ids needs q_segment_ids (the queries' segments)",
            "Pass both.",
            caller=call_name(),
        )
    if kv_ids is None:
        if q_len != kv_len:
            raise user_error(
                DropmaskValueError,
                f"q_segment_ids alone serves keys only when q_len == kv_len, got {q_len} and "
                f"{kv_len}",
                "Pass kv_segment_ids too.",
                caller=call_name(),
            )
        kv_ids = q_ids
    q_ids, kv_ids = jnp.asarray(q_ids), jnp.asarray(kv_ids)
    for ids, name, length in ((q_ids, "q_segment_ids", q_len), (kv_ids, "kv_segment_ids", kv_len)):
        check_integer_dtype(ids, caller=call_name(), name=name)
        check_broadcastable(
            ids.shape, (*batch, length), caller=call_name(), name=name, hint=_PAD_HINT
        )
    return q_ids, kv_ids


# JAX's message when forward mode evaluates a custom_vjp's derivative.
_JVP_OF_CUSTOM_VJP = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"


def _forward_mode_error(
    err: TypeError, path: str, algorithm: Any, impl: Any, drops: bool
) -> Exception | None:
    """dropmask's one line for JAX's error when forward mode (``jax.jvp``,
    ``jax.jacfwd``) meets a path that is a ``custom_vjp``: the blockwise and Pallas
    paths, and the dense path's dropout with ``impl="fast"``; None for any other error."""
    dense_vjp = drops and impl == "fast"
    if _JVP_OF_CUSTOM_VJP not in str(err) or (path == "dense" and not dense_vjp):
        return None
    reverse = "or differentiate in reverse mode (jax.grad, jax.vjp)."
    if path == "dense":
        return user_error(
            DropmaskTypeError,
            "impl must be 'flax' for forward-mode autodiff (jax.jvp, jax.jacfwd) through "
            f"dropout on the attention weights, got {impl!r}",
            f"Pass impl='flax', {reverse}",
            caller=call_name(),
        )
    chose = "" if algorithm == path else f", which chose {path!r} for these lengths"
    return user_error(
        DropmaskTypeError,
        f"algorithm must be 'dense' for forward-mode autodiff (jax.jvp, jax.jacfwd), got "
        f"{algorithm!r}{chose}",
        f"Pass algorithm='dense'{' and impl=' + repr('flax') if dense_vjp else ''}, {reverse}",
        caller=call_name(),
    )


def _choose_path(
    algorithm: Any,
    impl: str,
    module: Any,
    custom_einsums: bool,
    long: bool,
    *,
    bias: bool,
    flash: bool = False,
    on_tpu: bool = False,
) -> str:
    """``"dense"``, ``"blockwise"``, ``"pallas"`` or ``"flash"`` (the Pallas TPU kernels);
    raises if ``algorithm`` cannot serve. ``flash``: whether the TPU kernels run here
    and serve the call (and for ``"auto"``, its length); ``on_tpu``: whether they run
    here at all."""
    check_choice(algorithm, _ALGORITHMS, caller=call_name(), name="algorithm")
    dense_only = []
    if impl == "flax":
        dense_only.append(
            "impl='flax' (its masks are not counter-based: no tile can draw its part)"
        )
    if custom_einsums:
        dense_only.append("custom einsums")
    if module is not None:
        dense_only.append("module= (sowing the weights needs them whole)")
    if algorithm in ("blockwise", "pallas") and dense_only:
        raise user_error(
            DropmaskValueError,
            f"algorithm={algorithm!r} cannot take {dense_only[0]}",
            "Use algorithm='dense' (or 'auto'), or drop that argument.",
            caller=call_name(),
        )
    if algorithm == "pallas" and bias:
        raise user_error(
            DropmaskValueError,
            "algorithm='pallas' does not take bias= yet (its gradient would be a [q_len, "
            "kv_len] array per batch and head)",
            "Use algorithm='blockwise', which computes the same function with it.",
            caller=call_name(),
        )
    if algorithm == "auto":
        if not dense_only and flash:
            return "flash"
        return "blockwise" if not dense_only and long else "dense"
    if algorithm == "pallas" and on_tpu:
        # What the TPU kernels do not take (a dense mask, float16), the blockwise path
        # does, with the same dropout mask.
        return "flash" if flash else "blockwise"
    return algorithm


def _flash_serves(c: _Checked, bias: bool, precision: Any) -> bool:
    """Whether the Pallas TPU kernels run here and serve the call's inputs and precision:
    not in a program XLA partitions itself (``_flash_sharding``)."""
    if not tpu_kernels_run() or auto_partitioned(c.q):
        return False
    from . import _flash_tpu as ft

    if ft.kernel_precision(precision) is None:
        return False

    return ft.serves(
        c.dtype,
        c.kv_len,
        c.drops,
        (c.q.shape[-1], c.v.shape[-1]),
        mask=c.mask is not None,
        bias=bias,
        interpret=tpu_interpret(),
    )


def _flash_block_sizes(block_q: Any, block_k: Any, q_len: int, kv_len: int) -> tuple[int, int]:
    """The TPU kernels' tiles: ``block_q`` a multiple of 16 (a bfloat16 tile's rows),
    ``block_k`` of 128 (a vector register's lanes), at most the padded lengths."""
    from . import _flash_tpu as ft

    sizes = []
    for size, name, length, default, unit in (
        (block_q, "block_q", q_len, ft.DEFAULT_BLOCKS[0], 16),
        (block_k, "block_k", kv_len, ft.DEFAULT_BLOCKS[1], 128),
    ):
        if size is None:
            size = default
        size = check_int(size, name=name, caller=call_name(), minimum=1, shape=True)
        if size % unit:
            raise user_error(
                DropmaskValueError,
                f"{name} must be a multiple of {unit} for algorithm='pallas' on a TPU "
                f"(its kernels' tiles), got {size}",
                f"Pass e.g. {name}={default}, or leave it unset.",
                caller=call_name(),
            )
        sizes.append(min(size, -(-length // unit) * unit))
    return sizes[0], sizes[1]


def _pallas_block_sizes(block_q: Any, block_k: Any, q_len: int, kv_len: int) -> tuple[int, int]:
    """Power-of-two tiles of at least 16 (Triton's), at most the padded lengths."""
    from . import _pallas as pa

    sizes = []
    for size, name, length, default in (
        (block_q, "block_q", q_len, pa.DEFAULT_BLOCK_Q),
        (block_k, "block_k", kv_len, pa.DEFAULT_BLOCK_K),
    ):
        if size is None:
            size = default
        size = check_int(size, name=name, caller=call_name(), minimum=1, shape=True)
        if size < 16 or size & (size - 1):
            raise user_error(
                DropmaskValueError,
                f"{name} must be a power of two >= 16 for algorithm='pallas' (Triton's tile "
                f"sizes), got {size}",
                f"Pass e.g. {name}={default}.",
                caller=call_name(),
            )
        sizes.append(min(size, max(16, _next_power_of_two(length))))
    return sizes[0], sizes[1]


def _next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 2 ** (n - 1).bit_length()


def _block_sizes(block_q: Any, block_k: Any, q_len: int, kv_len: int) -> tuple[int, int]:
    sizes = []
    for size, name, length in ((block_q, "block_q", q_len), (block_k, "block_k", kv_len)):
        size = (
            bw.default_block(length)
            if size is None
            else check_int(size, name=name, caller=call_name(), minimum=1, shape=True)
        )
        sizes.append(max(min(size, length), 1))
    return sizes[0], sizes[1]
