"""What dropout adds to a whole jitted train step, not to an isolated pass.

An isolated forward+backward of dropout flatters a generator that keeps its mask: with
nothing in between, XLA fuses the forward and backward into one kernel that draws the
mask once. In a training step
other layers sit between a dropout's forward and backward, so a kept mask must be
written and read back. This benchmark times SGD steps of an MLP (``layers`` hidden
``relu`` layers of ``width`` units, dropout at RATE after each) with no dropout,
dropmask's and Flax's, per step (the slope between a loop of 2 steps and a longer one),
and reports each dropout's share of the step.

Usage: ``python -m benchmarks.bench_train_step [--batch 8192] [--width 256] [--layers 4]``
(any backend; ``--section benchmarks/RESULTS.md`` records the table).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import optax
from jax import lax

from benchmarks import _contestants, _mlp
from benchmarks._harness import Looped, per_pass_medians

NONE = "no dropout"
# (batch, width, layers): make bench-full on CPU, --quick, and bench_gpu.
CPU = (8192, 256, 4)
QUICK = (256, 128, 2)
GPU = (16384, 1024, 4)


def looped_steps(drop: _mlp.Drop, layers: int, steps: int) -> Callable[..., Any]:
    """``steps`` SGD steps inside one jit, a fresh dropout key per step."""
    opt = optax.sgd(1e-3)
    grad = jax.grad(_mlp.loss(drop, layers))

    def run(params: dict, x: jax.Array, y: jax.Array, key: jax.Array) -> dict:
        def body(i: jax.Array, carry: tuple[dict, Any]) -> tuple[dict, Any]:
            params, state = carry
            updates, state = opt.update(grad(params, x, y, jax.random.fold_in(key, i)), state)
            return optax.apply_updates(params, updates), state

        return lax.fori_loop(0, steps, body, (params, opt.init(params)))[0]

    return jax.jit(run)


def run(
    batch: int, width: int, layers: int, dtype_name: str = "f32", extra: int = 8, repeats: int = 7
) -> list[dict[str, Any]]:
    dtype = _contestants.DTYPES[dtype_name]
    kx, ky, kp = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (batch, width)).astype(dtype)
    y = jax.random.normal(ky, (batch, width)).astype(dtype)
    args = (_mlp.params(kp, width, layers, dtype), x, y, jax.random.key(1))
    ours, flax, _ = _contestants.contestants(full=False)[0]
    drops: dict[str, _mlp.Drop] = {NONE: None, ours.name: ours.apply, flax.name: flax.apply}
    loops = {
        name: Looped(lambda p, d=drop: looped_steps(d, layers, p), args, extra=extra)
        for name, drop in drops.items()
    }
    seconds = per_pass_medians(loops, repeats=repeats)
    base = seconds[NONE]
    elements = batch * width * layers  # dropout elements per step
    return [
        {
            "contestant": name,
            "batch": batch,
            "width": width,
            "layers": layers,
            "dtype": dtype_name,
            "ms_per_step": s * 1e3,
            "dropout_share": (s - base) / s,
            "dropout_ns_per_element": (s - base) / elements * 1e9,
        }
        for name, s in seconds.items()
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    r0 = rows[0]
    lines = [
        f"MLP train step: batch {r0['batch']}, width {r0['width']}, {r0['layers']} hidden "
        f"layers with dropout (rate {_contestants.RATE}), {r0['dtype']}, SGD; per step.\n",
        "| dropout | ms per step | share of the step | ns per dropout element |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['contestant']} | {r['ms_per_step']:.3f} | {100 * r['dropout_share']:.1f}% | "
            f"{r['dropout_ns_per_element']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=CPU[0])
    parser.add_argument("--width", type=int, default=CPU[1])
    parser.add_argument("--layers", type=int, default=CPU[2])
    parser.add_argument("--dtype", choices=tuple(_contestants.DTYPES), default="f32")
    parser.add_argument("--extra", type=int, default=8, help="extra steps of the long loop")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument(
        "--section",
        help="a RESULTS.md whose 'train-step' section gets the table (make bench-full writes "
        "the same section)",
    )
    args = parser.parse_args(argv)
    rows = run(args.batch, args.width, args.layers, args.dtype, args.extra, args.repeats)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.section:
        from benchmarks._harness import environment, environment_markdown, write_section

        argv = sys.argv[1:] if argv is None else argv
        env = environment_markdown(
            environment(" ".join(["python -m benchmarks.bench_train_step", *argv]))
        )
        body = "## Train step (`python -m benchmarks.bench_train_step`)\n\n" + env + "\n"
        write_section(Path(args.section), "train-step", body + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
