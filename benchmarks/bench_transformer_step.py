"""What dropout adds to a Transformer encoder layer's train step: Flax's vs dropmask's.

The layer is the encoder block of Flax's WMT model: pre-LayerNorm self-attention with
attention-weight dropout (``broadcast_dropout=False``, so one mask element per
``[batch, heads, q, k]`` weight), dropout on the attention output before the residual
add, and an MLP block with dropout after both Dense layers. Two dropouts share every
parameter and input: ``flax.linen.Dropout`` with Flax's attention function, and
``dropmask.linen.Dropout`` with ``dropmask.dot_product_attention``. Each is measured
against its own baseline, the same layer at rate 0 (no dropout code runs), because the
two attention functions differ in cost even without dropout; that difference is
reported apart, so it cannot pass for a cheaper dropout.

Each step is SGD on the mean squared output; steps run in a ``fori_loop`` inside one
jit, a fresh dropout key per step. A step's time is the slope between a loop of 2 steps
and a longer one, all contestants timed back to back within each repeat (the order
alternating between repeats), so each repeat yields one paired "added time" per
dropout contestant; the table gives their median and quartiles, and says when the
quartiles straddle 0 (the effect is within this machine's noise). Temporary memory is
XLA's ``temp_size_in_bytes`` for one compiled step.

``--sites`` profiles dropmask's addition site by site instead: attention weights
alone, the other sites alone, all of them, each against the rate-0 layer.

Usage: ``python -m benchmarks.bench_transformer_step [--batch 16] [--length 256]
[--dtype f32] [--repeats 9] [--sites]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax import lax

import dropmask
from benchmarks._harness import Looped, paired_per_pass_seconds, quartiles
from dropmask import linen as dl

RATE = 0.1
FLAX, DROPMASK = "flax.linen", "dropmask"
# (dropout library, rate): each library's dropout and its own rate-0 baseline.
KINDS = ((FLAX, 0.0), (FLAX, RATE), (DROPMASK, 0.0), (DROPMASK, RATE))
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


class MlpBlock(nn.Module):
    """Dense -> relu -> dropout -> Dense -> dropout, as in Flax's WMT ``MlpBlock``."""

    kind: str
    rate: float
    mlp_dim: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        drop, rate = dl.Dropout if self.kind == DROPMASK else nn.Dropout, self.rate
        y = nn.relu(nn.Dense(self.mlp_dim, dtype=self.dtype)(x))
        y = drop(rate)(y, deterministic=deterministic)
        y = nn.Dense(x.shape[-1], dtype=self.dtype)(y)
        return drop(rate)(y, deterministic=deterministic)


class EncoderLayer(nn.Module):
    """Pre-LayerNorm encoder block: ``x: [batch, length, width]`` to the same shape."""

    kind: str
    rate: float
    heads: int
    mlp_dim: int
    dtype: Any
    # The attention-weight dropout rate; None: ``rate``. Set apart to profile the sites.
    attention_rate: float | None = None
    # Causal self-attention: Flax's layer gets ``nn.make_causal_mask``, as its users
    # write it; dropmask's gets ``is_causal=True`` through ``functools.partial``, so
    # the structure reaches the attention function as structure, not as an array.
    causal: bool = False
    # dropmask's attention algorithm and tile size; None: its defaults ("auto").
    algorithm: str | None = None
    block: int | None = None

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        drop, rate = dl.Dropout if self.kind == DROPMASK else nn.Dropout, self.rate
        attention_fn: Callable[..., jax.Array] = nn.dot_product_attention
        mask = None
        if self.kind == DROPMASK:
            options: dict[str, Any] = {"is_causal": True} if self.causal else {}
            if self.algorithm is not None:
                options["algorithm"] = self.algorithm
            if self.block is not None:
                options.update(block_q=self.block, block_k=self.block)
            attention_fn = functools.partial(dropmask.dot_product_attention, **options)
        elif self.causal:
            mask = nn.make_causal_mask(x[..., 0])
        y = nn.LayerNorm(dtype=self.dtype)(x)
        y = nn.MultiHeadDotProductAttention(
            num_heads=self.heads,
            dtype=self.dtype,
            dropout_rate=rate if self.attention_rate is None else self.attention_rate,
            broadcast_dropout=False,
            attention_fn=attention_fn,
        )(y, y, mask=mask, deterministic=deterministic)
        x = x + drop(rate)(y, deterministic=deterministic)
        z = nn.LayerNorm(dtype=self.dtype)(x)
        return x + MlpBlock(self.kind, rate, self.mlp_dim, self.dtype)(z, deterministic)


