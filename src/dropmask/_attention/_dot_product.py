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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._errors import (
    DropmaskTypeError,
    call_name,
    named,
    user_error,
)
from .._random import (
    DEFAULT_IMPL,
    Impl,
    probability,
    tpu_interpret,
    tpu_kernels_run,
)
from .._reductions import compute_dtype
from . import _blockwise as bw
from . import _kernel_inputs as ki
from ._checked import Checked, validate
from ._dense import Dense, dense, dense_jit, rank
from ._flash_fallback import lowering_error
from ._nonfinite import poison, poison_where_tainted, prepared
from ._paths import ALGORITHMS as ALGORITHMS
from ._paths import (
    AUTO_BLOCKWISE_SCORES,
    AUTO_FLASH_SCORES,
    block_sizes,
    choose_path,
    flash_block_sizes,
    flash_serves,
    pallas_block_sizes,
)
from ._paths import Algorithm as Algorithm
from ._split import on_split

__all__ = ["Algorithm", "dot_product_attention"]


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
    c = validate(
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
    # Under a mesh of explicit axes: the call split by q's batch axes and heads.
    c, restore = on_split(c)
    scores = c.q_len * c.kv_len

    def choose(flash: bool, on_tpu: bool) -> str:
        return choose_path(
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
        flash_serves(c, bias is not None, precision, tpu_interpret())
        and (algorithm != "auto" or scores >= AUTO_FLASH_SCORES),
        tpu_kernels_run(),
    )
    if path == "flash":
        sizes = flash_block_sizes(block_q, block_k, c.q_len, c.kv_len)
    elif path == "pallas":
        sizes = pallas_block_sizes(block_q, block_k, c.q_len, c.kv_len)
    else:
        sizes = block_sizes(block_q, block_k, c.q_len, c.kv_len)

    def run(path: str, sizes: tuple[int, int]) -> jax.Array:
        if path == "dense":
            einsums = (qk_attn_weights_einsum, attn_weights_value_einsum)
            return _run_dense(c, dropout_rate, broadcast_dropout, precision, impl, module, einsums)
        return _run_tiled(c, path, sizes, dropout_rate, broadcast_dropout, precision)

    try:
        if path == "flash" and not tpu_interpret():
            # The kernels where the program is lowered for a TPU, else the path the call
            # takes without them (a CPU computation on a TPU host; each platform of a
            # multi-platform export): the same function, the same mask. A configuration
            # whose kernels Mosaic fails to lower takes that path everywhere.
            other = choose(False, True)
            other_sizes = block_sizes(block_q, block_k, c.q_len, c.kv_len)

            def by_kernels(c: Checked) -> jax.Array:
                return _run_tiled(c, path, sizes, dropout_rate, broadcast_dropout, precision)

            options = (sizes, dropout_rate, broadcast_dropout, str(precision))
            if lowering_error(c, by_kernels, *options) is not None:
                return restore(run(other, other_sizes))
            return restore(
                lax.platform_dependent(
                    tpu=lambda: run(path, sizes), default=lambda: run(other, other_sizes)
                )
            )
        return restore(run(path, sizes))
    except TypeError as err:
        forward = _forward_mode_error(err, path, algorithm, impl, c.drops)
        if forward is None:
            raise
        raise forward from None


def _run_dense(
    c: Checked,
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
    c: Checked,
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
        from ._split import split_of

        flash = ft.Flash(
            plan,
            segments=c.q_seg is not None,
            interpret=tpu_interpret(),
            precision=ft.kernel_precision(precision) or lax.Precision.DEFAULT,
        )
        split = split_of(q, k, v)
        if split is not None:
            out, tainted = fs.sharded_flash_attention(split, flash, q, k, v, kernel_inputs)
            return poison(out, q, tainted)
        out, tainted = ft.flash_attention(flash, q, k, v, kernel_inputs)
        return poison_where_tainted(out, q, tainted)
    if path == "pallas":
        # Imported here: jax.experimental.pallas loads only for the path that runs it.
        from . import _flash_triton as pa

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
