"""Scanned layers: a train step through ``nn.scan``-ned Dense + Dropout layers.

Differentiating a scan, JAX computes whatever in the scanned body depends on no
carried or scanned value once, before the loop, and passes it in whole; a dropout
whose constants (generator constants, counters, the dropped 0) are such values holds
arrays of the activation's size through the whole loop and reads them back at every
iteration. The rows: the step with each library's dropout against the same step
without dropout, in time (paired per repeat) and in compiled temporaries (in units of
one activation, ``[batch, width]`` f32).

Usage: ``python -m benchmarks.bench_scan [--quick]``.
"""

from __future__ import annotations

import argparse
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from benchmarks import bench_transformer_step as ts
from benchmarks._harness import Looped, paired_per_pass_seconds, quartiles
from dropmask import linen as dl

FULL = {"batch": 4096, "width": 512, "depth": 8, "repeats": 11}
QUICK = {"batch": 256, "width": 128, "depth": 3, "repeats": 3}
RATE = 0.1
KINDS = ("none", "flax", "dropmask")


class Layer(nn.Module):
    """``x + dropout(Dense(x))``, the scanned body."""

    kind: str
    width: int

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        y = nn.Dense(self.width)(x)
        if self.kind != "none":
            drop = dl.Dropout if self.kind == "dropmask" else nn.Dropout
            y = drop(RATE)(y, deterministic=deterministic)
        return x + y


class Stack(nn.Module):
    """``depth`` layers under ``nn.scan``, each with its own parameters and dropout key."""

    kind: str
    width: int
    depth: int

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        scanned = nn.scan(
            lambda layer, carry, _: (layer(carry, deterministic), None),
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            length=self.depth,
        )
        return scanned(Layer(self.kind, self.width), x, None)[0]


def rows(quick: bool) -> dict[str, Any]:
    """Paired step seconds and compiled temporaries of the three steps."""
    s = dict(QUICK if quick else FULL)
    repeats = s.pop("repeats")
    x = jax.random.normal(jax.random.key(0), (s["batch"], s["width"]))
    stacks = {kind: Stack(kind, s["width"], s["depth"]) for kind in KINDS}
    params = stacks["none"].init(jax.random.key(1), x, True)["params"]
    args = (params, x, jax.random.key(2))
    steps = {kind: ts.step_fn(stack) for kind, stack in stacks.items()}  # pyright: ignore[reportArgumentType]
    loops = {
        kind: Looped(lambda n, step=step: ts.looped_steps(step, n), args, extra=4)
        for kind, step in steps.items()
    }
    seconds = paired_per_pass_seconds(loops, repeats=repeats)
    temps = {kind: ts.temp_bytes(step, args) for kind, step in steps.items()}
    return {"size": s, "seconds": seconds, "temp_bytes": temps}


def targets(quick: bool) -> list[Any]:
    """The ``make bench`` rows (``benchmarks.targets.Target``)."""
    from benchmarks.targets import Target

    r = rows(quick)
    s, sec, temps = r["size"], r["seconds"], r["temp_bytes"]
    name = (
        f"f32 train step, {s['depth']} nn.scan-ned Dense({s['width']}) + Dropout {RATE} "
        f"layers, [{s['batch']}, {s['width']}]"
    )
    flax_ratio = quartiles([f / n for f, n in zip(sec["flax"], sec["none"], strict=True)])[1]
    activation = s["batch"] * s["width"] * 4
    added = {kind: (temps[kind] - temps["none"]) / activation for kind in ("flax", "dropmask")}
    return [
        Target(
            f"{name}: step with dropmask's dropout / without dropout",
            1.05,
            True,
            [d / n for d, n in zip(sec["dropmask"], sec["none"], strict=True)],
            note=f"Flax's dropout: {flax_ratio:.3f}x (median)",
            backend_only="cpu",
        ),
        Target(
            f"{name}: temporaries dropmask's dropout adds, in activations",
            1.5,
            True,
            [added["dropmask"]],
            note=(
                f"one activation {activation / 2**20:.1f} MiB; without dropout "
                f"{temps['none'] / 2**20:.1f} MiB; Flax's dropout adds {added['flax']:.2f}"
            ),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    r = rows(parser.parse_args().quick)
    for kind in KINDS:
        sec = np.median(r["seconds"][kind]) * 1e3
        print(f"{kind:9s} {sec:8.1f} ms/step  {r['temp_bytes'][kind] / 2**20:8.1f} MiB")


if __name__ == "__main__":
    main()
