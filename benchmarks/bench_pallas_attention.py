"""Attention with dropout as Pallas kernels on a GPU: forward+backward time per pass.

Run on a machine with one CUDA GPU::

    python -m benchmarks.bench_pallas_attention [--batch 4] [--length 2048] [--heads 16]
        [--depth 64] [--dtype bf16] [--causal] [--repeats 11] [--block-q 64] [--block-k 32]

Contestants, each the forward and backward pass (``q``, ``k``, ``v`` gradients) of
``[batch, length, heads, depth]`` self-attention:

* ``dot_product_attention(algorithm="pallas")`` with dropout 0.1 on the weights (one
  flag per ``[batch, head, q, k]`` weight, ``broadcast_dropout=False``), and at rate 0;
* ``algorithm="dense"`` with the same dropout;
* JAX's own Pallas FlashAttention (``jax.experimental.pallas.ops.gpu.attention.mha``),
  which has no dropout, with its default tiles.

A pass's time is the slope between a loop of 2 passes and a longer one inside one jit,
all contestants back to back within each repeat (``_harness.paired_per_pass_seconds``);
each pass feeds the next (``q + 0 * dq``, with the 0 a run-time value) so no pass is
loop-invariant, and each dropout pass draws with a fresh key. Before timing, the
contestants' outputs without dropout are compared.

The target it prints: dropout costs at most 10% over JAX's Pallas kernel without
dropout (ours at rate 0.1 / JAX's, median of the paired ratios). On a backend other
than a GPU it prints one line saying so and exits 0.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import dropmask
from benchmarks._harness import (
    Looped,
    environment,
    environment_markdown,
    finite,
    looped,
    markdown_table,
    paired_per_pass_seconds,
    quartiles,
)

RATE = 0.1
TARGET = 1.10  # ours with dropout / JAX's Pallas kernel without
OURS, OURS_NO_DROPOUT = "dropmask pallas, dropout 0.1", "dropmask pallas, rate 0"
DENSE = "dropmask dense, dropout 0.1"
JAX_MHA = "jax pallas mha, no dropout"
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}

Attention = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def gpu_refusal(backend: str) -> str | None:
    """The one line printed instead of measuring on ``backend``; None on a GPU."""
    if backend == "gpu":
        return None
    return (
        f"bench_pallas_attention needs a GPU (the kernels are Triton's); the backend is "
        f"{backend!r}, nothing measured."
    )


def jax_mha() -> Callable[..., Any] | None:
    """JAX's Pallas FlashAttention, or None where it cannot be imported."""
    try:
        from jax.experimental.pallas.ops.gpu.attention import mha
    except ImportError:
        return None
    return mha


def contestants(
    causal: bool, depth: int, blocks: tuple[int | None, int | None] = (None, None)
) -> dict[str, Attention]:
    """name -> ``attend(q, k, v, key) -> out``; JAX's kernel only where importable.

    ``blocks``: our kernels' ``(block_q, block_k)``, None for the defaults.
    """

    def ours(algorithm: str, rate: float) -> Attention:
        tiles = {"block_q": blocks[0], "block_k": blocks[1]} if algorithm == "pallas" else {}

        def attend(q: jax.Array, k: jax.Array, v: jax.Array, key: jax.Array) -> jax.Array:
            return dropmask.dot_product_attention(
                q, k, v, is_causal=causal, dropout_rate=rate, deterministic=rate == 0,
                key=key, broadcast_dropout=False, algorithm=algorithm, **tiles,
            )  # fmt: skip

        return attend

    out = {
        OURS: ours("pallas", RATE),
        OURS_NO_DROPOUT: ours("pallas", 0.0),
        DENSE: ours("dense", RATE),
    }
    mha = jax_mha()
    if mha is not None:

        def theirs(q: jax.Array, k: jax.Array, v: jax.Array, key: jax.Array) -> jax.Array:
            del key
            return mha(q, k, v, None, sm_scale=1.0 / math.sqrt(depth), causal=causal)

        out[JAX_MHA] = theirs
    return out


def looped_passes(attend: Attention, passes: int) -> Callable[..., Any]:
    """``passes`` forward+backward passes in one jit, each feeding the next."""

    def one(i: jax.Array, carry: Any, key: jax.Array, zero: jax.Array) -> Any:
        q, k, v, ct = carry
        out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, jax.random.fold_in(key, i)), q, k, v)
        dq, dk, dv = vjp(ct.astype(out.dtype))
        step = zero.astype(q.dtype)
        return q + step * dq, k + step * dk, v + step * dv, ct

    def run(q: jax.Array, k: jax.Array, v: jax.Array, ct: jax.Array, key: jax.Array, zero):
        return lax.fori_loop(0, passes, lambda i, c: one(i, c, key, zero), (q, k, v, ct))[:3]

    return jax.jit(run)


