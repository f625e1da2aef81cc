"""The dense path with dropout on its weights: one backward rule for the softmax, the
dropout and the values product.

Differentiated as three rules (the softmax's, the dropout's select, the product's), the
backward pass of ``o = (flags * y) @ v`` holds one more ``[*b, heads, q, k]`` array than
at rate 0, read from XLA:CPU's buffer assignment:

- the dropped weights that ``v``'s gradient needs are a function of forward-pass values
  only, so XLA computes them in the forward pass and keeps them until then, whether JAX
  saves them or rebuilds them under ``jax.checkpoint``;
- the flags' select between ``g @ v.T`` and the softmax's derivative (a reduction over
  the keys) splits the fusion that, at rate 0, never writes that product out.

This rule answers both. Its backward pass takes ``rowsum(g * o)`` first, then rebuilds
the dropped weights from the kept weights and the mask's 1-bit words as a value of that
sum (:func:`_after`), takes ``v``'s gradient from them, and only then, again by a data
dependence, the weights' product ``g @ v.T``, whose consumer is one elementwise pass
(written in place):

    scores' cotangent = select(flags, (g @ v.T) * y, 0) - y * rowsum(g * o)

(``y`` the weights, ``o`` the output, ``v`` already scaled by ``1 / keep``), the
closed form of the three rules together: ``rowsum(g * o)`` over the depth replaces the
softmax derivative's sum over the keys. Taken first, it frees ``o`` and its copy of
``g`` before the dropped weights exist. The rule also poisons tainted rows
(:func:`poison`) and writes that derivative itself (:func:`poisoned_gradient`), so that
no ``q``-sized pad of it is held through the pass either.

A data dependence on the cotangent exists only in a transpose, which JAX offers as a
``custom_vjp`` (forward mode, ``jax.jvp``, then raises) or as
``jax.custom_derivatives.linear_call`` (no batching rule: ``jax.vmap`` of a gradient
fails). This path is a ``custom_vjp``, as the blockwise and Pallas paths are; forward
mode through dropout on the weights takes ``impl="flax"``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._random import Kept, explicitly_sharded_axes, first_element, resharded_to, sharded_as
from .._reductions import compute_dtype
from ._dense_weights import Score, attention_weights, scores
from ._nonfinite import poison, poisoned_cotangent, poisoned_gradient

__all__ = ["dropped_attention"]

Product = Callable[[jax.Array, jax.Array], jax.Array]


def dropped_attention(
    score: Score,
    product: Product,
    dtype: Any,
    q: jax.Array,
    k: jax.Array,
    bias: jax.Array | None,
    v: jax.Array,
    mask: Kept,
    structure: tuple[Any, jax.Array, jax.Array],
) -> jax.Array:
    """Dense attention with dropout on the weights, its tainted rows poisoned
    (:func:`poison`).

    Args:
      score: ``(q, k) -> scores``, bilinear (as :func:`attention_weights` takes it).
      product: ``(weights, v) -> output``, bilinear (``[*b, heads, q, k]`` weights).
      dtype: the weights' dtype.
      q, k: the zeroed, scaled inputs of ``score``.
      bias: additive, in the compute dtype, broadcastable to the scores, or None.
      v: the values, already scaled by ``1 / keep``.
      mask: the keep flags (broadcastable to the scores), as :func:`draw` keeps them.
      structure: ``(allowed, bad_rows, bad_cols)`` as :func:`attention_weights` takes
        them.
    """
    return _attend(score, product, jnp.dtype(dtype), q, k, bias, v, mask, structure)


def _dropped(weights: jax.Array, mask: Kept) -> tuple[jax.Array, jax.Array]:
    """The flags and the dropped weights. A dropped weight is the flags' own
    ``convert(False)``, not a constant a differentiated scan would hold whole."""
    flags = sharded_as(jnp.broadcast_to(mask.flags(), weights.shape), weights)
    return flags, lax.select(flags, weights, flags.astype(weights.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attend(score, product, dtype, q, k, bias, v, mask, structure):
    return _attend_fwd(score, product, dtype, q, k, bias, v, mask, structure)[0]


def _attend_fwd(score, product, dtype, q, k, bias, v, mask, structure):
    allowed, bad_rows, bad_cols = structure
    y, tainted = attention_weights(score, q, k, bias, allowed, bad_rows, bad_cols, dtype)
    out = product(_dropped(y, mask)[1], v)
    return poison(out, q, tainted), (q, k, bias, v, mask, y, out, tainted)


def _transposed(f: Any, x: jax.Array, ct: jax.Array) -> tuple[jax.Array, ...]:
    """The transpose of linear ``f`` at ``x``'s type, applied to ``ct`` (sharded as ``f``'s
    output, see :func:`_as_output`)."""
    return jax.linear_transpose(f, x)(_as_output(ct, jax.eval_shape(f, x)))


def _pulled(f: Any, primals: tuple[Any, ...], ct: jax.Array) -> tuple[Any, ...]:
    """``f``'s cotangents at ``primals`` for output cotangent ``ct`` (sharded as ``f``'s
    output, see :func:`_as_output`)."""
    out, pull = jax.vjp(f, *primals)
    return pull(_as_output(ct, out))


def _as_output(ct: jax.Array, out: Any) -> jax.Array:
    """``ct`` resharded as ``out``: under a mesh of explicit axes an einsum's rule can
    shard a product otherwise than the cotangent that arrives for it (on a one-device
    mesh it drops the size-1 axis's split), which JAX's transposition refuses; by the
    sharding the type names, so no ``jax.set_mesh`` is needed; elsewhere ``ct``
    itself."""
    want = out.sharding if isinstance(out, jax.ShapeDtypeStruct) else jax.typeof(out).sharding
    return ct if jax.typeof(ct).sharding.mesh.empty else resharded_to(ct, want)


def _attend_bwd(score, product, dtype, residuals, g):
    q, k, bias, v, mask, y, out, tainted = residuals
    g = poisoned_cotangent(tainted, g)
    acc = compute_dtype(y.dtype)
    # rowsum(g * o) over the depth, moved from [*b, q, heads] to [*b, heads, q, 1].
    c = jnp.sum(g.astype(acc) * out.astype(acc), axis=-1)
    c = jnp.moveaxis(c, -1, -2)[..., None]
    # Rebuilt here, after the row sum: computed from forward-pass values only, XLA
    # would compute them in the forward pass and keep them for this; before it, they
    # would share the pass's peak with the row sum's inputs.
    flags, dropped = _dropped(_after(y, c), mask)
    (dv,) = _transposed(functools.partial(product, dropped), v, g)
    # The weights' product after v's gradient: the dropped weights are gone by then.
    (dw,) = _transposed(lambda w: product(w, v), dropped, _after(g, dv))
    y = y.astype(acc)
    dw = dw.astype(acc)
    # A select of its own, not `dropped` again, which would keep it alive until here.
    t = lax.select(flags, dw * y, flags.astype(acc)) - y * c
    if bias is None:
        dq, dk = _pulled(lambda q, k: scores(score, q, k, None), (q, k), t)
        dbias = None
    else:
        dq, dk, dbias = _pulled(lambda q, k, b: scores(score, q, k, b), (q, k, bias), t)
    return poisoned_gradient(tainted, dq), dk, dbias, dv, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def _after(x: jax.Array, dependency: jax.Array) -> jax.Array:
    """``x`` unchanged (every bit), as a value XLA can compute only once ``dependency``
    exists: multiplied by 1 from a predicate that is always True but that XLA cannot
    fold (fewer than 64 of one element's 32 bits set).

    Under a mesh of explicit axes each device tests its own block's first element, a
    scalar, inside ``shard_map`` (no collective). Outside it, the predicate would keep
    ``dependency``'s sharded axes whole (``first_element``): on a v5e, ViT-B/16's step
    with every dropout site swapped took 1.086x its unsharded time over a one-device mesh
    of explicit axes with one predicate per batch row, 1.014x with a scalar (the
    per-row factor split the fusions that write ``v``'s gradient)."""
    axes = _explicit_axes(x, dependency)
    if not axes:
        return _after_here(x, dependency)
    spec = lambda a: jax.typeof(a).sharding.spec  # noqa: E731
    return jax.shard_map(
        _after_here,
        mesh=jax.typeof(x).sharding.mesh,
        in_specs=(spec(x), spec(dependency)),
        out_specs=spec(x),
        axis_names=axes,
    )(x, dependency)


def _explicit_axes(*arrays: jax.Array) -> frozenset[str]:
    """The explicit mesh axes that split any of ``arrays``."""
    axes: set[str] = set()
    for a in arrays:
        for part in jax.typeof(a).sharding.spec if explicitly_sharded_axes(a) else ():
            axes.update((part,) if isinstance(part, str) else part or ())
    return frozenset(axes)


def _after_here(x: jax.Array, dependency: jax.Array) -> jax.Array:
    """:func:`_after` where ``dependency``'s first element is a scalar: unsharded, or
    each device's block inside ``shard_map``."""
    first = lax.convert_element_type(first_element(dependency), jnp.float32)
    bits = lax.population_count(lax.bitcast_convert_type(first, jnp.uint32))
    one = lax.convert_element_type(lax.lt(bits, jnp.uint32(64)), x.dtype)
    return x * one
