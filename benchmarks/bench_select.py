"""``lax.select`` vs ``jnp.where`` vs ``mask * x / keep`` as dropout's last line.

The facts (compiled programs, dtypes, non-finite values, gradients, residuals) come
from :func:`dropmask.why.check_claims`, the code behind ``dropmask why``; this script
adds what a quick command cannot afford: per-pass kernel times at ``[4096, 4096]``,
where fixed per-call costs cancel. ``docs/select_vs_where.md`` quotes both.

Run: ``python -m benchmarks.bench_select [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks._harness import Looped, interleaved_medians, per_pass_medians
from dropmask import why

KEEP = 0.9
EXTRA_PASSES = 16


def _inputs(shape: tuple[int, ...], dtype: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    mask = jnp.asarray(rng.random(shape) < KEEP)
    g = jnp.asarray(rng.standard_normal(shape), dtype)
    return x, mask, g


def _steps(fwd: bool) -> dict[str, Callable[..., Any]]:
    """Each form (and ``x * c``, the memory-bound reference) as one loop-carried pass."""
    steps: dict[str, Callable[..., Any]] = {}
    for name, form in {**why.forms(KEEP), "x * c (limit)": lambda x, c: x * c}.items():
        if fwd:
            steps[name] = form
        else:

            def step(x: Any, aux: Any, g: Any, form: Callable[..., Any] = form) -> Any:
                y, vjp_fn = jax.vjp(lambda x: form(x, aux), x)
                return y, vjp_fn(g)[0]

            steps[name] = step
    return steps


def _loop(step: Callable[..., Any], fwd: bool) -> Callable[[int], Callable[..., Any]]:
    def make(passes: int) -> Callable[..., Any]:
        if fwd:
            return jax.jit(lambda x, aux: lax.fori_loop(0, passes, lambda i, x: step(x, aux), x))
        return jax.jit(
            lambda x, aux, g: lax.fori_loop(0, passes, lambda i, c: step(c[0], aux, c[1]), (x, g))
        )

    return make


def study_speed(shape: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    """ms per pass (slope over ``EXTRA_PASSES`` passes) and per call of each form."""
    rows = []
    for dname, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        x, mask, g = _inputs(shape, dtype)
        c = jnp.asarray(1 / KEEP, dtype)
        for mode in ("fwd", "fwd+bwd"):
            fwd = mode == "fwd"
            loops, calls = {}, {}
            for name, step in _steps(fwd).items():
                aux = c if name.startswith("x * c") else mask
                args = (x, aux) if fwd else (x, aux, g)
                loops[name] = Looped(_loop(step, fwd), args, EXTRA_PASSES)
                calls[name] = (jax.jit(step), args)
            per_pass = per_pass_medians(loops, repeats=repeats)
            per_call = interleaved_medians(calls, repeats=repeats)
            for name, sec in per_pass.items():
                rows.append(
                    {
                        "dtype": dname,
                        "mode": mode,
                        "form": name,
                        "ms/pass": round(sec * 1e3, 3),
                        "pass vs select": round(sec / per_pass["select"], 3),
                        "ms/call": round(per_call[name] * 1e3, 3),
                    }
                )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(row[c]) for c in cols) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shape, few repeats")
    parser.add_argument("--json", default=None, help="also write everything to this file")
    args = parser.parse_args(argv)
    shape = (1024, 1024) if args.quick else (4096, 4096)
    repeats = 3 if args.quick else 15
    report = why.check_claims(timing=True, repeats=repeats)
    print(report, "\n")
    speed = study_speed(shape, repeats)
    print(f"## per-pass speed, {shape}\n\n{table(speed)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"why": report.to_dict(), "shape": shape, "speed": speed}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
