"""Monte Carlo dropout: K samples in one ``uncertainty.sample`` call against K single passes.

The prediction is an MLP forward pass (``layers`` hidden ``relu`` layers of ``width``
units, dropout at RATE after each) on ``x: [batch, width]``. One contestant runs K
single forward passes with dropout on, each with its own key; the other draws the same
K samples in one ``dropmask.uncertainty.sample`` call (one ``vmap`` over the keys).
Both are timed per pass (the slope between a short and a long loop of passes inside
one jit, ``_harness.Looped``), back to back in each repeat; the ratio is
``time(one call of K samples) / (K * time(one single pass))``.

Usage: ``python -m benchmarks.bench_mc [--batch 512] [--width 512] [--layers 3]
[--samples 32] [--chunk 4]`` (``--chunk 0``: all samples in one ``vmap``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import dropmask
from benchmarks import _mlp
from benchmarks._contestants import RATE
from benchmarks._harness import Looped, paired_per_pass_ratios, quartiles
from dropmask import uncertainty

# (batch, width, layers, samples): make bench, and --quick.
FULL = {"batch": 512, "width": 512, "layers": 3, "samples": 32, "chunk": 4}
QUICK = {"batch": 64, "width": 128, "layers": 2, "samples": 8, "chunk": 4}


def forward(params: dict, layers: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """``(x, key) -> output``: the MLP with dropout on, keyed by ``key``."""

    def f(x: jax.Array, key: jax.Array) -> jax.Array:
        h = x
        for i in range(layers):
            h = jax.nn.relu(h @ params[f"w{i}"] + params[f"b{i}"][None])
            h = dropmask.dropout(h, RATE, key=jax.random.fold_in(key, i))
        return h @ params[f"w{layers}"] + params[f"b{layers}"][None]

    return f


def _loop(body: Callable[[jax.Array, jax.Array], jax.Array], passes: int) -> Any:
    """``passes`` calls of ``body(x, key_p)`` inside one jit, their outputs summed (kept live)."""

    def run(x: jax.Array, key: jax.Array) -> jax.Array:
        def step(p: jax.Array, total: jax.Array) -> jax.Array:
            return total + jnp.sum(body(x, jax.random.fold_in(key, p)))

        return lax.fori_loop(0, passes, step, jnp.zeros((), jnp.float32))

    return jax.jit(run)


def loops(
    batch: int, width: int, layers: int, samples: int, extra: int, chunk: int | None = None
) -> dict[str, Looped]:
    """The two contestants: ``'single'`` (one pass) and ``'sample'`` (K samples in one call,
    ``chunk`` at a time)."""
    kx, kp = jax.random.split(jax.random.key(0))
    params = _mlp.params(kp, width, layers, jnp.float32)
    x = jax.random.normal(kx, (batch, width))
    f = forward(params, layers)
    args = (x, jax.random.key(1))

    def k_samples(x: jax.Array, key: jax.Array) -> jax.Array:
        return uncertainty.sample(f, x, key, samples, chunk_size=chunk)

    # A pass of 'sample' costs about K single passes: give 'single' K times the passes.
    return {
        "single": Looped(lambda p: _loop(f, p * samples), args, extra=extra, short=2),
        "sample": Looped(lambda p: _loop(k_samples, p), args, extra=extra, short=2),
    }


def run(
    batch: int,
    width: int,
    layers: int,
    samples: int,
    repeats: int = 9,
    extra: int = 8,
    chunk: int | None = None,
) -> list[float]:
    """Paired ratios ``time(K samples in one call) / (K * time(one pass))``, one per repeat.

    ``chunk`` is the call's ``chunk_size``: all K samples in one ``vmap`` hold K copies
    of every activation, which on a CPU fall out of cache (about 1.1-1.2x at the full
    size); a few at a time keep the working set of a single pass.
    """
    contestants = loops(batch, width, layers, samples, extra, chunk)
    # Each 'single' pass above is already K passes long.
    return paired_per_pass_ratios(contestants["sample"], contestants["single"], repeats=repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, value in FULL.items():
        parser.add_argument(f"--{name}", type=int, default=value)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    ratios = run(
        args.batch, args.width, args.layers, args.samples, args.repeats, chunk=args.chunk or None
    )
    q1, median, q3 = quartiles(ratios)
    print(
        f"K={args.samples} samples in one call / K single passes, MLP batch {args.batch} "
        f"width {args.width} x {args.layers} layers, rate {RATE}: {median:.3f} "
        f"(quartiles {q1:.3f} to {q3:.3f}, {len(ratios)} pairs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
