"""The measurements behind ``dropmask why``: what each spelling of dropout's last line
compiles to, which dtype it returns, how it treats non-finite values, its gradients,
its residuals and its speed, on whatever backend and JAX version are running.

The three spellings are ``lax.select(mask, x / keep, zeros_like(x))`` (Flax's),
``jnp.where(mask, x / keep, 0)`` and ``mask * x / keep``.
"""

from __future__ import annotations

import collections
import functools
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "KEEP",
    "backward_selects",
    "compiled_hlo",
    "cond_study",
    "dtype_table",
    "forms",
    "fwd_bwd",
    "gradient_edges",
    "hlo_ops",
    "hlo_study",
    "ieee_zero",
    "inputs",
    "normalized_hlo",
    "overflow_f16",
    "residual_bytes",
    "select_is_strict",
    "specials",
    "timings",
]

KEEP = 0.9  # a Python float, as in flax.linen.Dropout
Form = Callable[[jax.Array, jax.Array], jax.Array]


def forms(keep: float = KEEP) -> dict[str, Form]:
    """``{'select', 'where', 'multiply'}``: the three spellings, ``(x, mask) -> y``.

    Example:
      >>> import jax.numpy as jnp
      >>> x, mask = jnp.array([1.0, 2.0, 3.0]), jnp.array([True, False, True])
      >>> {name: form(x, mask).tolist() for name, form in forms(keep=0.5).items()}
      {'select': [2.0, 0.0, 6.0], 'where': [2.0, 0.0, 6.0], 'multiply': [2.0, 0.0, 6.0]}
    """
    return {
        "select": lambda x, mask: lax.select(mask, x / keep, jnp.zeros_like(x)),
        "where": lambda x, mask: jnp.where(mask, x / keep, 0),
        "multiply": lambda x, mask: mask * x / keep,
    }