def step_fn(layer: EncoderLayer) -> Callable[..., Any]:
    """``(params, x, key) -> params``: one SGD step with dropout in training mode."""
    opt = optax.sgd(1e-3)

    def loss(params: Any, x: jax.Array, key: jax.Array) -> jax.Array:
        y = layer.apply({"params": params}, x, False, rngs={"dropout": key})
        return jnp.mean(jnp.square(y.astype(jnp.float32)))

    def step(params: Any, x: jax.Array, key: jax.Array) -> Any:
        updates, _ = opt.update(jax.grad(loss)(params, x, key), opt.init(params))
        return optax.apply_updates(params, updates)

    return step


def looped_steps(step: Callable[..., Any], steps: int) -> Callable[..., Any]:
    """``steps`` train steps inside one jit, key ``fold_in(key, i)`` at step ``i``."""

    def run(params: Any, x: jax.Array, key: jax.Array) -> Any:
        body = lambda i, p: step(p, x, jax.random.fold_in(key, i))  # noqa: E731
        return lax.fori_loop(0, steps, body, params)

    return jax.jit(run)


def temp_bytes(step: Callable[..., Any], args: tuple[Any, ...]) -> int:
    """XLA's temporary buffer bytes for one compiled step."""
    analysis = jax.jit(step).lower(*args).compile().memory_analysis()
    return int(getattr(analysis, "temp_size_in_bytes", 0))


def contestant_name(kind: tuple[str, float]) -> str:
    lib, rate = kind
    return f"{lib} rate {rate:g}" if rate else f"{lib} attention, no dropout"


def run(
    batch: int = 16,
    length: int = 256,
    width: int = 256,
    heads: int = 8,
    mlp_dim: int = 1024,
    dtype_name: str = "f32",
    extra: int = 6,
    repeats: int = 9,
) -> dict[str, Any]:
    """Times the four layers; returns one row per dropout with its paired added share."""
    dtype = DTYPES[dtype_name]
    kx, kp = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (batch, length, width), dtype)
    layers = {k: EncoderLayer(k[0], k[1], heads, mlp_dim, dtype) for k in KINDS}
    params = layers[KINDS[0]].init(kp, x, True)["params"]
    args = (params, x, jax.random.key(1))
    steps = {k: step_fn(layer) for k, layer in layers.items()}
    loops = {
        contestant_name(k): Looped(lambda n, s=s: looped_steps(s, n), args, extra=extra)
        for k, s in steps.items()
    }
    seconds = paired_per_pass_seconds(loops, repeats=repeats)
    temps = {contestant_name(k): temp_bytes(s, args) for k, s in steps.items()}
    rows = []
    added_time: dict[str, list[float]] = {}
    added_shares: dict[str, list[float]] = {}
    for lib in (FLAX, DROPMASK):
        base, with_dropout = contestant_name((lib, 0.0)), contestant_name((lib, RATE))
        added_time[lib] = [t - b for t, b in zip(seconds[with_dropout], seconds[base], strict=True)]
        shares = [d / b for d, b in zip(added_time[lib], seconds[base], strict=True)]
        added_shares[lib] = shares
        q1, med, q3 = quartiles(shares)
        rows.append(
            {
                "dropout": lib,
                "dtype": dtype_name,
                "shape": [batch, length, width],
                "heads": heads,
                "mlp_dim": mlp_dim,
                "baseline_ms": 1e3 * quartiles(seconds[base])[1],
                "ms_per_step": 1e3 * quartiles(seconds[with_dropout])[1],
                "added_share_median": med,
                "added_share_quartiles": [q1, q3],
                "within_noise": q1 <= 0.0 <= q3,
                "baseline_temp_bytes": temps[base],
                "temp_bytes": temps[with_dropout],
                "added_temp_bytes": temps[with_dropout] - temps[base],
            }
        )
    flax_row, ours = rows
    ratios = [o / f for o, f in zip(added_time[DROPMASK], added_time[FLAX], strict=True) if f > 0]
    return {
        "rows": rows,
        "step_seconds": seconds,
        "added_shares": added_shares,
        "added_time_ratios": ratios,
        "dropmask_over_flax_added_time": quartiles(ratios)[1] if len(ratios) >= 2 else None,
        "dropmask_added_share": ours["added_share_median"],
        "flax_added_share": flax_row["added_share_median"],
        "dropmask_over_flax_added_temp": (
            ours["added_temp_bytes"] / flax_row["added_temp_bytes"]
            if flax_row["added_temp_bytes"] > 0
            else None
        ),
    }


