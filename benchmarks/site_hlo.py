"""What one dropout site, or one attention call, puts into the compiled program.

For each contestant, the gradient of ``sum(y * y)`` through one call is lowered and
compiled in this process; printed are the compile time, the lines of
``compiled.as_text()`` and its most frequent ops. The counts are exact and the same on
every run; the times are one compilation each, so run each contestant in a fresh
process (``--only NAME``) to compare times. ``docs/dropout_speed.md`` ("What is left,
and why") quotes it.

Contestants: ``flax`` (``flax.linen.Dropout``), ``dropmask`` (``dropmask.dropout``),
``dropmask-linen`` (``dropmask.linen.Dropout``) at ``[8, 128, 512]``, rate 0.1; and
``flax-attention``, ``dropmask-attention`` (the dot-product attention functions at
``[8, 128, 4, 32]``) at rate 0 and 0.1 (``...-0`` and ``...-0.1``).

Run: ``python -m benchmarks.site_hlo [--only NAME]``.
"""

from __future__ import annotations

import argparse
import collections
import re
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

import dropmask
from dropmask import linen as dl

RATE = 0.1


def _dropout(kind: str) -> Callable[[Any, Any], Any]:
    def call(x: Any, key: Any) -> Any:
        if kind == "flax":
            return nn.Dropout(RATE, deterministic=False).apply({}, x, rngs={"dropout": key})
        if kind == "dropmask-linen":
            return dl.Dropout(RATE, deterministic=False).apply({}, x, rngs={"dropout": key})
        return dropmask.dropout(x, RATE, key=key)

    return call


def _attention(kind: str, rate: float) -> Callable[[Any, Any], Any]:
    attend = nn.dot_product_attention if kind == "flax" else dropmask.dot_product_attention

    def call(q: Any, key: Any) -> Any:
        return attend(
            q, q, q, dropout_rng=key, dropout_rate=rate, broadcast_dropout=False,
            deterministic=rate == 0,
        )  # fmt: skip

    return call


CONTESTANTS: dict[str, tuple[Callable[[Any, Any], Any], tuple[int, ...]]] = {
    "flax": (_dropout("flax"), (8, 128, 512)),
    "dropmask": (_dropout("dropmask"), (8, 128, 512)),
    "dropmask-linen": (_dropout("dropmask-linen"), (8, 128, 512)),
    **{
        f"{kind}-attention-{rate:g}": (_attention(kind, rate), (8, 128, 4, 32))
        for kind in ("flax", "dropmask")
        for rate in (0.0, RATE)
    },
}


def measure(name: str) -> dict[str, Any]:
    """Compile time, compiled lines and the ten most frequent ops of ``name``'s site."""
    call, shape = CONTESTANTS[name]

    def loss(x: Any, key: Any) -> Any:
        y = call(x, key)
        return jnp.sum(y * y)

    lowered = jax.jit(jax.grad(loss)).lower(jnp.ones(shape), jax.random.key(0))
    start = time.perf_counter()
    text = lowered.compile().as_text() or ""
    seconds = time.perf_counter() - start
    ops = collections.Counter(re.findall(r"= \S+ ([a-z][\w-]*)\(", text))
    return {"name": name, "compile_s": seconds, "lines": len(text.splitlines()), "ops": ops}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=str(__doc__).split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(CONTESTANTS), help="one contestant")
    args = parser.parse_args(argv)
    for name in [args.only] if args.only else list(CONTESTANTS):
        row = measure(name)
        common = ", ".join(f"{op} {n}" for op, n in row["ops"].most_common(10))
        print(f"{name}: compile {row['compile_s']:.2f} s, {row['lines']} lines; {common}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
