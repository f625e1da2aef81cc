"""The dropout contestants the benchmarks compare, and what is measured of each.

The ways of doing dropout (:func:`contestants`), their loops forward and
forward+backward, an output check, and the residual bytes a contestant keeps for the
backward pass. They are timed with ``_harness.py``.

Benchmarks reach dropmask's internals only through :mod:`dropmask.testing`.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dropmask
from benchmarks._harness import Looped, looped
from dropmask import testing

RATE = 0.1
KEEP = 1.0 - RATE
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
MODES = ("fwd", "fwd+bwd")
LIMIT = "x * c (memory-bound limit)"
FLAX = "flax.linen.Dropout (threefry)"


@dataclass(frozen=True)
class Contestant:
    """One way of doing dropout: ``apply(x, aux) -> y`` with ``aux = make_aux(dtype)``."""

    name: str
    apply: Callable[[jax.Array, Any], jax.Array]
    make_aux: Callable[[Any], Any]
    is_dropout: bool = True


def default_impl() -> str:
    """The ``impl`` that ``dropmask.dropout`` uses when none is given."""
    return str(inspect.signature(dropmask.dropout).parameters["impl"].default)


def dropmask_name() -> str:
    """The name of the contestant for ``dropmask.dropout`` with its defaults."""
    return f"dropmask (default impl={default_impl()!r})"


def residual_choices() -> tuple[str, ...]:
    """The values of ``dropmask.dropout``'s ``residual`` argument other than its default,
    from its ``Literal`` annotation (``("none",)`` if it is not one); none where the
    argument does not exist."""
    param = inspect.signature(dropmask.dropout).parameters.get("residual")
    if param is None:
        return ()
    try:
        hint = typing.get_type_hints(dropmask.dropout).get("residual")
    except Exception:  # noqa: BLE001 - an unresolvable annotation: use the documented choice
        hint = None
    choices = [a for a in typing.get_args(hint) if isinstance(a, str)] or ["none"]
    return tuple(c for c in choices if c != param.default)


def threefry_key(dtype: Any) -> jax.Array:
    del dtype
    return jax.random.key(0)


def _rbg_key(dtype: Any) -> jax.Array:
    del dtype
    return jax.random.key(0, impl="rbg")


def _limit() -> Contestant:
    return Contestant(
        LIMIT, lambda x, c: x * c, lambda dtype: jnp.asarray(1.0 / KEEP, dtype), is_dropout=False
    )


def contestants(full: bool = True) -> tuple[list[Contestant], list[str]]:
    """The contestants that can be imported here, and notes on any that cannot.

    ``full=False``: dropmask's default, Flax's and the limit only (what the targets use).
    """
    import flax.linen as nn

    flax_dropout = nn.Dropout(rate=RATE, deterministic=False)

    def flax_apply(x: jax.Array, key: jax.Array) -> jax.Array:
        return flax_dropout.apply({}, x, rngs={"dropout": key})

    ours = Contestant(dropmask_name(), lambda x, key: dropmask.dropout(x, RATE, key), threefry_key)
    flax = Contestant(FLAX, flax_apply, threefry_key)
    if not full:
        return [ours, flax, _limit()], []
    out = [ours]
    for choice in residual_choices():
        kwargs = {"residual": choice}
        out.append(
            Contestant(
                f"dropmask residual={choice!r}",
                lambda x, key, kw=kwargs: dropmask.dropout(x, RATE, key, **kw),
                threefry_key,
            )
        )
    out += [
        Contestant(
            "dropmask impl='flax'",
            lambda x, key: dropmask.dropout(x, RATE, key, impl="flax"),
            threefry_key,
        ),
        flax,
        Contestant("flax.linen.Dropout (rbg)", flax_apply, _rbg_key),
    ]
    notes = []
    try:
        import equinox as eqx

        eqx_dropout = eqx.nn.Dropout(p=RATE)
        out.append(
            Contestant(
                "eqx.nn.Dropout",
                lambda x, key: eqx_dropout(x, key=key, inference=False),
                threefry_key,
            )
        )
    except ImportError as err:
        notes.append(f"equinox not installed ({err}); skipped")
    try:
        import haiku as hk

        out.append(Contestant("hk.dropout", lambda x, key: hk.dropout(key, RATE, x), threefry_key))
    except ImportError as err:
        notes.append(f"dm-haiku not installed ({err}); skipped")
    out.append(_limit())
    return out, notes


def inputs(shape: tuple[int, ...], dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``x`` and the cotangent ``g``, standard normal."""
    kx, kg = jax.random.split(jax.random.key(1234))
    return jax.random.normal(kx, shape, dtype), jax.random.normal(kg, shape, dtype)