def inputs(batch: int, length: int, heads: int, depth: int, dtype: Any) -> tuple[Any, ...]:
    keys = jax.random.split(jax.random.key(0), 4)
    shape = (batch, length, heads, depth)
    q, k, v, ct = (jax.random.normal(key, shape, dtype) for key in keys)
    return q, k, v, ct, jax.random.key(1), jnp.zeros((), jnp.float32)


def check(attend: Mapping[str, Attention], args: Sequence[Any], causal: bool) -> dict[str, float]:
    """Largest absolute difference from the dense path of each kernel without dropout."""
    q, k, v, _, key, _ = args
    dense = functools.partial(dropmask.dot_product_attention, algorithm="dense", is_causal=causal)
    want = jax.jit(dense)(q, k, v).astype(jnp.float32)
    out = {}
    for name in (OURS_NO_DROPOUT, JAX_MHA):
        if name in attend:
            got = jax.jit(attend[name])(q, k, v, key).astype(jnp.float32)
            out[name] = float(jnp.max(jnp.abs(got - want)))
    return out


def rows(seconds: Mapping[str, Sequence[float]], baseline: str) -> list[dict[str, Any]]:
    """Table rows: per-pass ms quartiles, and the paired ratio to ``baseline``'s."""
    out = []
    for name, values in seconds.items():
        q1, med, q3 = quartiles(values)
        row: dict[str, Any] = {
            "name": name,
            "ms": med * 1e3,
            "iqr": f"{q1 * 1e3:.3f}-{q3 * 1e3:.3f}",
        }
        if baseline in seconds:
            ratios = finite([a / b for a, b in zip(values, seconds[baseline], strict=True)])
            r1, rmed, r3 = quartiles(ratios)
            row["ratio"] = rmed
            row["ratio_iqr"] = f"{r1:.2f}-{r3:.2f} ({len(ratios)} pairs)"
        out.append(row)
    return out


def target_line(seconds: Mapping[str, Sequence[float]]) -> str:
    """The target and whether the run met it."""
    goal = (
        f"target: dropout costs at most {TARGET - 1:.0%} over JAX's Pallas kernel without dropout"
    )
    if JAX_MHA not in seconds:
        return f"{goal}: not measured ({JAX_MHA} not available)"
    ratio = quartiles(
        finite([a / b for a, b in zip(seconds[OURS], seconds[JAX_MHA], strict=True)])
    )[1]
    verdict = "met" if ratio <= TARGET else "not met"
    return f"{goal}: {OURS} / {JAX_MHA} = {ratio:.2f} ({verdict})"


def markdown(seconds: Mapping[str, Sequence[float]], setup: str, env: dict[str, Any]) -> str:
    table = markdown_table(
        rows(seconds, JAX_MHA),
        [
            ("contestant", "name"),
            ("ms per fwd+bwd", "ms:.3f"),
            ("IQR", "iqr"),
            (f"x {JAX_MHA}", "ratio:.2f"),
            ("ratio IQR", "ratio_iqr"),
        ],
    )
    missing = "" if JAX_MHA in seconds else f"\n{JAX_MHA}: not available\n"
    return f"{environment_markdown(env)}\n{setup}\n\n{table}{missing}\n{target_line(seconds)}\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--block-q", type=int, default=None, help="our kernels' query tile")
    parser.add_argument("--block-k", type=int, default=None, help="our kernels' key tile")
    args = parser.parse_args(argv)
    refusal = gpu_refusal(jax.default_backend())
    if refusal is not None:
        print(refusal)
        return 0
    env = environment(
        "python -m benchmarks.bench_pallas_attention " + " ".join(argv or sys.argv[1:])
    )
    attend = contestants(args.causal, args.depth, (args.block_q, args.block_k))
    data = inputs(args.batch, args.length, args.heads, args.depth, DTYPES[args.dtype])
    for name, diff in check(attend, data, args.causal).items():
        print(f"check: {name} vs dense without dropout, max abs difference {diff:.3g}")
    loops: dict[str, Looped] = {
        name: looped(functools.partial(looped_passes, fn), data) for name, fn in attend.items()
    }
    seconds = paired_per_pass_seconds(loops, repeats=args.repeats)
    setup = (
        f"[{args.batch}, {args.length}, {args.heads}, {args.depth}] {args.dtype}, "
        f"{'causal' if args.causal else 'full'} self-attention, forward+backward per pass; "
        f"our tiles block_q={args.block_q or 'default'}, block_k={args.block_k or 'default'}"
    )
    print(markdown(seconds, setup, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
