"""LayerDrop and token dropping: what skipping work saves in a train step.

* LayerDrop: a stack of residual MLP blocks (``x + relu(x @ w1) @ w2`` on ``[batch,
  width]``), each through ``dropmask.layer_drop``; a train step (forward and gradient)
  at rate 0.5 against the same step at rate 0 (every block runs). A skipped block is
  a branch of ``lax.cond`` that is not run, so the expected time is about half.
* Token dropping: an encoder block (single-head attention and an MLP on ``[batch,
  length, width]``) on the tokens ``dropmask.drop_tokens`` keeps at rate 0.5, against
  the same step on every token.

Both contestants of a pair are timed per step (the slope between a short and a long
loop of steps inside one jit, ``_harness.Looped``), back to back in each repeat; step
``p`` of a loop draws with ``fold_in(key, p)``, so the loop sees many decisions.

Usage: ``python -m benchmarks.bench_structured [--repeats 9]``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import dropmask
from benchmarks._harness import Looped, paired_per_pass_ratios, quartiles

# The sizes of make bench, and of --quick.
LAYER_DROP_FULL = {"batch": 256, "width": 512, "layers": 8}
LAYER_DROP_QUICK = {"batch": 32, "width": 128, "layers": 4}
TOKENS_FULL = {"batch": 8, "length": 512, "width": 128}
TOKENS_QUICK = {"batch": 2, "length": 128, "width": 32}
RATE = 0.5


def _loop(step: Callable[[Any, jax.Array], jax.Array], passes: int) -> Any:
    """``passes`` calls of ``step(params, key_p)`` in one jit, their results summed."""

    def run(params: Any, key: jax.Array) -> jax.Array:
        def body(p: jax.Array, total: jax.Array) -> jax.Array:
            return total + step(params, jax.random.fold_in(key, p))

        return lax.fori_loop(0, passes, body, jnp.zeros((), jnp.float32))

    return jax.jit(run)


def _per_step(x: jax.Array, key: jax.Array) -> jax.Array:
    """``x`` shifted by a tiny amount drawn from the step's key: a step that would not
    otherwise read its key (rate 0) would be hoisted out of the loop by XLA and cost
    nothing per pass."""
    return x + 1e-3 * jax.random.uniform(key, (), x.dtype)


def layer_drop_step(layers: int, rate: float, x: jax.Array) -> Callable[..., jax.Array]:
    """``(params, key) -> gradient norm``: the block stack's train step at ``rate``."""

    def loss(params: dict, key: jax.Array) -> jax.Array:
        h = _per_step(x, key)
        for i in range(layers):
            w1, w2 = params[f"w1_{i}"], params[f"w2_{i}"]

            def block(h: jax.Array, w1: jax.Array = w1, w2: jax.Array = w2) -> jax.Array:
                return h + jax.nn.relu(h @ w1) @ w2

            h = dropmask.layer_drop(block, h, rate, jax.random.fold_in(key, i))
        return jnp.mean(h**2)

    def step(params: dict, key: jax.Array) -> jax.Array:
        grads = jax.grad(loss)(params, key)
        return jnp.sum(jnp.stack([jnp.sum(g**2) for g in jax.tree.leaves(grads)]))

    return step


def layer_drop_params(width: int, layers: int) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.key(0), 2 * layers)
    scale = 1.0 / math.sqrt(width)
    return {
        f"w{j + 1}_{i}": jax.random.normal(keys[2 * i + j], (width, width)) * scale
        for i in range(layers)
        for j in range(2)
    }


def token_step(rate: float, x: jax.Array) -> Callable[..., jax.Array]:
    """``(params, key) -> gradient norm``: an encoder block's train step on the tokens
    kept at ``rate`` (every token at 0)."""

    def loss(params: dict, key: jax.Array) -> jax.Array:
        x_step = _per_step(x, key)
        if rate:
            kept = dropmask.drop_tokens(x_step, rate, key)
            h, mask = kept.tokens, kept.mask
        else:
            h, mask = x_step, jnp.ones(x.shape[:2], bool)
        q, k, v = (h @ params[name] for name in ("wq", "wk", "wv"))
        attn = dropmask.dot_product_attention(
            q[:, :, None], k[:, :, None], v[:, :, None], kv_mask=mask
        )[:, :, 0]
        h = h + attn @ params["wo"]
        h = h + jax.nn.relu(h @ params["w1"]) @ params["w2"]
        return dropmask.masked_mean(h**2, mask[..., None])

    def step(params: dict, key: jax.Array) -> jax.Array:
        grads = jax.grad(loss)(params, key)
        return jnp.sum(jnp.stack([jnp.sum(g**2) for g in jax.tree.leaves(grads)]))

    return step


def token_params(width: int) -> dict[str, jax.Array]:
    names = ("wq", "wk", "wv", "wo", "w1", "w2")
    keys = jax.random.split(jax.random.key(0), len(names))
    shapes = {"w1": (width, 4 * width), "w2": (4 * width, width)}
    return {
        n: jax.random.normal(k, shapes.get(n, (width, width))) / math.sqrt(width)
        for n, k in zip(names, keys, strict=True)
    }


def layer_drop_loops(batch: int, width: int, layers: int, extra: int) -> dict[str, Looped]:
    """The LayerDrop contestants: ``'drop'`` (rate 0.5) and ``'full'`` (rate 0)."""
    x = jax.random.normal(jax.random.key(1), (batch, width))
    args = (layer_drop_params(width, layers), jax.random.key(2))
    return {
        name: Looped(lambda p, r=r: _loop(layer_drop_step(layers, r, x), p), args, extra=extra)
        for name, r in (("drop", RATE), ("full", 0.0))
    }


def token_loops(batch: int, length: int, width: int, extra: int) -> dict[str, Looped]:
    """The token-dropping contestants: ``'drop'`` (half the tokens) and ``'full'``."""
    x = jax.random.normal(jax.random.key(1), (batch, length, width))
    args = (token_params(width), jax.random.key(2))
    return {
        name: Looped(lambda p, r=r: _loop(token_step(r, x), p), args, extra=extra)
        for name, r in (("drop", RATE), ("full", 0.0))
    }


def run_layer_drop(repeats: int = 9, extra: int = 8, **size: int) -> list[float]:
    """Paired ratios ``time(step at rate 0.5) / time(step at rate 0)``, one per repeat."""
    loops = layer_drop_loops(extra=extra, **size)
    return paired_per_pass_ratios(loops["drop"], loops["full"], repeats=repeats)


def run_tokens(repeats: int = 9, extra: int = 8, **size: int) -> list[float]:
    """Paired ratios ``time(step on the kept half) / time(step on every token)``."""
    loops = token_loops(extra=extra, **size)
    return paired_per_pass_ratios(loops["drop"], loops["full"], repeats=repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    layer = LAYER_DROP_QUICK if args.quick else LAYER_DROP_FULL
    tokens = TOKENS_QUICK if args.quick else TOKENS_FULL
    for label, ratios in (
        (f"LayerDrop {RATE} step / rate-0 step, {layer}", run_layer_drop(args.repeats, **layer)),
        (f"token dropping {RATE} step / every token, {tokens}", run_tokens(args.repeats, **tokens)),
    ):
        q1, median, q3 = quartiles(ratios)
        print(f"{label}: {median:.3f} (quartiles {q1:.3f} to {q3:.3f}, {len(ratios)} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