def vjp_apart(c: Contestant, x: jax.Array, aux: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(y, dx)`` of one ``jax.vjp``, the backward kept apart from the forward.

    In a network other layers run between a dropout's forward and backward pass, so
    whatever the backward needs (a saved mask, or the key to regenerate it) is written
    and read back. With nothing in between, XLA would fuse the two passes into one
    kernel that draws the mask once; an optimization barrier over the output, the vjp
    residuals and the cotangent stops that, as the layers in between would.
    """
    y, vjp_fn = jax.vjp(lambda x: c.apply(x, aux), x)
    y, vjp_fn, g = lax.optimization_barrier((y, vjp_fn, g))
    return y, vjp_fn(g)[0]


def fwd_fn(c: Contestant) -> Callable[[jax.Array, Any], jax.Array]:
    """One jitted forward call ``(x, aux) -> y``."""
    return jax.jit(c.apply)


def fwd_bwd_fn(c: Contestant) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """One jitted forward+backward call ``(x, aux, g) -> (y, dx)`` (see :func:`vjp_apart`)."""
    return jax.jit(lambda x, aux, g: vjp_apart(c, x, aux, g))


def _step_aux(c: Contestant, aux: Any, i: jax.Array) -> Any:
    """A fresh key per loop iteration (so no mask is loop-invariant); the limit's scale."""
    return jax.random.fold_in(aux, i) if c.is_dropout else aux


def looped_fwd(c: Contestant, passes: int) -> Callable[[jax.Array, Any], jax.Array]:
    """``passes`` forward passes inside one jit, each feeding the next: no output buffer
    is allocated per pass, so the time is the kernel's, not the allocator's."""

    def run(x: jax.Array, aux: Any) -> jax.Array:
        return lax.fori_loop(0, passes, lambda i, x: c.apply(x, _step_aux(c, aux, i)), x)

    return jax.jit(run)


def looped_fwd_bwd(c: Contestant, passes: int) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """``passes`` forward+backward passes (:func:`vjp_apart`) inside one jit,
    ``(x, g) -> (y, dx)`` feeding the next."""

    def body(i: jax.Array, carry: tuple[jax.Array, jax.Array], aux: Any) -> Any:
        x, g = carry
        return vjp_apart(c, x, _step_aux(c, aux, i), g)

    def run(x: jax.Array, aux: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        return lax.fori_loop(0, passes, lambda i, carry: body(i, carry, aux), (x, g))

    return jax.jit(run)


def loop(c: Contestant, shape: tuple[int, ...], dtype_name: str, mode: str) -> Looped:
    """``c``'s loops for one case, with the pass count probed (see :func:`looped`)."""
    x, g = inputs(shape, DTYPES[dtype_name])
    aux = c.make_aux(x.dtype)
    if mode == "fwd":
        return looped(lambda passes: looped_fwd(c, passes), (x, aux))
    return looped(lambda passes: looped_fwd_bwd(c, passes), (x, aux, g))


def looped_mask_words(shape: tuple[int, ...], passes: int) -> Callable[[jax.Array, Any], Any]:
    """``passes`` draws of the packed keep-words that dropmask's packed paths compute
    before applying them (the generator alone), a fresh key per pass; ``x`` is unused."""
    words_shape = jax.eval_shape(lambda: testing.packed_mask_words(jax.random.key(0), shape, RATE))

    def run(x: jax.Array, key: Any) -> jax.Array:
        def body(i: jax.Array, acc: jax.Array) -> jax.Array:
            return acc ^ testing.packed_mask_words(jax.random.fold_in(key, i), shape, RATE)

        return lax.fori_loop(0, passes, body, jnp.zeros(words_shape.shape, jnp.uint32))

    return jax.jit(run)


def check_output(
    x: jax.Array, y: jax.Array, g: jax.Array | None, dx: jax.Array | None
) -> dict[str, Any]:
    """Whether ``y`` (and ``dx``) look like dropout at RATE of ``x``: returns stats and ok.

    The drop fraction within 6 sigma of RATE, kept values scaled by about ``1/KEEP``,
    and the backward zero exactly where the forward dropped.
    """
    xn = np.asarray(x, np.float32)
    yn = np.asarray(y, np.float32)
    dropped = yn == 0
    n = dropped.size
    drop_frac = float(dropped.mean())
    sigma = math.sqrt(RATE * KEEP / n)
    kept = ~dropped & (xn != 0)
    scale = float(np.median(yn[kept] / xn[kept])) if kept.any() else float("nan")
    ok = abs(drop_frac - RATE) <= 6 * sigma + 1e-4 and abs(scale * KEEP - 1) <= 0.02
    consistent = None
    if dx is not None and g is not None:
        gn = np.asarray(g, np.float32)
        dxn = np.asarray(dx, np.float32)
        where = (xn != 0) & (gn != 0)
        consistent = bool(((dxn == 0) == dropped)[where].all())
        ok = ok and consistent
    return {"drop_frac": drop_frac, "scale": scale, "mask_consistent": consistent, "ok": bool(ok)}


def checked(c: Contestant, shape: tuple[int, ...], dtype_name: str, mode: str) -> dict[str, Any]:
    """:func:`check_output` of one call of ``c`` (no check for the limit)."""
    if not c.is_dropout:
        return {"drop_frac": None, "scale": None, "mask_consistent": None, "ok": None}
    x, g = inputs(shape, DTYPES[dtype_name])
    aux = c.make_aux(x.dtype)
    if mode == "fwd":
        return check_output(x, fwd_fn(c)(x, aux), None, None)
    y, dx = fwd_bwd_fn(c)(x, aux, g)
    return check_output(x, y, g, dx)


def _nbytes(leaf: Any) -> int:
    dtype = leaf.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return math.prod(leaf.shape) * dtype.itemsize
    return math.prod(leaf.shape) * jnp.dtype(dtype).itemsize


def _residual_leaves(c: Contestant, shape: tuple[int, ...], dtype: Any) -> list[Any]:
    """The leaves of the vjp closure: what ``jax.vjp`` keeps for the backward pass."""
    x = jax.ShapeDtypeStruct(shape, dtype)
    aux = c.make_aux(dtype)

    def closure(x: jax.Array, aux: Any) -> Any:
        return jax.vjp(lambda x: c.apply(x, aux), x)[1]

    return jax.tree_util.tree_leaves(jax.eval_shape(closure, x, aux))


def residuals(c: Contestant, dtype: Any) -> dict[str, Any]:
    """Residual bytes per element: the growth of the vjp residuals between two sizes.

    A constant part (a key, a scalar rate) costs nothing per element; anything that
    grows with the input (a stored mask, a saved input) shows up as B/elem.
    """
    small, large = (1024, 1024), (2048, 2048)
    leaves = {shape: _residual_leaves(c, shape, dtype) for shape in (small, large)}
    totals = [sum(_nbytes(leaf) for leaf in leaves[s]) for s in (small, large)]
    n_small, n_large = math.prod(small), math.prod(large)
    per_element = (totals[1] - totals[0]) / (n_large - n_small)
    describe = [f"{leaf.dtype}[{','.join(map(str, leaf.shape))}]" for leaf in leaves[large]]
    sizes = [[math.prod(leaf.shape) for leaf in leaves[s]] for s in (small, large)]
    if len(sizes[0]) == len(sizes[1]):
        growing = [d for d, a, b in zip(describe, *sizes, strict=True) if b > a]
    else:  # the leaves differ in number between the sizes: name them all if any grew
        growing = describe if per_element else []
    return {
        "contestant": c.name,
        "dtype": str(jnp.dtype(dtype)),
        "residual_bytes_per_element": per_element,
        "residual_bytes_constant": totals[0] - per_element * n_small,
        "growing_residuals": growing,
        "residuals_at_2048x2048": describe,
    }
