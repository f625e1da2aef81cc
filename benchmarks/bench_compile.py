"""What dropout adds to the time it takes to trace, lower and compile a train step.

The model is a pre-LayerNorm Transformer encoder (width 128, 4 heads, MLP 512, batch
8 x 128 tokens, SGD): per block, dropout on the attention output and after both MLP
Dense layers, and on the attention weights (``broadcast_dropout=False``). Four variants
of the same step, in Linen and in NNX:

* ``none``: every rate 0 (no dropout code is traced);
* ``flax``: Flax's ``Dropout`` and Flax's attention function, rate 0.1;
* ``dropmask layers``: dropmask's ``Dropout`` with Flax's attention function (whose
  weights dropout is Flax's own);
* ``dropmask layers + attention``: dropmask's ``Dropout`` and
  ``dropmask.dot_product_attention`` as the attention function.

Each compilation runs in a fresh Python process (nothing cached by an earlier one; no
persistent compilation cache), timed as ``jax.jit(step).trace(...).lower()`` (trace and
lower) and ``.compile()`` (XLA). The rows are *added* times, a variant's minus
``none``'s, each taken as the best of the repeats, divided by Flax's added time; the
note gives every repeat's own ratio (the variants of one repeat run back to back).
Also measured: a 24-layer stack under ``nn.scan`` (one block compiled for all layers),
the 12-layer stack with every block under ``nn.remat``, and each bundled example's
train step at its default config, against the same step at ``rate = 0``.

Usage: ``python -m benchmarks.bench_compile [--layers 12,24] [--repeats 2] [--apis
linen,nnx] [--examples digits,translate]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

VARIANTS = ("none", "flax", "dropmask layers", "dropmask layers + attention")
WIDTH, HEADS, MLP, BATCH, LENGTH, RATE = 128, 4, 512, 8, 128, 0.1
EXAMPLES = ("digits", "digits_nnx", "seq2seq", "sst2", "translate", "lm")


# --- the worker: one compilation in this process --------------------------------------


def _linen_model(
    variant: str, layers: int, scan: bool, remat: bool = False
) -> tuple[Any, Callable[..., Any]]:
    """``(model, loss(params, x, key))`` of the Linen encoder."""
    import flax.linen as nn
    import jax.numpy as jnp

    import dropmask
    from dropmask import linen as dl

    rate = 0.0 if variant == "none" else RATE
    drop = nn.Dropout if variant in ("none", "flax") else dl.Dropout
    attention = nn.dot_product_attention
    if variant == "dropmask layers + attention":
        attention = dropmask.dot_product_attention

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any, deterministic: bool) -> Any:
            y = nn.LayerNorm()(x)
            y = nn.MultiHeadDotProductAttention(
                num_heads=HEADS,
                dropout_rate=rate,
                broadcast_dropout=False,
                attention_fn=attention,
            )(y, y, deterministic=deterministic)
            x = x + drop(rate)(y, deterministic=deterministic)
            z = nn.relu(nn.Dense(MLP)(nn.LayerNorm()(x)))
            z = nn.Dense(WIDTH)(drop(rate)(z, deterministic=deterministic))
            return x + drop(rate)(z, deterministic=deterministic)

    class ScannedBlock(nn.Module):
        @nn.compact
        def __call__(self, x: Any, deterministic: bool) -> tuple[Any, None]:
            return Block()(x, deterministic), None

    class Encoder(nn.Module):
        @nn.compact
        def __call__(self, x: Any, deterministic: bool) -> Any:
            if scan:
                stack = nn.scan(
                    ScannedBlock,
                    variable_axes={"params": 0},
                    split_rngs={"params": True, "dropout": True},
                    length=layers,
                    in_axes=nn.broadcast,
                )
                return stack()(x, deterministic)[0]
            block = nn.remat(Block, static_argnums=(2,)) if remat else Block
            for _ in range(layers):
                x = block()(x, deterministic)
            return x

    model = Encoder()

    def loss(params: Any, x: Any, key: Any) -> Any:
        y = model.apply({"params": params}, x, False, rngs={"dropout": key})
        return jnp.mean(jnp.square(y))

    return model, loss


def _nnx_model(variant: str, layers: int) -> tuple[Any, Callable[..., Any]]:
    """``((params, other state), loss(params, x, key, other state))`` of the NNX encoder."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import dropmask
    from dropmask import nnx as dnnx

    rate = 0.0 if variant == "none" else RATE
    drop = nnx.Dropout if variant in ("none", "flax") else dnnx.Dropout
    attention = nnx.dot_product_attention
    if variant == "dropmask layers + attention":
        attention = dropmask.dot_product_attention

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.norm1, self.norm2 = (
                nnx.LayerNorm(WIDTH, rngs=rngs),
                nnx.LayerNorm(WIDTH, rngs=rngs),
            )
            self.attention = nnx.MultiHeadAttention(
                num_heads=HEADS,
                in_features=WIDTH,
                dropout_rate=rate,
                broadcast_dropout=False,
                attention_fn=attention,
                decode=False,
                rngs=rngs,
            )
            self.up, self.down = (
                nnx.Linear(WIDTH, MLP, rngs=rngs),
                nnx.Linear(MLP, WIDTH, rngs=rngs),
            )
            self.drops = nnx.List([drop(rate, rngs=rngs) for _ in range(3)])

        def __call__(self, x: Any) -> Any:
            y = self.norm1(x)
            x = x + self.drops[0](self.attention(y, y))
            z = self.drops[1](nnx.relu(self.up(self.norm2(x))))
            return x + self.drops[2](self.down(z))

    class Encoder(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])

        def __call__(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return x

    model = Encoder(nnx.Rngs(params=0, dropout=1))
    model.train()  # every dropout on
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params: Any, x: Any, key: Any, rest: Any) -> Any:
        # The step's key in place of every stream's key (the counters count the calls).
        keyed = jax.tree.map(
            lambda a: key if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a, rest
        )
        return jnp.mean(jnp.square(nnx.merge(graphdef, params, keyed)(x)))

    return (params, rest), loss