def fwd_bwd(form: Form) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """``(x, mask, g) -> (y, dx)``: the output and the input cotangent of one vjp."""

    def run(x: jax.Array, mask: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        y, vjp_fn = jax.vjp(lambda x: form(x, mask), x)
        return y, vjp_fn(g)[0]

    return run


def inputs(n: int, dtype: Any, seed: int = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``x, g ~ N(0, 1)`` and ``mask ~ Bernoulli(KEEP)``, each ``[n]``."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(n), dtype)
    mask = jnp.asarray(rng.random(n) < KEEP)
    g = jnp.asarray(rng.standard_normal(n), dtype)
    return x, mask, g


_HLO_OP = re.compile(r"=\s*(?:\([^=]*?\)|\S+)\s+([a-z][a-z0-9-]*)\(")


def compiled_hlo(fn: Callable[..., Any], *args: Any) -> str:
    """Optimized HLO text of ``jax.jit(fn)`` for ``args``."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    if text is None:
        raise RuntimeError(f"the {jax.default_backend()} backend gave no HLO text to compare")
    return text


def hlo_ops(text: str) -> collections.Counter[str]:
    """Opcode histogram of HLO text, fusion bodies included."""
    ops: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("%", "ROOT %")):
            match = _HLO_OP.search(line)
            if match:
                ops[match.group(1)] += 1
    return ops


def normalized_hlo(text: str) -> str:
    """HLO instructions with names and metadata stripped, so equal programs compare equal."""
    body = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("%", "ROOT %", "ENTRY")):
            line = re.sub(r",?\s*metadata=\{[^}]*\}", "", line)
            line = re.sub(r"%[\w.-]+", "%v", line)
            body.append(line)
    return "\n".join(body)


def _array_converts(fn: Callable[..., Any], *args: Any) -> int:
    """Array-sized ``convert_element_type`` equations in the jaxpr, nested ones included."""

    def walk(jaxpr: Any) -> int:
        count = 0
        for eqn in jaxpr.eqns:
            prim = str(eqn.primitive)
            count += prim == "convert_element_type" and eqn.outvars[0].aval.ndim > 0
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", param)
                if hasattr(inner, "eqns"):
                    count += walk(inner)
        return count

    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def hlo_study(n: int = 4096) -> list[dict[str, Any]]:
    """Per dtype, form and mode: jaxpr array converts, HLO ops, identity with select."""
    rows = []
    for dname, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        x, mask, g = inputs(n, dtype)
        for mode in ("fwd", "fwd+bwd"):
            reference = None
            for name, form in forms().items():
                fn, args = (form, (x, mask)) if mode == "fwd" else (fwd_bwd(form), (x, mask, g))
                text = compiled_hlo(fn, *args)
                norm = normalized_hlo(text)
                reference = reference if reference is not None else norm
                ops = hlo_ops(text)
                rows.append(
                    {
                        "dtype": dname,
                        "mode": mode,
                        "form": name,
                        "jaxpr array converts": _array_converts(fn, *args),
                        "hlo select": ops["select"],
                        "hlo multiply": ops["multiply"],
                        "hlo convert": ops["convert"],
                        "hlo same as select": norm == reference,
                    }
                )
    return rows


def dtype_table() -> dict[str, dict[str, str]]:
    """Result dtype of each spelling per input dtype, and of ``where`` with typed zeros."""
    out = {}
    for dname, dtype in (("f16", jnp.float16), ("bf16", jnp.bfloat16), ("f32", jnp.float32)):
        x, mask = jnp.ones((4,), dtype), jnp.ones((4,), bool)
        cases = {name: form(x, mask) for name, form in forms().items()}
        cases["where(0.0)"] = jnp.where(mask, x / KEEP, 0.0)
        cases["where(np.float32(0))"] = jnp.where(mask, x / KEEP, np.float32(0))
        out[dname] = {k: str(v.dtype) for k, v in cases.items()}
    return out


def select_is_strict() -> dict[str, bool]:
    """``lax.select`` rejects a zeros operand of another dtype; ``jnp.where`` promotes."""
    x, mask = jnp.ones((4,), jnp.bfloat16), jnp.ones((4,), bool)
    try:
        lax.select(mask, x, jnp.zeros((4,), jnp.float32))
        rejects = False
    except TypeError:
        rejects = True
    promotes = jnp.where(mask, x, jnp.zeros((4,), jnp.float32)).dtype == jnp.float32
    return {"select rejects": rejects, "where promotes": bool(promotes)}


def ieee_zero() -> dict[str, bool]:
    """Whether finite * 0 is exactly 0 at +-max, smallest normal and subnormal, per dtype."""
    out = {}
    for dname, dtype in (("f16", jnp.float16), ("bf16", jnp.bfloat16), ("f32", jnp.float32)):
        fi = jnp.finfo(dtype)
        vals = jnp.asarray([fi.max, -fi.max, fi.tiny, fi.smallest_subnormal, 1.0], dtype)
        prod = jax.jit(lambda v: v * jnp.zeros((), v.dtype))(vals)
        out[dname] = bool((np.asarray(prod, np.float32) == 0).all())
    return out


def overflow_f16(value: float = 1000.0) -> dict[str, Any]:
    """The largest keep_prob at which an f16 input ``value`` overflows in ``x / keep``."""
    x = jnp.full((1,), value, jnp.float16)
    keeps = [0.5, 0.1, 0.05, 0.02, 0.01, 0.005]
    infs = {k: bool(jnp.isinf(jax.jit(lambda x, k=k: x / k)(x))[0]) for k in keeps}
    first = next((k for k in keeps if infs[k]), None)
    return {"value": value, "first keep that overflows": first, "f16 max": 65504.0}


def specials() -> dict[str, dict[str, int]]:
    """NaN outputs at dropped positions holding inf/-inf/nan, per dtype, form, jit/eager."""
    out: dict[str, dict[str, int]] = {}
    for dname, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        x = jnp.asarray([np.inf, -np.inf, np.nan, -3.0], dtype)
        mask = jnp.zeros((4,), bool)
        for name, form in forms().items():
            for how, fn in (("jit", jax.jit(form)), ("eager", form)):
                y = np.asarray(fn(x, mask), np.float32)
                out[f"{dname} {name} {how}"] = {
                    "nan": int(np.isnan(y).sum()),
                    "-0.0": int(((y == 0) & np.signbit(y)).sum()),
                }
    return out


def gradient_edges(n: int = 1024) -> dict[str, dict[str, bool]]:
    """NaN in outputs/gradients at keep_prob 0 and through log(0) at dropped positions."""
    out = {}
    x, mask, g = inputs(n, jnp.float32, seed=2)
    none = jnp.zeros_like(mask)
    u = jnp.where(mask, jnp.abs(x) + 1, 0.0)
    for name in forms():
        f0, f = forms(0.0)[name], forms()[name]
        y0, dx0 = jax.jit(fwd_bwd(f0))(x, none, g)
        dlog = jax.jit(jax.grad(lambda u, m, f=f: f(jnp.log(u), m).sum()))(u, mask)
        out[name] = {
            "keep=0 output NaN": bool(jnp.isnan(y0).any()),
            "keep=0 grad NaN": bool(jnp.isnan(dx0).any()),
            "log(0) at dropped: grad NaN": bool(jnp.isnan(dlog[~mask]).all()),
        }
    return out


def backward_selects(n: int = 64) -> dict[str, Any]:
    """Size of the ``select_n`` in the select form's backward jaxpr, against the input's."""
    x, mask, g = inputs(n, jnp.float32)
    _, vjp_fn = jax.vjp(lambda x: forms()["select"](x, mask), x)
    eqns = jax.make_jaxpr(vjp_fn)(g).eqns
    sizes = [e.outvars[0].aval.size for e in eqns if str(e.primitive) == "select_n"]
    return {"input size": n, "backward select sizes": sizes}


def residual_bytes(n: int = 1 << 16, rate: float = 0.1) -> dict[str, float]:
    """Bytes per element ``jax.vjp`` keeps for the backward pass (``x`` excluded).

    These are the residuals JAX hands to the backward pass before XLA optimises the
    whole step; inside one jitted train step XLA may fold some (e.g. a zeros array).
    """
    from .._dropout import dropout

    x = jnp.ones((n,), jnp.float32)
    key = jax.random.key(0)

    def flax_style(x: jax.Array) -> jax.Array:
        mask = jax.random.bernoulli(key, 1 - rate, x.shape)
        return lax.select(mask, x / (1 - rate), jnp.zeros_like(x))

    out = {}
    for name, fn in (
        ("bernoulli + select", flax_style),
        ("dropmask.dropout", lambda x: dropout(x, rate, key)),
        ("dropmask.dropout residual='none'", lambda x: dropout(x, rate, key, residual="none")),
    ):
        _, vjp_fn = jax.vjp(fn, x)
        leaves = [leaf for leaf in jax.tree.leaves(vjp_fn) if leaf is not x and _sized(leaf)]
        total = sum(np.dtype(leaf.dtype).itemsize * leaf.size for leaf in leaves)
        masks = sum(leaf.size for leaf in leaves if leaf.dtype == jnp.bool_)
        out[name] = total / n
        out[f"{name}: bool mask"] = masks / n
    return out


def generator_programs(shape: tuple[int, int] = (256, 256), rate: float = 0.1) -> dict[str, Any]:
    """How XLA compiles dropmask's packed generator around its consumer on this backend.

    Counts the generator's own computations (the fusion, ``conditional`` or loop whose
    result is the packed keep-flags: one byte per 8 elements at every rate,
    ``u8[rows, columns / 8]``) in the forward program of each residual mode, and in the
    backward pass jitted apart, as the passes of a network's layers are.
    """
    from .._dropout import dropout
    from .._random import FIELDS, Residual

    x, key = jnp.ones(shape, jnp.float32), jax.random.key(0)
    kind = {8: "u8", 16: "u16", 32: "u32"}[FIELDS.part_bits]
    parts = f"{kind}[{shape[0]},{-(-shape[1] // 32) * FIELDS.parts}]"
    producers = (" fusion(", " conditional(", " while(")

    def generators(hlo: str) -> int:
        return sum(
            1
            for line in hlo.splitlines()
            if any(p in line for p in producers) and f"= {parts}" in line
        )

    out: dict[str, Any] = {}
    forward = {}
    modes: tuple[Residual, ...] = ("mask", "none")
    for mode in modes:
        layer = functools.partial(dropout, rate=rate, residual=mode)
        forward[mode] = compiled_hlo(lambda x, k, f=layer: f(x, key=k), x, key)
        out[f"forward generators, residual={mode!r}"] = generators(forward[mode])
        _, vjp_fn = jax.vjp(functools.partial(layer, key=key), x)
        backward = compiled_hlo(lambda f, g: f(g), vjp_fn, x)
        out[f"backward generators, residual={mode!r}"] = generators(backward)
    out["forward programs equal"] = normalized_hlo(forward["mask"]) == normalized_hlo(
        forward["none"]
    )
    return out


def _sized(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and not jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _median(fn: Callable[..., Any], args: tuple[Any, ...], repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _interleaved(
    cases: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]], repeats: int
) -> dict:
    """Fastest seconds per case, timed round-robin so background load hits all alike.

    The order rotates every repeat: the first case of a round runs on colder caches,
    and rotating shares that cost out instead of always charging it to one case.
    """
    for fn, args in cases.values():
        jax.block_until_ready(fn(*args))
    times: dict[Any, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, args = cases[name]
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {name: min(ts) for name, ts in times.items()}


def timings(n: int, repeats: int, rate: float = 1 - KEEP) -> dict[str, dict[str, float]]:
    """Fastest jitted call in ms, f32 and bf16, fwd and fwd+bwd, of each form, of a
    second copy of the select form (the noise control), and of ``dropmask.dropout``
    and Flax's ``bernoulli + select`` (masks drawn inside).

    The minimum over rounds is taken because background load on a shared machine only
    ever adds time; two copies of one program then differ only by what is left.
    """
    from .._dropout import dropout

    key = jax.random.key(0)

    def flax_style(x: jax.Array, _: Any) -> jax.Array:
        mask = jax.random.bernoulli(key, 1 - rate, x.shape)
        return lax.select(mask, x / (1 - rate), jnp.zeros_like(x))

    contestants: dict[str, Form] = {
        **forms(),
        "select (again)": forms()["select"],
        "bernoulli + select": flax_style,
        "dropmask.dropout": lambda x, _: dropout(x, rate, key),
    }
    out: dict[str, dict[str, float]] = {}
    for dname, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        x, mask, g = inputs(n, dtype, seed=3)
        for mode in ("fwd", "fwd+bwd"):
            cases = {
                name: (jax.jit(form), (x, mask))
                if mode == "fwd"
                else (jax.jit(fwd_bwd(form)), (x, mask, g))
                for name, form in contestants.items()
            }
            fastest = _interleaved(cases, repeats)
            out[f"{dname} {mode}"] = {k: round(v * 1e3, 4) for k, v in fastest.items()}
    return out


def cond_study(
    width: int = 256, depth: int = 8, batch: int = 32, repeats: int = 7
) -> dict[str, Any]:
    """Masking (compute both, select) against ``lax.cond`` (run one branch).

    ``expensive`` is ``depth`` matmuls of ``[width, width]``; ``cheap`` is ``x + 1``.
    With one scalar predicate that is False, ``lax.cond`` skips ``expensive``; under
    ``vmap`` with a per-example predicate, ``cond`` becomes a select of both branches.

    Returns:
      ms per call for cond / where, scalar and vmapped, and whether the vmapped
      cond's jaxpr still holds a ``cond``.
    """
    w = jnp.asarray(np.random.default_rng(5).standard_normal((width, width)) / width**0.5)
    w = w.astype(jnp.float32)

    def expensive(x: jax.Array) -> jax.Array:
        for _ in range(depth):
            x = jnp.tanh(x @ w)
        return x

    def cheap(x: jax.Array) -> jax.Array:
        return x + 1.0

    def by_cond(p: jax.Array, x: jax.Array) -> jax.Array:
        return lax.cond(p, expensive, cheap, x)

    def by_mask(p: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.where(p, expensive(x), cheap(x))

    x = jnp.ones((batch, width), jnp.float32)
    p = jnp.asarray(False)
    ps = jnp.zeros((batch,), bool)
    xs = jnp.ones((batch, 1, width), jnp.float32)
    vcond, vmask = jax.vmap(by_cond), jax.vmap(by_mask)
    prims = {str(e.primitive) for e in jax.make_jaxpr(vcond)(ps, xs).eqns}
    cases = {
        "scalar cond": (jax.jit(by_cond), (p, x)),
        "scalar where": (jax.jit(by_mask), (p, x)),
        "vmap cond": (jax.jit(vcond), (ps, xs)),
        "vmap where": (jax.jit(vmask), (ps, xs)),
    }
    out: dict[str, Any] = {
        f"{k} ms": round(v * 1e3, 4) for k, v in _interleaved(cases, repeats).items()
    }
    out["vmap cond keeps a cond"] = "cond" in prims
    return out
