"""DropHead: whole attention heads dropped per example (Zhou et al., 2020).

A head's output ``[q_len, depth]`` is kept or zeroed whole, one decision per example
and head, and the kept heads are scaled by ``1 / (1 - rate)``: :func:`dropmask.dropout`
with the query and depth axes shared, so it inherits that mask's guarantees (the same
mask eagerly, under ``jit``, ``vmap`` and any sharding). Zeroing a head's output is
zeroing its attention weights, which is what the paper drops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._attention import dot_product_attention
from .._checks import check_array, check_ndim, check_one_key, check_rate, concrete_value
from .._dropout import dropout
from .._errors import call_name, named, naming
from .._random import DEFAULT_RESIDUAL, Residual

__all__ = ["drop_head", "drop_head_attention"]


@named("drop_head")
def drop_head(
    x: jax.typing.ArrayLike,
    rate: float | jax.Array,
    key: Any = None,
    *,
    deterministic: bool = False,
    global_shape: Sequence[int] | None = None,
    offset: Sequence[Any] | None = None,
    residual: Residual = DEFAULT_RESIDUAL,
) -> jax.Array:
    """Zeroes whole heads of an attention output per example, scaling the rest.

    Args:
      x: ``[batch..., q_len, heads, depth]``, as :func:`dropmask.dot_product_attention`
        returns (before the heads are merged by the output projection).
      rate: probability of dropping a head of an example.
      key: PRNG key (needed in training mode).
      deterministic: if True, return ``x``.
      global_shape: inside ``shard_map``, as in :func:`dropmask.dropout`.
      offset: see ``global_shape``.
      residual: what the backward pass keeps, as in :func:`dropmask.dropout`.

    Returns:
      An array like ``x``, each ``[q_len, depth]`` slice of a head zero or scaled by
      ``1 / (1 - rate)``.

    Raises:
      DropmaskValueError: ``x`` has fewer than 3 axes.
      DropmaskError: the errors of :func:`dropmask.dropout`.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> y = dropmask.drop_head(jnp.ones((2, 5, 4, 8)), 0.5, jax.random.key(0))
      >>> bool((y == y[:, :1, :, :1]).all())  # one decision per example and head
      True
    """
    caller = call_name()
    arr = check_array(x, caller=caller)
    check_ndim(
        arr.shape,
        caller=caller,
        name="x",
        layout="an attention output [batch..., q_len, heads, depth] (at least 3-d)",
        minimum=3,
        fix=" Drop heads before the output projection.",
    )
    return dropout(
        arr,
        rate,
        key,
        broadcast_dims=(arr.ndim - 3, arr.ndim - 1),
        deterministic=deterministic,
        global_shape=global_shape,
        offset=offset,
        residual=residual,
    )


@named("drop_head_attention")
def drop_head_attention(
    q: jax.typing.ArrayLike,
    k: jax.typing.ArrayLike,
    v: jax.typing.ArrayLike,
    *,
    mask: jax.typing.ArrayLike | None = None,
    bias: jax.typing.ArrayLike | None = None,
    dropout_rate: float | jax.Array = 0.0,
    dropout_rng: Any = None,
    key: Any = None,
    deterministic: bool = True,
    broadcast_dropout: bool = True,
    is_causal: bool = False,
    dtype: Any = None,
    precision: Any = None,
    module: Any = None,
    force_fp32_for_softmax: bool = False,
    qk_attn_weights_einsum: Callable[..., jax.Array] | None = None,
    attn_weights_value_einsum: Callable[..., jax.Array] | None = None,
    weights_rate: float | jax.Array = 0.0,
    **kwargs: Any,
) -> jax.Array:
    """:func:`dropmask.dot_product_attention` that drops whole heads instead of weights.

    A drop-in ``attention_fn`` for ``flax.linen.MultiHeadDotProductAttention`` and
    ``flax.nnx.MultiHeadAttention``: the module's ``dropout_rate`` becomes the head
    drop rate, and its dropout key draws the heads::

        nn.MultiHeadDotProductAttention(num_heads=8, dropout_rate=0.1,
                                        attention_fn=dropmask.drop_head_attention)

    Every keyword either module passes is named in the signature: Linen's module
    passes only the keywords an ``attention_fn``'s signature names, so one left to
    ``**kwargs`` (the mask, say) would be silently dropped.

    Args:
      q, k, v: as in :func:`dropmask.dot_product_attention`.
      mask, bias, is_causal, dtype, precision, module: as in
        :func:`dropmask.dot_product_attention`.
      force_fp32_for_softmax, qk_attn_weights_einsum, attn_weights_value_einsum: as
        in :func:`dropmask.dot_product_attention`.
      dropout_rate: probability of dropping a head of an example.
      dropout_rng: the dropout key (Flax's name); ``key`` is its alias.
      key: see ``dropout_rng``.
      deterministic: if True, nothing is dropped.
      broadcast_dropout: for ``weights_rate``'s draw, as in
        :func:`dropmask.dot_product_attention`.
      weights_rate: attention-weight dropout as well (0: none); the two draws use
        independent keys split from the one given.
      **kwargs: the other keywords of :func:`dropmask.dot_product_attention`
        (``window``, ``kv_lengths``, ``algorithm``, ``impl``, ...).

    Returns:
      ``[batch..., q_len, heads, v_depth]``, as :func:`dropmask.drop_head` of the
      attention output (with ``weights_rate == 0`` the heads are drawn from the key
      itself).

    Raises:
      DropmaskValueError: both ``key`` and ``dropout_rng``.
      DropmaskError: the errors of :func:`dropmask.dot_product_attention` and :func:`drop_head`.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> q = jnp.ones((2, 3, 4, 8))
      >>> y = dropmask.drop_head_attention(q, q, q, dropout_rate=0.5,
      ...                                  dropout_rng=jax.random.key(0), deterministic=False)
      >>> y.shape
      (2, 3, 4, 8)
    """
    caller = call_name()
    rng = check_one_key(key, dropout_rng, caller=caller)
    check_rate(dropout_rate, caller=caller, name="dropout_rate")
    check_rate(weights_rate, caller=caller, name="weights_rate")
    drops_weights = not deterministic and concrete_value(weights_rate) != 0.0
    heads_key, weights_key = rng, None
    if drops_weights and rng is not None:
        heads_key, weights_key = jax.random.split(rng)
    # Attention's errors name this call and its weights_rate; it runs the einsum
    # callbacks unnamed (they are the user's code).
    with naming(caller, rate="weights_rate"):
        out = dot_product_attention(
            q,
            k,
            v,
            dropout_rate=weights_rate,
            key=weights_key,
            deterministic=not drops_weights,
            mask=mask,
            bias=bias,
            broadcast_dropout=broadcast_dropout,
            is_causal=is_causal,
            dtype=dtype,
            precision=precision,
            module=module,
            force_fp32_for_softmax=force_fp32_for_softmax,
            qk_attn_weights_einsum=qk_attn_weights_einsum,
            attn_weights_value_einsum=attn_weights_value_einsum,
            **kwargs,
        )
    with naming(caller, rate="dropout_rate"):
        return drop_head(out, dropout_rate, heads_key, deterministic=deterministic)
