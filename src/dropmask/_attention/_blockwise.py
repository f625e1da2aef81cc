"""Blockwise (FlashAttention-2) attention: online softmax over key blocks.

The forward pass visits ``[block_q, block_k]`` tiles of the scores, keeping per query
row a running maximum, a running sum of exponentials and an unnormalised output; it
saves only ``q``, ``k``, ``v``, the output and one log-sum-exp per row. The backward
pass (a ``jax.custom_vjp``) recomputes each tile's scores, probabilities and dropout
flags from those. No array of size ``[q_len, kv_len]`` per (batch, head) is built,
forward or backward, only tiles; the masks are read tile by tile: structure
(causal, sliding window) as loop bounds, key padding and segments as
``[batch, length]`` vectors, a dense ``mask`` or ``bias`` as slices.

Dropout. The ``"fast"`` generator is counter-based: a flag depends only on the key
and its position in the global mask. Each tile draws its flags through the one entry
point (``_random.draw``) with the dense path's global mask shape and the tile's
offset, so the tiles drop exactly the weights that the dense path drops, and the
backward pass draws the same flags again instead of storing them.

Layout. Inside, ``q`` is ``[B, Hk, G, Lq, D]`` (batch dims flattened into ``B``,
query heads split into key/value heads ``Hk`` and groups ``G``, as the dense path
does for grouped-query attention) and ``k``, ``v`` are ``[B, Hk, Lk, D]``; lengths
are padded to whole tiles, the padding being invalid keys and discarded queries.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .._dropout import flags_and_realised, scale_and_fill
from .._errors import call_name
from .._random import Block, draw, explicitly_sharded_axes, loop_zero, mask_shape, resharded_to

__all__ = [
    "Dropout",
    "Plan",
    "Side",
    "blockwise_attention",
    "default_block",
    "key_block_bounds",
    "make_side",
    "query_block_bounds",
]


def default_block(length: int) -> int:
    """The tile size along an axis of ``length``: 64 up to 512, 128 above.

    In a train step on CPU, 64-wide tiles were the faster at 256 and 512 tokens and
    128-wide ones at 1024 and beyond (fewer, larger matrix products per tile loop).
    """
    return 64 if length <= 512 else 128


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about one call: shapes, tiles, structure and dropout.

    Attributes:
      batch: the caller's batch dims (the dropout mask is drawn at their shape).
      kv_heads, groups: ``heads = kv_heads * groups``.
      q_len, kv_len: unpadded lengths; block_q, block_k: tile sizes.
      left, right: query ``i`` sees keys ``i - left <= j <= i + right``; None is
        unbounded (causal is ``right=0``).
      keep: the static keep probability, None for a run-time rate; unused when
        ``dropout`` is False.
      dropout: whether weights are dropped.
      broadcast_dropout: one mask for every batch and head.
      precision: for the einsums.
      accumulate: the dtype of scores, softmax sums and accumulators (float32 for
        16-bit inputs, as the dense path's softmax).
    """

    batch: tuple[int, ...]
    kv_heads: int
    groups: int
    q_len: int
    kv_len: int
    block_q: int
    block_k: int
    left: int | None
    right: int | None
    keep: float | None
    dropout: bool
    broadcast_dropout: bool
    precision: Any
    accumulate: Any = jnp.float32

    @property
    def n_q(self) -> int:
        return -(-self.q_len // self.block_q)

    @property
    def n_k(self) -> int:
        return -(-self.kv_len // self.block_k)

    @property
    def heads(self) -> int:
        return self.kv_heads * self.groups

    @property
    def run_time_rate(self) -> bool:
        """Whether weights are dropped at a rate known only at run time."""
        return self.dropout and self.keep is None


class Side(NamedTuple):
    """Masks and bias, in tile-sliceable form (padded to whole tiles); None if absent.

    ``kv_valid: bool[B|1, Lk]`` (key padding, always present), ``q_segments``,
    ``kv_segments: int[B, L]``, ``mask: bool[B|1, Hk|1, G|1, Lq|1, Lk|1]``,
    ``bias`` of the same form in float32, ``bad_q: bool[B, Hk, G, Lq]`` and
    ``bad_kv: bool[B, Hk, Lk]`` (non-finite inputs, which taint the rows that see them).
    """

    kv_valid: jax.Array
    q_segments: jax.Array | None
    kv_segments: jax.Array | None
    mask: jax.Array | None
    bias: jax.Array | None
    bad_q: jax.Array
    bad_kv: jax.Array


class Dropout(NamedTuple):
    """The run-time part of dropout: the key and, for a run-time rate, the keep probability."""

    key: Any
    keep: Any


def key_block_bounds(plan: Plan, i: Any) -> tuple[Any, Any]:
    """Key tiles ``[lo, hi)`` that query tile ``i`` may see under the window structure."""
    first, last = i * plan.block_q, (i + 1) * plan.block_q - 1
    lo = 0 if plan.left is None else jnp.maximum(first - plan.left, 0) // plan.block_k
    hi = (
        plan.n_k
        if plan.right is None
        else jnp.clip((last + plan.right) // plan.block_k + 1, 0, plan.n_k)
    )
    return lo, hi


def query_block_bounds(plan: Plan, j: Any) -> tuple[Any, Any]:
    """Query tiles ``[lo, hi)`` that may see key tile ``j``: the key bounds of the
    transposed plan (key ``j`` is seen by queries ``j - right <= i <= j + left``)."""
    transposed = dataclasses.replace(
        plan,
        q_len=plan.kv_len,
        kv_len=plan.q_len,
        block_q=plan.block_k,
        block_k=plan.block_q,
        left=plan.right,
        right=plan.left,
    )
    return key_block_bounds(transposed, j)


def _slice(x: jax.Array, axis: int, start: Any, size: int) -> jax.Array:
    """``x[start:start + size]`` along ``axis``, unless ``x`` broadcasts there (size 1)."""
    if x.shape[axis] == 1:
        return x
    return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _tile(x: jax.Array, plan: Plan, i: Any, j: Any) -> jax.Array:
    """The ``[..., block_q, block_k]`` tile ``(i, j)`` of a 5-D broadcastable mask or bias."""
    x = _slice(x, 3, i * plan.block_q, plan.block_q)
    return _slice(x, 4, j * plan.block_k, plan.block_k)


def _allowed(plan: Plan, side: Side, i: Any, j: Any) -> jax.Array:
    """Where tile ``(i, j)`` may attend: ``bool``, broadcastable to ``[B, Hk, G, bq, bk]``."""
    rows = i * plan.block_q + lax.broadcasted_iota(jnp.int32, (1, 1, 1, plan.block_q, 1), 3)
    cols = j * plan.block_k + lax.broadcasted_iota(jnp.int32, (1, 1, 1, 1, plan.block_k), 4)
    ok = _slice(side.kv_valid, 1, j * plan.block_k, plan.block_k)[:, None, None, None, :]
    if plan.left is not None:
        ok = ok & (cols >= rows - plan.left)
    if plan.right is not None:
        ok = ok & (cols <= rows + plan.right)
    if side.q_segments is not None and side.kv_segments is not None:
        qs = _slice(side.q_segments, 1, i * plan.block_q, plan.block_q)
        ks = _slice(side.kv_segments, 1, j * plan.block_k, plan.block_k)
        same = (qs[:, :, None] == ks[:, None, :]) & (qs != 0)[:, :, None]
        ok = ok & same[:, None, None]
    if side.mask is not None:
        ok = ok & _tile(side.mask, plan, i, j)
    if side.bias is not None:
        ok = ok & (_tile(side.bias, plan, i, j) != -jnp.inf)
    return ok


def _scores(plan: Plan, q_tile: jax.Array, k_tile: jax.Array, side: Side, i: Any, j: Any):
    """float32 scores ``[B, Hk, G, bq, bk]`` of a tile, bias included."""
    s = jnp.einsum(
        "bhgqd,bhkd->bhgqk",
        q_tile,
        k_tile,
        precision=plan.precision,
        preferred_element_type=plan.accumulate,
    )
    if side.bias is not None:
        s = s + _tile(side.bias, plan, i, j)
    return s


def _kept_scale(plan: Plan, dropout: Dropout, i: Any, j: Any) -> Any:
    """Tile ``(i, j)``'s factor per weight: ``1/realised`` where kept, 0 where dropped.

    Drawn with the dense path's global mask shape and the tile's offset, so the flags
    are that mask's; ``1/realised`` is what dense dropout multiplies by.
    """
    if not plan.dropout:
        return None
    heads = plan.heads
    nb = len(plan.batch)
    axes = tuple(range(nb + 1)) if plan.broadcast_dropout else ()
    local = mask_shape((*plan.batch, heads, plan.block_q, plan.block_k), axes)
    whole = mask_shape((*plan.batch, heads, plan.q_len, plan.kv_len), axes)
    offset = (0,) * (nb + 1) + (i * plan.block_q, j * plan.block_k)
    p = plan.keep if plan.keep is not None else dropout.keep
    flags, realised = draw(
        dropout.key,
        local,
        p,
        "fast",
        flags_and_realised,
        block=Block(whole, offset),
        residual="none",
        caller=call_name(),
    )
    lead = (1, 1, 1) if plan.broadcast_dropout else (-1, plan.kv_heads, plan.groups)
    flags = flags.reshape(*lead, plan.block_q, plan.block_k)
    scale, fill = scale_and_fill(realised, plan.accumulate)
    return jnp.where(flags, scale, fill)


def _varying_axes(x: Any) -> set[str]:
    axis_type = getattr(jax.typeof(x), "manual_axis_type", None)
    return set() if axis_type is None else set(axis_type.varying)


def _varying_like(refs: Any) -> Any:
    """A function making an array vary over the mesh axes any of ``refs`` varies over.

    Inside ``shard_map`` a loop carry must keep its type: one that starts as a
    constant but absorbs sharded inputs has to be declared varying from the start.
    """
    axes: set[str] = set()
    for ref in jax.tree.leaves(refs):
        axes |= _varying_axes(ref)

    def vary(x: jax.Array) -> jax.Array:
        missing = tuple(sorted(axes - _varying_axes(x)))
        return lax.pcast(x, missing, to="varying") if missing else x

    return vary


def _ranked(value: jax.Array, ndim: int) -> jax.Array:
    """``value`` (a scalar, or under a mesh of explicit axes a tile's first elements from
    ``loop_zero``: its sharded axes whole, the rest 1) with at most ``ndim`` axes, so
    that it broadcasts against an array of that rank axis by axis."""
    if value.ndim <= ndim:
        return value
    return lax.squeeze(value, tuple(range(ndim, value.ndim)))  # a reshape drops size-1 splits


def _filled(value: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``value`` (see :func:`_ranked`) broadcast to ``shape``."""
    return jnp.broadcast_to(_ranked(value, len(shape)), shape)


def _forward(plan: Plan, q, k, v, side: Side, dropout: Dropout):
    """Output ``[B, Hk, G, Lq_pad, Dv]`` (float32, tainted rows 0), log-sum-exp and taint."""
    b, hk, g = q.shape[0], plan.kv_heads, plan.groups
    bq, bk, dv = plan.block_q, plan.block_k, v.shape[-1]
    vary = _varying_like((q, k, v, side, dropout))

    def query_tile(_, i):
        q_tile = lax.dynamic_slice_in_dim(q, i * bq, bq, axis=3)
        # A non-finite query taints its row only if the row may attend to some key:
        # a row with no valid key is 0 whatever its q, as on the dense path.
        bad_q = _slice(side.bad_q, 3, i * bq, bq)[..., None]

        def key_tile(j, carry):
            ok = _allowed(plan, side, i, j)

            def visit(carry):
                m, total, acc, taint = carry
                k_tile = lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2)
                v_tile = lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)
                s = _scores(plan, q_tile, k_tile, side, i, j)
                bad_kv = _slice(side.bad_kv, 2, j * bk, bk)[:, :, None, None, :]
                # Any non-finite allowed score taints: an overflow may come out of
                # the product as NaN, +inf or -inf, depending on its summation order.
                nonfinite = ~jnp.isfinite(s) | bad_kv
                taint = taint | jnp.any(ok & (nonfinite | bad_q), axis=-1)
                live = ok & ~nonfinite
                s = jnp.where(live, s, -jnp.inf)
                m_new = jnp.maximum(m, jnp.max(s, axis=-1))
                shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
                alpha = jnp.exp(jnp.where(m == -jnp.inf, -jnp.inf, m - shift))
                p = jnp.exp(s - shift[..., None])
                total = alpha * total + jnp.sum(p, axis=-1)
                scale = _kept_scale(plan, dropout, i, j)
                if scale is not None:
                    p = p * scale
                pv = jnp.einsum(
                    "bhgqk,bhkd->bhgqd",
                    p.astype(v.dtype),
                    v_tile,
                    precision=plan.precision,
                    preferred_element_type=plan.accumulate,
                )
                return m_new, total, alpha[..., None] * acc + pv, taint

            return lax.cond(jnp.any(ok), visit, lambda c: c, carry)

        # From a 0 of the queries, not constants: a differentiated scan over layers
        # would compute constants before its loop and hold them whole.
        zero = loop_zero(q_tile).astype(plan.accumulate)
        init = (
            vary(_filled(zero - jnp.inf, (b, hk, g, bq))),
            vary(_filled(zero, (b, hk, g, bq))),
            vary(_filled(zero, (b, hk, g, bq, dv))),
            vary(_filled(zero != 0, (b, hk, g, bq))),
        )
        lo, hi = key_block_bounds(plan, i)
        m, total, acc, taint = lax.fori_loop(lo, hi, key_tile, init)
        empty = (total == 0) | taint
        out = jnp.where(empty[..., None], zero, acc / jnp.where(empty, 1.0, total)[..., None])
        lse = jnp.where(empty, _ranked(zero, 4), m + jnp.log(jnp.where(empty, 1.0, total)))
        return None, (out, lse, taint)

    _, (out, lse, taint) = lax.scan(query_tile, None, jnp.arange(plan.n_q))
    # [n_q, B, Hk, G, bq, ...] -> [B, Hk, G, n_q * bq, ...]
    out = jnp.moveaxis(out, 0, 3).reshape(b, hk, g, plan.n_q * bq, dv)
    lse = jnp.moveaxis(lse, 0, 3).reshape(b, hk, g, plan.n_q * bq)
    taint = jnp.moveaxis(taint, 0, 3).reshape(b, hk, g, plan.n_q * bq)
    return out, lse, taint


def _backward(plan: Plan, q, k, v, side: Side, dropout: Dropout, out, lse, taint, d_out):
    """Gradients of ``q``, ``k``, ``v`` (float32) and of the bias, if any."""
    bq, bk = plan.block_q, plan.block_k
    d_out = jnp.where(taint[..., None], 0.0, d_out.astype(plan.accumulate))
    delta = jnp.sum(d_out * out, axis=-1)  # rowsum(dO * O) = rowsum(P * dP)
    d_out_in = d_out.astype(v.dtype)
    vary = _varying_like((q, k, v, side, dropout, d_out))

    def key_tile(d_q_and_bias, j):
        k_tile = lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2)
        v_tile = lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)

        def query_tile(i, carry):
            ok = _allowed(plan, side, i, j)

            def visit(carry):
                d_k, d_v, (d_q, d_bias) = carry
                q_tile = lax.dynamic_slice_in_dim(q, i * bq, bq, axis=3)
                do_tile = lax.dynamic_slice_in_dim(d_out_in, i * bq, bq, axis=3)
                lse_tile = lax.dynamic_slice_in_dim(lse, i * bq, bq, axis=3)
                delta_tile = lax.dynamic_slice_in_dim(delta, i * bq, bq, axis=3)
                clean = ~lax.dynamic_slice_in_dim(taint, i * bq, bq, axis=3)[..., None]
                s = _scores(plan, q_tile, k_tile, side, i, j)
                live = ok & clean & jnp.isfinite(s)
                p = jnp.where(live, jnp.exp(jnp.where(live, s, 0.0) - lse_tile[..., None]), 0.0)
                scale = _kept_scale(plan, dropout, i, j)
                kept = p if scale is None else p * scale
                ein = {"precision": plan.precision, "preferred_element_type": plan.accumulate}
                d_v = d_v + jnp.einsum("bhgqk,bhgqd->bhkd", kept.astype(v.dtype), do_tile, **ein)
                d_p = jnp.einsum("bhgqd,bhkd->bhgqk", do_tile, v_tile, **ein)
                if scale is not None:
                    d_p = d_p * scale
                d_s = p * (d_p - delta_tile[..., None])
                d_s_in = d_s.astype(q.dtype)
                d_k = d_k + jnp.einsum("bhgqk,bhgqd->bhkd", d_s_in, q_tile, **ein)
                d_q_tile = jnp.einsum("bhgqk,bhkd->bhgqd", d_s_in, k_tile, **ein)
                old = lax.dynamic_slice_in_dim(d_q, i * bq, bq, axis=3)
                d_q = lax.dynamic_update_slice_in_dim(d_q, old + d_q_tile, i * bq, axis=3)
                if d_bias is not None:
                    d_bias = _add_tile(d_bias, d_s, plan, i, j)
                return d_k, d_v, (d_q, d_bias)

            return lax.cond(jnp.any(ok), visit, lambda c: c, carry)

        zero = loop_zero(k_tile).astype(plan.accumulate)
        init = (
            vary(_filled(zero, k_tile.shape)),
            vary(_filled(zero, v_tile.shape)),
            d_q_and_bias,
        )
        lo, hi = query_block_bounds(plan, j)
        d_k, d_v, d_q_and_bias = lax.fori_loop(lo, hi, query_tile, init)
        return d_q_and_bias, (d_k, d_v)

    zero = loop_zero(d_out)
    d_bias0 = None if side.bias is None else vary(_filled(zero, side.bias.shape))
    # From q's 0, whose batch axis is split as the updates' (d_out may arrive unsplit).
    d_q0 = vary(_filled(loop_zero(q).astype(zero.dtype), q.shape))
    (d_q, d_bias), (d_k, d_v) = lax.scan(key_tile, (d_q0, d_bias0), jnp.arange(plan.n_k))
    d_k = jnp.moveaxis(d_k, 0, 2).reshape(k.shape)
    d_v = jnp.moveaxis(d_v, 0, 2).reshape(v.shape)
    return d_q, d_k, d_v, d_bias


def _add_tile(acc: jax.Array, d_s: jax.Array, plan: Plan, i: Any, j: Any) -> jax.Array:
    """Adds a tile's score gradient into a broadcastable bias gradient, summing where it
    broadcasts."""
    summed = tuple(a for a in range(5) if acc.shape[a] == 1 and d_s.shape[a] != 1)
    d_s = jnp.sum(d_s, axis=summed, keepdims=True)
    start = [0, 0, 0, 0, 0]
    if acc.shape[3] != 1:
        start[3] = i * plan.block_q
    if acc.shape[4] != 1:
        start[4] = j * plan.block_k
    old = lax.dynamic_slice(acc, start, d_s.shape)
    return lax.dynamic_update_slice(acc, old + d_s, start)


def _attend_impl(plan: Plan, q, k, v, side: Side, dropout: Dropout):
    out, _, taint = _forward(plan, q, k, v, side, dropout)
    return out.astype(q.dtype), taint


def _attend_fwd(plan: Plan, q, k, v, side: Side, dropout: Dropout):
    out, lse, taint = _forward(plan, q, k, v, side, dropout)
    return (out.astype(q.dtype), taint), (q, k, v, side, dropout, out.astype(q.dtype), lse, taint)


def _attend_bwd(plan: Plan, residuals, cotangents):
    q, k, v, side, dropout, out, lse, taint = residuals
    d_out, _ = cotangents
    d_q, d_k, d_v, d_bias = _backward(
        plan, q, k, v, side, dropout, out.astype(plan.accumulate), lse, taint, d_out
    )
    d_side = jax.tree.map(lambda _: None, side)._replace(bias=d_bias)
    d_dropout = Dropout(None, None if dropout.keep is None else jnp.zeros_like(dropout.keep))
    d_q, d_k, d_v = (_typed_as(d, x) for d, x in ((d_q, q), (d_k, k), (d_v, v)))
    return d_q, d_k, d_v, d_side, d_dropout


def _typed_as(d: jax.Array, x: jax.Array) -> jax.Array:
    """A cotangent ``d`` as ``x``'s type: its dtype, and under a mesh of explicit axes its
    sharding (a reshape drops the split of a size-1 axis)."""
    d = d.astype(x.dtype)
    return resharded_to(d, jax.typeof(x).sharding) if explicitly_sharded_axes(x) else d


_attend = jax.custom_vjp(_attend_impl, nondiff_argnums=(0,))
_attend.defvjp(_attend_fwd, _attend_bwd)


def blockwise_attention(
    plan: Plan, q: jax.Array, k: jax.Array, v: jax.Array, side: Side, dropout: Dropout
) -> tuple[jax.Array, jax.Array]:
    """Attention of ``q: [*batch, Lq, H, D]`` over ``k``, ``v``: ``[*batch, Lk, Hk, D]``.

    ``q`` is already scaled by ``1/sqrt(D)`` and every input is finite (non-finite
    entries were zeroed and recorded in ``side.bad_q`` / ``side.bad_kv``). Returns
    the output ``[*batch, Lq, H, Dv]`` with tainted rows 0, and the taint
    ``bool[*batch, H, Lq, 1]`` (the dense path's layout, for ``_nonfinite.poison``).
    """
    b = math.prod(plan.batch)
    hk, g = plan.kv_heads, plan.groups
    pad_q = plan.n_q * plan.block_q - plan.q_len
    pad_k = plan.n_k * plan.block_k - plan.kv_len
    q5 = q.reshape(b, plan.q_len, hk, g, q.shape[-1]).transpose(0, 2, 3, 1, 4)
    k4 = k.reshape(b, plan.kv_len, hk, k.shape[-1]).transpose(0, 2, 1, 3)
    v4 = v.reshape(b, plan.kv_len, hk, v.shape[-1]).transpose(0, 2, 1, 3)
    q5 = _split_as_keys(q5, k4)
    q5 = jnp.pad(q5, [(0, 0)] * 3 + [(0, pad_q), (0, 0)])
    k4 = jnp.pad(k4, [(0, 0)] * 2 + [(0, pad_k), (0, 0)])
    v4 = jnp.pad(v4, [(0, 0)] * 2 + [(0, pad_k), (0, 0)])
    out, taint = _attend(plan, q5, k4, v4, side, dropout)
    out = out[:, :, :, : plan.q_len].transpose(0, 3, 1, 2, 4)
    out = out.reshape(*plan.batch, plan.q_len, plan.heads, v.shape[-1])
    # Heads merged before the trailing axis is added: JAX infers the merged heads' split
    # (key-value heads split over a mesh axis) for a reshape that merges alone.
    taint = taint[..., : plan.q_len].reshape(*plan.batch, plan.heads, plan.q_len)[..., None]
    return out, taint


def _split_as_keys(q5: jax.Array, k4: jax.Array) -> jax.Array:
    """``q5: [B, Hk, G, Lq, D]`` with its batch and head axes split as ``k4``'s (``[B, Hk,
    Lk, D]``), under a mesh of explicit axes: splitting the heads into groups drops a
    split of a size-1 axis (one batch row a device), which the loops' carries, built
    from both, must agree on."""
    q_spec, k_spec = jax.typeof(q5).sharding.spec, jax.typeof(k4).sharding.spec
    if not explicitly_sharded_axes(k4) and not explicitly_sharded_axes(q5):
        return q5
    q_entries = tuple(q_spec) + (None,) * (5 - len(tuple(q_spec)))
    k_entries = tuple(k_spec) + (None,) * (4 - len(tuple(k_spec)))
    want = (k_entries[0], k_entries[1], *q_entries[2:])
    if want == q_entries:
        return q5
    return jax.sharding.reshard(q5, jax.typeof(q5).sharding.update(spec=P(*want)))


def _pad(x: jax.Array, axis: int, size: int, value: Any) -> jax.Array:
    """``x`` padded with ``value`` to ``size`` along ``axis``, unless it broadcasts there."""
    if x.shape[axis] == 1 or x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _five_d(x: jax.Array, plan: Plan, fill: Any) -> jax.Array:
    """A ``[*batch, H|1, Lq|1, Lk|1]`` array as ``[B|1, Hk|1, G|1, Lq_pad|1, Lk_pad|1]``.

    Batch dims stay 1 when all of them broadcast, so a mask shared by the batch is
    not copied per row.
    """
    nb = len(plan.batch)
    if any(d != 1 for d in x.shape[:nb]):
        x = jnp.broadcast_to(x, (*plan.batch, *x.shape[nb:]))
        b = math.prod(plan.batch)
    else:
        b = 1
    heads = (plan.kv_heads, plan.groups) if x.shape[nb] != 1 else (1, 1)
    x = x.reshape(b, *heads, *x.shape[nb + 1 :])
    x = _pad(x, 3, plan.n_q * plan.block_q, fill)
    return _pad(x, 4, plan.n_k * plan.block_k, fill)


def make_side(
    plan: Plan,
    *,
    kv_valid: jax.Array | None,
    q_segments: jax.Array | None,
    kv_segments: jax.Array | None,
    mask: jax.Array | None,
    bias: jax.Array | None,
    bad_q: jax.Array,
    bad_kv: jax.Array,
) -> Side:
    """Tile-sliceable masks from the caller's (validated) arrays.

    Args:
      plan: the call's plan.
      kv_valid: ``bool`` broadcastable to ``[*batch, Lk]``, or None (every key valid).
      q_segments, kv_segments: ``int`` broadcastable to ``[*batch, L]``, or None.
      mask, bias: rank ``len(batch) + 3``, each axis 1 or the scores' size.
      bad_q: ``bool[*batch, Lq, H]``; bad_kv: ``bool[*batch, Lk, Hk]``.
    """
    b, lq, lk = math.prod(plan.batch), plan.n_q * plan.block_q, plan.n_k * plan.block_k
    if kv_valid is None:
        valid = jnp.ones((1, plan.kv_len), bool)
    elif all(d == 1 for d in kv_valid.shape[:-1]):
        valid = kv_valid.reshape(1, plan.kv_len)
    else:
        valid = jnp.broadcast_to(kv_valid, (*plan.batch, plan.kv_len)).reshape(b, plan.kv_len)
    valid = jnp.pad(valid, [(0, 0), (0, lk - plan.kv_len)])

    def segments(ids: jax.Array | None, length: int, padded: int) -> jax.Array | None:
        if ids is None:
            return None
        ids = jnp.broadcast_to(ids, (*plan.batch, length)).reshape(b, length)
        return jnp.pad(ids, [(0, 0), (0, padded - length)])

    bad_q5 = bad_q.reshape(b, plan.q_len, plan.kv_heads, plan.groups).transpose(0, 2, 3, 1)
    bad_kv4 = bad_kv.reshape(b, plan.kv_len, plan.kv_heads).transpose(0, 2, 1)
    return Side(
        kv_valid=valid,
        q_segments=segments(q_segments, plan.q_len, lq),
        kv_segments=segments(kv_segments, plan.kv_len, lk),
        mask=None if mask is None else _five_d(mask, plan, False),
        bias=None if bias is None else _five_d(bias.astype(plan.accumulate), plan, 0.0),
        bad_q=jnp.pad(bad_q5, [(0, 0)] * 3 + [(0, lq - plan.q_len)]),
        bad_kv=jnp.pad(bad_kv4, [(0, 0)] * 2 + [(0, lk - plan.kv_len)]),
    )
