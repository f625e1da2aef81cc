"""Attention at long sequence lengths: Flax's dense weights against dropmask's default.

Two measurements, both with attention-weight dropout (rate 0.1, one mask element per
``[batch, heads, q, k]`` weight, as Flax's ``broadcast_dropout=False``) and causal
self-attention:

* :func:`long_step`: the encoder layer of ``bench_transformer_step`` (pre-LayerNorm
  self-attention and MLP, SGD on the mean squared output) with dropout on the
  attention weights only, so the step is the attention's. Flax's layer gets
  ``nn.make_causal_mask``; dropmask's gets ``is_causal=True`` through
  ``functools.partial`` and its default ``algorithm``. Step time per contestant is
  the slope between a loop of 1 step and a longer one, contestants back to back
  within each repeat (``_harness.paired_per_pass_seconds``); memory is XLA's
  ``temp_size_in_bytes`` for one compiled step. Where Flax is left out (its weights
  alone would not fit), dropmask's step is timed on its own, call by call.
* :func:`attention_temp_bytes`: XLA's temporaries for the forward and backward pass
  of ``dropmask.dot_product_attention`` alone, ``[batch, length, heads, depth]``
  inputs; the growth between two lengths says whether memory is linear (ratio 4 for
  4x the tokens) or quadratic (16) in the sequence length. Compiled, never run.

Usage: ``python -m benchmarks.bench_attention [--length 4096] [--dtype f32]
[--repeats 3] [--no-flax]``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

import dropmask
from benchmarks import bench_transformer_step as step
from benchmarks._harness import Looped, paired_per_pass_seconds, quartiles

RATE = step.RATE
FLAX, DROPMASK = step.FLAX, step.DROPMASK


def default_algorithm() -> str | None:
    """The default of ``dot_product_attention``'s ``algorithm``; None where it has none."""
    param = inspect.signature(dropmask.dot_product_attention).parameters.get("algorithm")
    return None if param is None else str(param.default)


def long_step(
    batch: int = 2,
    length: int = 4096,
    width: int = 256,
    heads: int = 8,
    mlp_dim: int = 1024,
    dtype_name: str = "f32",
    repeats: int = 3,
    extra: int = 2,
    with_flax: bool = True,
) -> dict[str, Any]:
    """Seconds per step (one value per repeat) and temporary bytes of each layer.

    Returns ``{"seconds": {lib: [...]}, "temp_bytes": {lib: int}, ...}`` with ``lib``
    in (``FLAX``, ``DROPMASK``); without Flax, dropmask's step is timed ``repeats``
    times as single calls of a compiled step.
    """
    dtype = step.DTYPES[dtype_name]
    kx, kp = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (batch, length, width), dtype)
    libs = (FLAX, DROPMASK) if with_flax else (DROPMASK,)
    layers = {
        lib: step.EncoderLayer(lib, 0.0, heads, mlp_dim, dtype, attention_rate=RATE, causal=True)
        for lib in libs
    }
    params = jax.jit(lambda k: layers[DROPMASK].init(k, x[:, :1], True)["params"])(kp)
    args = (params, x, jax.random.key(1))
    steps = {lib: step.step_fn(layer) for lib, layer in layers.items()}
    temps = {lib: step.temp_bytes(s, args) for lib, s in steps.items()}
    if with_flax:
        loops = {
            lib: Looped(lambda n, s=s: step.looped_steps(s, n), args, extra=extra, short=1)
            for lib, s in steps.items()
        }
        seconds = paired_per_pass_seconds(loops, repeats=repeats, warmup=1)
    else:
        compiled = jax.jit(steps[DROPMASK]).lower(*args).compile()
        jax.block_until_ready(compiled(*args))
        seconds = {DROPMASK: []}
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            seconds[DROPMASK].append(time.perf_counter() - start)
    return {
        "shape": [batch, length, width],
        "heads": heads,
        "mlp_dim": mlp_dim,
        "dtype": dtype_name,
        "algorithm": default_algorithm(),
        "seconds": seconds,
        "temp_bytes": temps,
    }


def attention_temp_bytes(
    length: int,
    dtype_name: str = "f32",
    *,
    batch: int = 2,
    heads: int = 8,
    depth: int = 32,
    algorithm: str | None = None,
) -> int:
    """XLA's temporary bytes for ``grad`` of causal attention with dropout, compiled only.

    ``algorithm``: passed to ``dot_product_attention`` when given (its default else).
    """
    dtype = step.DTYPES[dtype_name]
    qkv = jax.ShapeDtypeStruct((batch, length, heads, depth), dtype)
    chosen = {} if algorithm is None else {"algorithm": algorithm}

    def loss(q: jax.Array, k: jax.Array, v: jax.Array, key: jax.Array) -> jax.Array:
        out = dropmask.dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_rate=RATE,
            key=key,
            deterministic=False,
            broadcast_dropout=False,
            **chosen,
        )
        return jnp.sum(out.astype(jnp.float32))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    analysis = grad.lower(qkv, qkv, qkv, jax.random.key(0)).compile().memory_analysis()
    return int(getattr(analysis, "temp_size_in_bytes", 0))


def markdown(result: dict[str, Any]) -> str:
    b, t, w = result["shape"]
    lines = [
        f"Causal encoder layer train step, x [{b}, {t}, {w}], {result['heads']} heads, MLP "
        f"{result['mlp_dim']}, attention dropout {RATE}, {result['dtype']}; dropmask's "
        f"algorithm: {result['algorithm']!r} (its default).\n",
        "| attention | ms per step (median) | temp MiB |",
        "|---|---|---|",
    ]
    for lib, seconds in result["seconds"].items():
        lines.append(
            f"| {lib} | {1e3 * quartiles(seconds)[1]:.0f} | "
            f"{result['temp_bytes'][lib] / 2**20:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--mlp-dim", type=int, default=1024)
    parser.add_argument("--dtype", choices=tuple(step.DTYPES), default="f32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-flax", action="store_true", help="time dropmask's step alone")
    args = parser.parse_args(argv)
    result = long_step(
        args.batch,
        args.length,
        args.width,
        args.heads,
        args.mlp_dim,
        args.dtype,
        args.repeats,
        with_flax=not args.no_flax,
    )
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