def encoder(
    variant: str, layers: int, api: str, scan: bool = False, remat: bool = False
) -> dict[str, Any]:
    """Trace, lower and compile one encoder train step in this process."""
    import jax
    import jax.numpy as jnp
    import optax

    x = jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32)
    rest = None  # NNX: the model's other state (its random streams), not differentiated
    if api == "linen":
        model, linen_loss = _linen_model(variant, layers, scan, remat)
        params = jax.jit(lambda k: model.init(k, x, True))(jax.random.key(0))["params"]
        loss = lambda params, x, key, rest: linen_loss(params, x, key)  # noqa: E731
    else:
        (params, rest), loss = _nnx_model(variant, layers)
    opt = optax.sgd(1e-3)

    def step(params: Any, x: jax.Array, key: jax.Array, rest: Any) -> Any:
        updates, _ = opt.update(jax.grad(loss)(params, x, key, rest), opt.init(params))
        return optax.apply_updates(params, updates)

    return _timed(jax.jit(step), (params, x, jax.random.key(1), rest))


def example_step(name: str, rate: float | None) -> dict[str, Any]:
    """Trace, lower and compile a bundled example's train step at its default config."""
    import jax

    from dropmask import training

    example = _example(name)
    config = example.get_config()
    if rate is not None:
        config.rate = rate
    data = example.load_data(config)
    data_key, params_key, dropout_key = training.run_keys(config.seed)
    state = example.create_state(config, data, params_key, dropout_key)
    batch = example.train_batch(config, data, data_key, 0)
    step = example.train_step
    jitted = step if hasattr(step, "trace") else jax.jit(step)
    return _timed(jitted, (state, batch))


def _example(name: str) -> Any:
    import importlib

    bundled = name in ("digits", "digits_nnx")  # in the package, not the checkout
    module = f"dropmask.examples.{name}.train" if bundled else f"examples.{name}.train"
    return importlib.import_module(module).example


def _timed(jitted: Any, args: Sequence[Any]) -> dict[str, Any]:
    start = time.perf_counter()
    lowered = jitted.trace(*args).lower()
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    return {
        "lower_s": traced - start,
        "compile_s": done - traced,
        "hlo_lines": compiled.as_text().count("\n"),
    }