def _paired_steps(
    layers: dict[str, EncoderLayer],
    init_with: str,
    x: jax.Array,
    params_key: jax.Array,
    extra: int,
    repeats: int,
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per-repeat step seconds (paired) and temporary bytes of each layer's train step.

    All layers share the parameters ``layers[init_with]`` initialises.
    """
    params = layers[init_with].init(params_key, x, True)["params"]
    args = (params, x, jax.random.key(1))
    steps = {name: step_fn(layer) for name, layer in layers.items()}
    loops = {
        name: Looped(lambda n, s=s: looped_steps(s, n), args, extra=extra)
        for name, s in steps.items()
    }
    seconds = paired_per_pass_seconds(loops, repeats=repeats)
    return seconds, {name: temp_bytes(s, args) for name, s in steps.items()}


# (attention-weight rate, rate of the other sites) per profiled variant.
SITES = {
    "attention weights only": (RATE, 0.0),
    "attention output and MLP only": (0.0, RATE),
    "all sites": (RATE, RATE),
}


def profile_sites(
    batch: int = 16,
    length: int = 256,
    width: int = 256,
    heads: int = 8,
    mlp_dim: int = 1024,
    dtype_name: str = "f32",
    extra: int = 6,
    repeats: int = 7,
) -> str:
    """Where dropmask's addition to the step goes: each group of sites on its own.

    Every variant runs against the same rate-0 layer, paired per repeat as in
    :func:`run`; returns a markdown table of added step time and temporary memory.
    """
    dtype = DTYPES[dtype_name]
    kx, kp = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (batch, length, width), dtype)
    variants = {"none": (0.0, 0.0), **SITES}
    layers = {
        name: EncoderLayer(DROPMASK, other, heads, mlp_dim, dtype, attention_rate=attention)
        for name, (attention, other) in variants.items()
    }
    seconds, temps = _paired_steps(layers, "none", x, kp, extra, repeats)
    lines = [
        f"dropmask's dropout by site, {dtype_name} [{batch}, {length}, {width}], {heads} heads, "
        f"MLP {mlp_dim}; rate-0 step {1e3 * quartiles(seconds['none'])[1]:.1f} ms.\n",
        "| dropout at | added step time | added temp MiB |",
        "|---|---|---|",
    ]
    for name in SITES:
        shares = [(t - b) / b for t, b in zip(seconds[name], seconds["none"], strict=True)]
        q1, med, q3 = quartiles(shares)
        lines.append(
            f"| {name} | {100 * med:+.1f}% ({100 * q1:+.1f}% to {100 * q3:+.1f}%) | "
            f"{(temps[name] - temps['none']) / 2**20:.2f} |"
        )
    return "\n".join(lines) + "\n"


# (algorithm, tile) per attention path profiled by --paths; tile None: the default.
PATHS = {
    "auto (the default)": (None, None),
    "dense": ("dense", None),
    "blockwise, 64 tiles": ("blockwise", 64),
    "blockwise, 128 tiles": ("blockwise", 128),
}


def profile_paths(
    lengths: tuple[int, ...] = (256, 512),
    tokens: int = 4096,
    width: int = 256,
    heads: int = 8,
    mlp_dim: int = 1024,
    dtype_name: str = "f32",
    extra: int = 6,
    repeats: int = 7,
) -> str:
    """Which attention path serves the dropout step best at each length.

    At each length (``tokens // length`` sequences), dropmask's layer with dropout on
    every path of :data:`PATHS` against Flax's layer without dropout, paired per
    repeat as in :func:`run`; returns a markdown table of step time / that baseline
    and the temporaries each adds to it. This is what ``algorithm="auto"`` is set by.
    """
    dtype = DTYPES[dtype_name]
    lines = [
        f"dropmask's step with dropout {RATE} by attention path, {dtype_name}, {tokens} tokens "
        f"per step, width {width}, {heads} heads, MLP {mlp_dim}: time / Flax's step without "
        "dropout (median, quartiles of paired repeats) and temporaries added to it.\n",
        "| length | path | time / Flax without dropout | added temp MiB |",
        "|---|---|---|---|",
    ]
    for length in lengths:
        kx, kp = jax.random.split(jax.random.key(0))
        x = jax.random.normal(kx, (max(tokens // length, 1), length, width), dtype)
        layers = {"flax": EncoderLayer(FLAX, 0.0, heads, mlp_dim, dtype)} | {
            name: EncoderLayer(DROPMASK, RATE, heads, mlp_dim, dtype, algorithm=a, block=b)
            for name, (a, b) in PATHS.items()
        }
        seconds, temps = _paired_steps(layers, "flax", x, kp, extra, repeats)
        for name in PATHS:
            ratios = [t / b for t, b in zip(seconds[name], seconds["flax"], strict=True)]
            q1, med, q3 = quartiles(ratios)
            lines.append(
                f"| {length} | {name} | {med:.3f}x ({q1:.3f}x to {q3:.3f}x) | "
                f"{(temps[name] - temps['flax']) / 2**20:+.1f} |"
            )
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    r0 = result["rows"][0]
    b, t, w = r0["shape"]
    lines = [
        f"Transformer encoder layer train step: x [{b}, {t}, {w}], {r0['heads']} heads, MLP "
        f"{r0['mlp_dim']}, dropout {RATE} (attention weights, attention output, both MLP "
        f"Dense layers), {r0['dtype']}, SGD. Each dropout against the same layer at rate 0 "
        "with the same attention function; added time: median (quartiles) of paired "
        "per-repeat differences.\n",
        "| dropout | baseline ms | ms per step | added step time | within noise "
        "| baseline temp MiB | added temp MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        q1, q3 = r["added_share_quartiles"]
        lines.append(
            f"| {r['dropout']} | {r['baseline_ms']:.1f} | {r['ms_per_step']:.1f} | "
            f"{100 * r['added_share_median']:+.1f}% ({100 * q1:+.1f}% to {100 * q3:+.1f}%) | "
            f"{'yes' if r['within_noise'] else 'no'} | {r['baseline_temp_bytes'] / 2**20:.1f} | "
            f"{r['added_temp_bytes'] / 2**20:.2f} |"
        )
    ratio = result["dropmask_over_flax_added_time"]
    temp = result["dropmask_over_flax_added_temp"]
    lines.append("")
    lines.append(
        "dropmask's added time / Flax's (median of paired ratios): "
        + ("n/a" if ratio is None else f"{ratio:.3f}")
        + "; added temporary memory / Flax's: "
        + ("n/a" if temp is None else f"{temp:.4f}")
    )
    return "\n".join(lines) + "\n"


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(n) for n in text.split(","))
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas, e.g. 256,512; got {text!r}"
        )
    return lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--mlp-dim", type=int, default=1024)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="f32")
    parser.add_argument("--extra", type=int, default=6, help="extra steps of the long loop")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument(
        "--sites", action="store_true", help="profile dropmask's dropout site by site instead"
    )
    parser.add_argument(
        "--paths",
        action="store_true",
        help="compare dropmask's attention paths (dense, blockwise tiles) at --lengths",
    )
    parser.add_argument(
        "--lengths",
        type=_lengths,
        default=(256, 512),
        help="with --paths: sequence lengths, comma-separated",
    )
    parser.add_argument(
        "--section", help="with --sites or --paths: a RESULTS.md to record the table in"
    )
    args = parser.parse_args(argv)
    sizes = (args.batch, args.length, args.width, args.heads, args.mlp_dim, args.dtype)
    if args.sites or args.paths:
        if args.paths:
            lengths = args.lengths
            tokens = args.batch * args.length
            table = profile_paths(
                lengths, tokens, *sizes[2:], extra=args.extra, repeats=args.repeats
            )
            title, name = "Attention paths in the Transformer step (`--paths`)", "attention-paths"
        else:
            table = profile_sites(*sizes, args.extra, args.repeats)
            title, name = "Transformer step by dropout site (`--sites`)", "transformer-sites"
        print(table)
        if args.section:
            from benchmarks._harness import environment, environment_markdown, write_section

            flags = sys.argv[1:] if argv is None else argv
            command = " ".join(["python -m benchmarks.bench_transformer_step", *flags])
            env = environment_markdown(environment(command))
            body = f"## {title}\n\n" + env + "\n" + table
            # One section per dtype, so an f32 and a bf16 run both stay recorded.
            key = name if args.sites else f"{name}-{args.dtype}"
            write_section(Path(args.section), key, body)
        return 0
    result = run(
        args.batch,
        args.length,
        args.width,
        args.heads,
        args.mlp_dim,
        args.dtype,
        args.extra,
        args.repeats,
    )
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
