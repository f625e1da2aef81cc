"""Seed 000: ``lax.select`` vs ``jnp.where`` vs ``mask * x / keep`` as dropout's last line.

Measures what the three spellings of Flax's final dropout line compile to, which
dtype they return, whether their outputs and gradients are bit-identical, how they
treat inf/NaN at dropped positions, and how fast each is. ``docs/select_vs_where.md``
quotes this script's output; ``tests/test_select_claims.py`` pins the facts.

Run: ``python -m benchmarks.bench_select [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks._timing import interleaved_medians, per_pass_medians

KEEP = 0.9  # rate 0.1, a Python float exactly as in flax.linen.Dropout
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}

Form = Callable[[jax.Array, jax.Array], jax.Array]


def forms(keep: float = KEEP) -> dict[str, Form]:
    """The three spellings from the seed, verbatim (``mask`` is ``bool[...]``)."""
    return {
        "select": lambda x, mask: lax.select(mask, x / keep, jnp.zeros_like(x)),
        "where": lambda x, mask: jnp.where(mask, x / keep, 0),
        "multiply": lambda x, mask: mask * x / keep,
    }


def fwd_bwd(form: Form) -> Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """``(x, mask, g) -> (y, dx)``: the primal and the input cotangent of one vjp."""

    def run(x: jax.Array, mask: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        y, vjp_fn = jax.vjp(lambda x: form(x, mask), x)
        return y, vjp_fn(g)[0]

    return run


_HLO_OP = re.compile(r"=\s*(?:\([^=]*?\)|\S+)\s+([a-z][a-z0-9-]*)\(")


def hlo_ops(text: str) -> collections.Counter[str]:
    """Histogram of instruction opcodes in optimized HLO text, fusion bodies included."""
    ops: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(("%", "ROOT %")):
            continue
        match = _HLO_OP.search(line)
        if match:
            ops[match.group(1)] += 1
    return ops


def normalized_hlo(text: str) -> str:
    """Optimized HLO with names, metadata and source locations stripped, for equality."""
    body = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(("%", "ROOT %", "ENTRY")):
            continue
        line = re.sub(r",?\s*metadata=\{[^}]*\}", "", line)
        line = re.sub(r"%[\w.-]+", "%v", line)
        line = re.sub(r"calls=%v", "calls", line)
        body.append(line)
    return "\n".join(body)


def compiled_text(fn: Callable[..., Any], *args: Any) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def example_inputs(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> tuple[jax.Array, ...]:
    kx, km, kg = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, shape, dtype)
    mask = jax.random.bernoulli(km, KEEP, shape)
    g = jax.random.normal(kg, shape, dtype)
    return x, mask, g


def bits(a: jax.Array) -> np.ndarray:
    arr = np.asarray(a)
    return arr.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[arr.dtype.itemsize])


# --- measurements -----------------------------------------------------------------


def study_hlo() -> list[dict[str, Any]]:
    """Jaxpr primitives and compiled-HLO op histograms of each form, fwd and fwd+bwd."""
    rows = []
    for dname, dtype in DTYPES.items():
        x, mask, g = example_inputs((256, 256), dtype)
        ref_norm: dict[str, str] = {}
        for name, form in forms().items():
            for mode, fn, args in (
                ("fwd", form, (x, mask)),
                ("fwd+bwd", fwd_bwd(form), (x, mask, g)),
            ):
                eqns = _all_eqns(jax.make_jaxpr(fn)(*args).jaxpr)
                prims = collections.Counter(str(e.primitive) for e in eqns)
                array_converts = sum(
                    str(e.primitive) == "convert_element_type" and e.outvars[0].aval.ndim > 0
                    for e in eqns
                )
                text = compiled_text(fn, *args)
                norm = normalized_hlo(text)
                ref_norm.setdefault(mode, norm)
                rows.append(
                    {
                        "dtype": dname,
                        "form": name,
                        "mode": mode,
                        "jaxpr_primitives": dict(sorted(prims.items())),
                        "jaxpr array converts": array_converts,
                        "hlo_ops": dict(sorted(hlo_ops(text).items())),
                        "hlo_same_as_select": norm == ref_norm[mode],
                    }
                )
    return rows


def _all_eqns(jaxpr: Any) -> list[Any]:
    """Every equation of ``jaxpr``, recursing into nested (e.g. ``jnp.where``'s) jaxprs."""
    out = []
    for eqn in jaxpr.eqns:
        out.append(eqn)
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                out.extend(_all_eqns(inner))
    return out


def _negative_zeros(a: jax.Array) -> int:
    arr = np.asarray(a, np.float32)
    return int(((arr == 0) & np.signbit(arr)).sum())


def study_dtypes() -> list[dict[str, str]]:
    """Result dtype of each spelling (and of jnp.where with strongly typed zeros)."""
    x = jnp.ones((4,), jnp.bfloat16)
    mask = jnp.ones((4,), bool)
    cases = {
        "lax.select(mask, x/keep, zeros_like(x))": forms()["select"](x, mask),
        "jnp.where(mask, x/keep, 0)": forms()["where"](x, mask),
        "jnp.where(mask, x/keep, 0.0)": jnp.where(mask, x / KEEP, 0.0),
        "mask * x / keep": forms()["multiply"](x, mask),
        "jnp.where(mask, x/keep, np.float32(0))": jnp.where(mask, x / KEEP, np.float32(0)),
        "jnp.where(mask, x/keep, jnp.float32(0))": jnp.where(mask, x / KEEP, jnp.float32(0)),
    }
    return [{"expression (x: bf16)": k, "result dtype": str(v.dtype)} for k, v in cases.items()]


def study_exactness(n: int = 1 << 20) -> list[dict[str, Any]]:
    """Bit-equality of each form with the select form on finite N(0,1) inputs, eager and jit."""
    rows = []
    for dname, dtype in DTYPES.items():
        x, mask, g = example_inputs((n,), dtype, seed=1)
        ref_y, ref_dx = jax.jit(fwd_bwd(forms()["select"]))(x, mask, g)
        for name, form in forms().items():
            y, dx = jax.jit(fwd_bwd(form))(x, mask, g)
            y_eager = form(x, mask)
            rows.append(
                {
                    "dtype": dname,
                    "form": name,
                    "fwd values equal": bool((y == ref_y).all()),
                    "fwd bits differ": int((bits(y) != bits(ref_y)).sum()),
                    "fwd -0.0 count": _negative_zeros(y),
                    "eager fwd bits differ": int((bits(y_eager) != bits(ref_y)).sum()),
                    "grad values equal": bool((dx == ref_dx).all()),
                    "grad bits differ": int((bits(dx) != bits(ref_dx)).sum()),
                    "n": n,
                }
            )
    return rows


def study_division(n: int = 1 << 20) -> list[dict[str, Any]]:
    """How XLA computes ``x / keep``: against IEEE division and multiplication by 1/keep."""
    x = np.asarray(jax.random.normal(jax.random.key(4), (n,), jnp.float32))
    y = np.asarray(jax.jit(lambda x: x / KEEP)(x))
    ieee = x / np.float32(KEEP)
    recip = x * (np.float32(1) / np.float32(KEEP))
    return [
        {
            "f32, N(0,1) inputs": n,
            "jit(x / keep) != IEEE x / keep": int((y != ieee).sum()),
            "jit(x / keep) != x * fl(1/keep)": int((y != recip).sum()),
        }
    ]


def study_specials() -> list[dict[str, Any]]:
    """Output at a *dropped* position holding a special value, per form, jit and eager."""
    rows = []
    for dname, dtype in DTYPES.items():
        finfo = jnp.finfo(dtype)
        values = [np.inf, -np.inf, np.nan, -3.0, float(finfo.max)]
        labels = ["inf", "-inf", "nan", "-3.0", "max finite"]
        x = jnp.asarray(values, dtype)
        mask = jnp.zeros((len(values),), bool)
        for name, form in forms().items():
            for how, fn in (("jit", jax.jit(form)), ("eager", form)):
                y = np.asarray(fn(x, mask), np.float32)
                rows.append(
                    {
                        "dtype": dname,
                        "form": name,
                        "how": how,
                        **{lab: _fmt(v) for lab, v in zip(labels, y, strict=True)},
                    }
                )
    return rows


def _fmt(v: float) -> str:
    if np.isnan(v):
        return "nan"
    if v == 0:
        return "-0.0" if np.signbit(v) else "0.0"
    return f"{v:g}"


def study_ieee_zero() -> list[dict[str, Any]]:
    """The seed's 'huge * 0 may be a tiny nonzero': finite * 0 over extreme values."""
    rows = []
    for dname, dtype in {**DTYPES, "f16": jnp.float16}.items():
        finfo = jnp.finfo(dtype)
        extremes = jnp.asarray(
            [finfo.max, -finfo.max, finfo.tiny, finfo.smallest_subnormal, 1.0], dtype
        )
        prod = np.asarray(extremes * jnp.zeros((), dtype), np.float32)
        quot = np.asarray(jax.jit(lambda x: x / 1e-3)(extremes), np.float32)
        rows.append(
            {
                "dtype": dname,
                "finite * 0 all exactly zero": bool((prod == 0).all()),
                "max finite / 1e-3 (kept value)": _fmt(float(quot[0])),
            }
        )
    return rows


def study_gradients() -> list[dict[str, Any]]:
    """Gradient edge cases: keep_prob = 0, inf cotangents, and the where-NaN trap.

    Each case runs under ``jit`` (one XLA program, mask an argument) and eagerly
    (``jax.vjp`` op by op), because XLA's simplifier changes the multiply form's answer.
    """
    rows = []
    for dname, dtype in DTYPES.items():
        x, mask, g = example_inputs((4096,), dtype, seed=2)
        all_dropped = jnp.zeros_like(mask)
        inf_ct = jnp.where(mask, g, jnp.inf)
        u = jnp.where(mask, jnp.abs(x) + 1, 0)  # log(u) = -inf exactly where dropped
        for name in forms():
            f0, f = forms(0.0)[name], forms()[name]

            def log_grad(u: jax.Array, mask: jax.Array, f: Form = f) -> jax.Array:
                return jax.grad(lambda u: f(jnp.log(u), mask).astype(jnp.float32).sum())(u)

            for how, wrap in (("jit", jax.jit), ("eager", lambda fn: fn)):
                y0, dx0 = wrap(fwd_bwd(f0))(x, all_dropped, g)
                _, dxi = wrap(fwd_bwd(f))(x, mask, inf_ct)
                dlog = wrap(log_grad)(u, mask)
                rows.append(
                    {
                        "dtype": dname,
                        "form": name,
                        "how": how,
                        "keep=0: output NaN": bool(jnp.isnan(y0).any()),
                        "keep=0: grad NaN": bool(jnp.isnan(dx0).any()),
                        "inf cotangent at dropped: grad NaN": bool(jnp.isnan(dxi).any()),
                        "f(log(u)), u=0 at dropped: grad NaN": bool(jnp.isnan(dlog).any()),
                    }
                )
    return rows


def backward_jaxpr() -> str:
    """The transposed select: the backward pass of the select form, as a jaxpr."""
    x, mask, g = example_inputs((8,), jnp.float32)
    _, vjp_fn = jax.vjp(lambda x: forms()["select"](x, mask), x)
    return str(jax.make_jaxpr(vjp_fn)(g))


SHORT_PASSES, EXTRA_PASSES = 2, 16


def _looped(step: Callable[..., Any], passes: int, fwd: bool) -> Callable[..., Any]:
    """``passes`` applications of ``step`` inside one jit, each feeding the next."""
    if fwd:
        return jax.jit(lambda x, aux: lax.fori_loop(0, passes, lambda i, x: step(x, aux), x))

    def run(x: jax.Array, aux: Any, g: jax.Array) -> Any:
        return lax.fori_loop(0, passes, lambda i, c: step(c[0], aux, c[1]), (x, g))

    return jax.jit(run)


def study_speed(shape: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    """Milliseconds of each form (mask given as an input), fwd and fwd+bwd, vs ``x * c``.

    Per pass: the slope between loops of 2 and 18 passes inside one jit, so that what a
    call pays once (copying the input into the loop, faulting in fresh buffers) cancels.
    Per call: one jitted call, fresh buffers included (what op-by-op code pays).
    """
    rows = []
    for dname, dtype in DTYPES.items():
        x, mask, g = example_inputs(shape, dtype, seed=3)
        c = jnp.asarray(1 / KEEP, dtype)
        for mode in ("fwd", "fwd+bwd"):
            fwd = mode == "fwd"
            steps: dict[str, tuple[Callable[..., Any], Any]] = {}
            for name, form in forms().items():
                steps[name] = (form if fwd else fwd_bwd(form), mask)

            def scale(x: jax.Array, c: jax.Array) -> jax.Array:
                return x * c

            if fwd:
                steps["x * c (limit)"] = (scale, c)
            else:
                steps["x * c (limit)"] = (lambda x, c, g: _vjp_scale(scale, x, c, g), c)
            calls, short, long = {}, {}, {}
            for name, (step, aux) in steps.items():
                args = (x, aux) if fwd else (x, aux, g)
                calls[name] = (jax.jit(step), args)
                short[name] = (_looped(step, SHORT_PASSES, fwd), args)
                long[name] = (_looped(step, SHORT_PASSES + EXTRA_PASSES, fwd), args)
            per_call = interleaved_medians(calls, repeats=repeats)
            per_pass = per_pass_medians(short, long, EXTRA_PASSES, repeats=repeats)
            for name, sec in per_pass.items():
                rows.append(
                    {
                        "dtype": dname,
                        "mode": mode,
                        "form": name,
                        "ms/pass": round(sec * 1e3, 3),
                        "pass vs select": round(sec / per_pass["select"], 3),
                        "ms/call": round(per_call[name] * 1e3, 3),
                        "call vs select": round(per_call[name] / per_call["select"], 3),
                    }
                )
    return rows


def _vjp_scale(scale: Callable[..., jax.Array], x: jax.Array, c: jax.Array, g: jax.Array) -> Any:
    y, vjp_fn = jax.vjp(lambda x: scale(x, c), x)
    return y, vjp_fn(g)[0]


# --- report -------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _cell(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}:{n}" for k, n in v.items())
    return str(v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shape, few repeats")
    parser.add_argument("--json", default=None, help="also write all rows to this file")
    args = parser.parse_args(argv)
    shape = (1024, 1024) if args.quick else (4096, 4096)
    repeats = 3 if args.quick else 15

    results: dict[str, Any] = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "hlo": study_hlo(),
        "dtypes": study_dtypes(),
        "exactness": study_exactness(),
        "division": study_division(),
        "specials": study_specials(),
        "ieee_zero": study_ieee_zero(),
        "gradients": study_gradients(),
        "backward_jaxpr": backward_jaxpr(),
        "speed_shape": list(shape),
        "speed": study_speed(shape, repeats),
    }
    print(f"# select vs where vs multiply (jax {jax.__version__}, {jax.default_backend()})\n")
    for key in (
        "hlo",
        "dtypes",
        "exactness",
        "division",
        "specials",
        "ieee_zero",
        "gradients",
        "speed",
    ):
        print(f"## {key}\n")
        print(table(results[key]))
    print("## backward jaxpr of the select form\n")
    print(results["backward_jaxpr"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