# --- the driver: fresh processes, side by side ---------------------------------------


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """One job in a fresh process (no persistent cache, default XLA flags)."""
    env = dict(os.environ, XLA_FLAGS="", JAX_ENABLE_COMPILATION_CACHE="false")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_compile", "--worker", json.dumps(job)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"compile worker {job} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def encoder_rows(
    layers: int,
    api: str,
    repeats: int,
    scan: bool = False,
    variants: Sequence[str] = VARIANTS,
    remat: bool = False,
) -> dict[str, Any]:
    """Every variant ``repeats`` times, the variants of a repeat back to back."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    job = {"layers": layers, "api": api, "scan": scan, "remat": remat}
    for _ in range(repeats):
        for v in variants:
            runs[v].append(measure({"variant": v, **job}))
    return {**job, "runs": runs}


def added_ratios(result: dict[str, Any], variant: str, what: str = "compile_s") -> dict[str, Any]:
    """``variant``'s added time over ``none`` / Flax's, best-of-repeats and per repeat."""
    runs = result["runs"]
    best = {v: min(r[what] for r in rs) for v, rs in runs.items()}
    ratio = (best[variant] - best["none"]) / (best["flax"] - best["none"])
    per_repeat = [
        (o[what] - n[what]) / (f[what] - n[what])
        for o, n, f in zip(runs[variant], runs["none"], runs["flax"], strict=True)
    ]
    return {"ratio": ratio, "per_repeat": per_repeat, "best": best}


def example_rows(names: Sequence[str], repeats: int) -> list[dict[str, Any]]:
    """Each example's step with dropout (its config's rate) and at rate 0, best of repeats."""
    rows = []
    for name in names:
        with_dropout = [measure({"example": name}) for _ in range(repeats)]
        without = [measure({"example": name, "rate": 0.0}) for _ in range(repeats)]
        rows.append(
            {
                "example": name,
                "compile_s": min(r["compile_s"] for r in with_dropout),
                "lower_s": min(r["lower_s"] for r in with_dropout),
                "compile_s_rate0": min(r["compile_s"] for r in without),
                "lower_s_rate0": min(r["lower_s"] for r in without),
            }
        )
    return rows


def markdown(results: list[dict[str, Any]], examples: list[dict[str, Any]]) -> str:
    """The compile table: best times per variant, added times against Flax's."""
    lines = [
        "| step | none | Flax | dropmask layers | dropmask layers + attention | layers / Flax "
        "(added) | layers + attention / Flax (added) | trace+lower added / Flax's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        best = added_ratios(r, "flax")["best"]
        cells = [f"{best[v]:.2f} s" if v in best else "" for v in VARIANTS]
        ratios = [f"{added_ratios(r, v)['ratio']:.2f}x" if v in best else "" for v in VARIANTS[2:]]
        last = [v for v in VARIANTS[2:] if v in best][-1]
        lower = added_ratios(r, last, "lower_s")
        scan = ", nn.scan" if r["scan"] else ", nn.remat" if r.get("remat") else ""
        lines.append(
            f"| {r['api']}, {r['layers']} layers{scan} | "
            + " | ".join(cells + ratios)
            + f" | {lower['ratio']:.2f}x ({last}) |"
        )
    if examples:
        lines += [
            "",
            "| example train step | compile (trace+lower) | at rate 0 | dropout adds |",
            "|---|---|---|---|",
        ]
        for e in examples:
            lines.append(
                f"| {e['example']} | {e['compile_s']:.2f} s ({e['lower_s']:.2f} s) | "
                f"{e['compile_s_rate0']:.2f} s ({e['lower_s_rate0']:.2f} s) | "
                f"{e['compile_s'] - e['compile_s_rate0']:+.2f} s |"
            )
    return "\n".join(lines)


def _csv(kind: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(kind(v) for v in text.split(",") if v)
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list, got {text!r}"
            ) from err

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=_csv(int), default=(12, 24))
    parser.add_argument("--apis", type=_csv(str), default=("linen", "nnx"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--examples", type=_csv(str), default=())
    args = parser.parse_args(argv)
    if args.worker:
        job = json.loads(args.worker)
        if "example" in job:
            out = example_step(job["example"], job.get("rate"))
        else:
            out = encoder(
                job["variant"],
                job["layers"],
                job["api"],
                job.get("scan", False),
                job.get("remat", False),
            )
        print(json.dumps(out))
        return 0
    results = [encoder_rows(n, api, args.repeats) for n in args.layers for api in args.apis]
    examples = example_rows(args.examples, args.repeats)
    print(markdown(results, examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
