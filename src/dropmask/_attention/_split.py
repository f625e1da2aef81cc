"""How a call is split over a mesh of explicit axes: by ``q``'s batch axes and heads.

Under such a mesh the types of ``q``, ``k`` and ``v`` carry their sharding when traced.
Every path computes a call on whole rows of queries and keys: batch axes (data
parallelism) and heads (tensor parallelism; the key-value heads split alike, so each
device keeps whole groups of grouped-query heads) split with no collective, and
:func:`split_of` says how. A split the paths cannot take (a query, key or depth axis,
``k`` or ``v`` split unlike ``q``, an uneven split) needs communication whatever
computes it: the inputs are resharded to ``q``'s split of batch and heads first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._random import explicit_split, local_shape, resharded_to, spec_entries
from ._checked import Checked

__all__ = ["Split", "entries", "names", "on_split", "parts", "resharded", "split_of"]


@dataclasses.dataclass(frozen=True)
class Split:
    """How a call is split over a mesh of explicit axes: the mesh, the entry of each
    batch axis and the heads' entry (``None``, a mesh axis name or a tuple of names)."""

    mesh: Any
    batch: tuple[Any, ...]
    heads: Any

    def spec(self) -> P:
        """``q``, ``k``, ``v`` and the output: ``[*batch, L, H, D]``."""
        return P(*self.batch, None, self.heads, None)

    def rows(self, *tail: Any) -> P:
        """An array of the batch axes, then ``tail``."""
        return P(*self.batch, *tail)

    @property
    def free(self) -> tuple[str, ...]:
        """The mesh axes a ``shard_map`` of the call's own maps over: the explicit ones
        (inside a ``shard_map`` over some of the mesh's axes, those are manual already)."""
        explicit = jax.sharding.AxisType.Explicit
        pairs = zip(self.mesh.axis_names, self.mesh.axis_types, strict=True)
        return tuple(name for name, kind in pairs if kind == explicit)

    def every_device(self) -> P:
        """Per-device pieces stacked along their first axis (residuals between the
        forward and backward ``shard_map``)."""
        return P(self.free)

    def offsets(self, local_batch: tuple[int, ...], local_heads: int) -> jax.Array:
        """``int32[len(batch) + 1]``: this device's first batch index on each batch axis
        and its first head (inside ``shard_map``)."""
        out = []
        pairs = (*zip(local_batch, self.batch, strict=True), (local_heads, self.heads))
        for size, group in pairs:
            out.append(0 if group is None else lax.axis_index(group) * size)
        return jnp.stack([jnp.asarray(o, jnp.int32) for o in out])


def entries(x: jax.Array) -> tuple[Any, ...]:
    """``x``'s partition entries, one per axis."""
    return spec_entries(jax.typeof(x).sharding.spec, x.ndim)


def split_of(q: jax.Array, k: jax.Array, v: jax.Array) -> Split | None:
    """How a call is split: None where ``q`` is not traced under a mesh of explicit
    axes (one device, or inside ``shard_map``: a path takes the call as it is); else
    ``q``'s split of its batch axes and heads, or none where that split does not
    divide ``q``, ``k`` and ``v`` evenly."""
    found = explicit_split(q)
    if found is None:
        return None
    mesh, _ = found
    q_spec = entries(q)
    split = Split(mesh, q_spec[:-3], q_spec[-2])
    if any(local_shape(x.shape, mesh, split.spec()) is None for x in (q, k, v)):
        split = Split(mesh, (None,) * (q.ndim - 3), None)
    return split


def on_split(c: Checked) -> tuple[Checked, Callable[[jax.Array], jax.Array]]:
    """A checked call with ``q``, ``k`` and ``v`` split as :func:`split_of` says, and
    its masks, bias, key lengths and segment ids split alike (each as it is where it
    already is, unsplit, or off a mesh of explicit axes); and a function that gives
    the output ``q``'s sharding back (where it divides the output evenly).

    A query or key axis split over devices is gathered: every path computes whole
    rows of scores (sequence parallelism, which splits them, is not implemented), as
    JAX's and Flax's attention need too, whose ``dot_general`` refuses such a split. A
    mask or bias split otherwise than the scores, which JAX's elementwise ops refuse,
    is resharded to the scores' split.
    """
    split = split_of(c.q, c.k, c.v)
    if split is None:
        return c, _same
    q_spec = P(*entries(c.q))
    q, k, v = (resharded(x, split.mesh, split.spec()) for x in (c.q, c.k, c.v))
    scores = (split.heads, None, None)  # [*batch, heads, q_len, kv_len]
    c = dataclasses.replace(
        c,
        q=q,
        k=k,
        v=v,
        mask=_as_rows(c.mask, split, scores),
        bias=_as_rows(c.bias, split, scores),
        kv_valid=_as_rows(c.kv_valid, split, (None,)),
        q_seg=_as_rows(c.q_seg, split, (None,)),
        kv_seg=_as_rows(c.kv_seg, split, (None,)),
    )

    def restore(out: jax.Array) -> jax.Array:
        if local_shape(out.shape, split.mesh, q_spec) is None:
            return out
        return resharded(out, split.mesh, q_spec)

    return c, restore


def _same(x: jax.Array) -> jax.Array:
    return x


def _as_rows(x: Any, split: Split, tail: tuple[Any, ...]) -> Any:
    """``x``, broadcastable to ``[*batch, *tail]``, split as ``split`` splits the batch
    and ``tail`` the rest (an axis of size 1 whole) where a mesh of explicit axes
    splits it; each as it is elsewhere (unsplit, it broadcasts to any split)."""
    if not isinstance(x, jax.Array) or not any(e is not None for e in _spec_of(x)):
        return x
    want = (*split.batch, *tail)[-x.ndim :] if x.ndim else ()
    want = (None,) * (x.ndim - len(want)) + tuple(want)
    spec = P(*(None if n == 1 else e for n, e in zip(x.shape, want, strict=True)))
    if local_shape(x.shape, split.mesh, spec) is None:
        spec = P()
    return resharded(x, split.mesh, spec)


def _spec_of(x: jax.Array) -> tuple[Any, ...]:
    """``x``'s partition entries under a mesh of explicit axes; none elsewhere."""
    return () if explicit_split(x) is None else entries(x)


def resharded(x: jax.Array, mesh: Any, spec: Any) -> jax.Array:
    """``x`` sharded as ``spec`` over ``mesh`` (no operation where it already is)."""
    return resharded_to(x, NamedSharding(mesh, spec))


def names(entry: Any) -> tuple[str, ...]:
    """The mesh axis names of one partition entry."""
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def parts(mesh: Any, entry: Any) -> int:
    """How many blocks one partition entry splits an axis into."""
    return math.prod(mesh.shape[n] for n in names(entry))
