"""Dropout on a TPU: TPU = CPU masks, per-call times against ``x * c`` and Flax, a train step.

Run on a machine with a TPU (the device tool's v5e), flax installed::

    python -m benchmarks.bench_tpu --out DIR [--quick]

It writes ``DIR/tpu_results.json`` as it goes, so a run cut short still reports what it
finished; ``python -m benchmarks.bench_tpu --render DIR/tpu_results.json`` turns it into
the ``tpu`` section of ``benchmarks/RESULTS.md``. What it measures, in order:

1. Checks: outputs of ``dropmask.dropout`` (and its gradient, ``keep_mask``, a traced
   rate, ``broadcast_dims``, ``vmap`` over keys, bf16/f16/complex, shapes the kernel
   serves and shapes that fall back) equal a CPU process's outputs for the same keys
   bit for bit; the CPU process is this module with ``--reference`` under
   ``JAX_PLATFORMS=cpu``.
2. Per call at [8192, 8192], f32 and bf16, forward and forward + backward in one
   program: ``x * c``, Flax's ``nn.Dropout`` under the threefry, rbg and unsafe_rbg
   key impls, dropmask's default (the TPU kernel) and dropmask's XLA per-element path.
   A call's time is the slope between loops of 2 and 12 calls (a run-time trip count,
   so one compilation serves both), medians of ``REPEATS``.
3. A 4-layer Flax Transformer train step ([16, 1024, 1024], 16 heads, MLP 4096;
   ``bench_transformer_step``'s layer), f32 and bf16: without dropout, with Flax's
   dropout, and Flax's model unchanged under ``swap_dropout(attention=False)``: step
   time (paired per repeat), XLA's temporaries and compile time of the looped step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dropmask
from benchmarks._harness import environment, environment_markdown, markdown_table, write_section
from dropmask import testing
from dropmask.cli import OneLineParser

SECTION = "tpu"
REPEATS = 15
SHAPE = (8192, 8192)
RATE = 0.1
STEP = {"batch": 16, "length": 1024, "width": 1024, "heads": 16, "mlp_dim": 4096, "layers": 4}
QUICK_STEP = {"batch": 2, "length": 64, "width": 128, "heads": 2, "mlp_dim": 256, "layers": 2}
IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


# --- 1. checks ------------------------------------------------------------------------


def _check_cases() -> dict[str, Callable[[], Any]]:
    """Named computations whose outputs must be equal on the TPU and on a CPU."""
    key = jax.random.key(11)

    def ones(shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jnp.ones(shape, dtype)

    def grad_of(shape: tuple[int, ...]) -> jax.Array:
        # Small integers: a cotangent that every backend computes exactly.
        w = (jnp.arange(np.prod(shape), dtype=jnp.float32) % 7 - 3).reshape(shape)
        loss = lambda x: jnp.sum(dropmask.dropout(x, RATE, key) * w)  # noqa: E731
        return jax.grad(loss)(jnp.ones(shape))

    cases: dict[str, Callable[[], Any]] = {}
    for shape in [(8, 256, 1024), (4, 64, 5120), (32, 128), (3, 100), (7, 96), (2, 1, 4096)]:
        for dtype in ("float32", "bfloat16"):
            cases[f"dropout {shape} {dtype}"] = lambda s=shape, d=dtype: dropmask.dropout(
                ones(s, d), RATE, key
            )
    cases["dropout f16 (64, 1024)"] = lambda: dropmask.dropout(
        ones((64, 1024), "float16"), RATE, key
    )
    cases["dropout complex64 (64, 1024)"] = lambda: dropmask.dropout(
        ones((64, 1024), "complex64"), RATE, key
    )
    cases["traced rate 0.3 (8, 256, 1024)"] = lambda: jax.jit(
        lambda r: dropmask.dropout(ones((8, 256, 1024)), r, key)
    )(jnp.float32(0.3))
    cases["broadcast_dims=(1,) (8, 256, 1024)"] = lambda: dropmask.dropout(
        ones((8, 256, 1024)), RATE, key, broadcast_dims=(1,)
    )
    cases["keep_mask (64, 2048)"] = lambda: dropmask.keep_mask(key, (64, 2048), RATE)
    cases["vmap over keys (4, 64, 1024)"] = lambda: jax.vmap(
        lambda k: dropmask.dropout(ones((64, 1024)), RATE, k)
    )(jax.random.split(key, 4))
    cases["grad (8, 256, 1024)"] = lambda: grad_of((8, 256, 1024))
    cases["grad (3, 100)"] = lambda: grad_of((3, 100))
    return cases


def _bits(x: Any) -> np.ndarray:
    """An output as unsigned integers of its width: ``.npz`` keeps no bfloat16, and bits
    compare NaN and -0.0 exactly."""
    x = np.asarray(x)
    return x.view(f"uint{8 * x.dtype.itemsize}") if x.dtype != bool else x


def reference(path: str) -> None:
    """The check cases' outputs on this process's backend, as bits, saved to ``path``."""
    out = {name: _bits(fn()) for name, fn in _check_cases().items()}
    np.savez(path, **{str(i): v for i, v in enumerate(out.values())}, names=np.array(list(out)))


def checks(out_dir: Path) -> dict[str, Any]:
    """Each case's output on the TPU, by the default path and by the TPU kernel, against
    a CPU process's: ``{case: {"default": same bits, "kernel": same bits}}``."""
    ref_path = out_dir / "cpu_reference.npz"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "benchmarks.bench_tpu", "--reference", str(ref_path)]
    subprocess.run(cmd, check=True, env=env)
    ref = np.load(ref_path)
    want = {name: ref[str(i)] for i, name in enumerate(ref["names"])}
    results: dict[str, Any] = {name: {} for name in want}
    for way in ("default", "kernel"):
        with testing.tpu_kernels() if way == "kernel" else contextlib.nullcontext():
            for name, fn in _check_cases().items():
                got = _bits(fn())
                same = got.shape == want[name].shape and np.array_equal(got, want[name])
                results[name][way] = bool(same)
    return results


# --- 2. per call ----------------------------------------------------------------------


def _slope(run: Callable[[int], Any], reps: int) -> float:
    """Milliseconds per call: the slope between 2 and 12 calls, median of ``reps``."""

    def timed(n: int) -> float:
        t = time.perf_counter()
        jax.block_until_ready(run(n))
        return time.perf_counter() - t

    short = [timed(2) for _ in range(reps)]
    long = [timed(12) for _ in range(reps)]
    return (float(np.median(long)) - float(np.median(short))) / 10 * 1e3


def _looped(f: Callable[..., Any], *args: Any) -> Callable[[int], Any]:
    """``n -> f`` applied ``n`` times to its own output, one compiled loop."""
    loop = jax.jit(lambda n, *a: lax.fori_loop(0, n, lambda i, c: f(*c), a))
    return lambda n: loop(jnp.int32(n), *args)


def _flax_dropout(impl: str) -> Callable[[jax.Array], jax.Array]:
    import flax.linen as nn

    key = jax.random.key(3, impl=impl)
    layer = nn.Dropout(RATE, deterministic=False)
    return lambda x: layer.apply({}, x, rngs={"dropout": key})


DEFAULT, KERNEL = "dropmask (default: XLA per-element path)", "dropmask, TPU kernel"


def per_call_contestants() -> dict[str, Callable[[jax.Array], jax.Array]]:
    """The contestants; ``KERNEL`` is ``DEFAULT`` traced inside ``testing.tpu_kernels()``."""
    key = jax.random.key(3)
    dropout = lambda x: dropmask.dropout(x, RATE, key)  # noqa: E731
    out: dict[str, Callable[[jax.Array], jax.Array]] = {
        "x * c": lambda x: x * jnp.asarray(1.0 / (1 - RATE), x.dtype),
        DEFAULT: dropout,
        KERNEL: dropout,
    }
    for impl in IMPLS:
        out[f"flax {impl}"] = _flax_dropout(impl)
    return out


def _way(name: str) -> Any:
    """The context a contestant is traced in."""
    return testing.tpu_kernels() if KERNEL in name else contextlib.nullcontext()


def per_call_rows(shape: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    rows = []
    for dtype in ("float32", "bfloat16"):
        x = jax.random.normal(jax.random.key(0), shape, dtype)
        g = jax.random.normal(jax.random.key(1), shape, dtype)
        for name, f in per_call_contestants().items():

            def both(x: jax.Array, g: jax.Array, f: Callable[..., Any] = f) -> Any:
                y, vjp = jax.vjp(f, x)
                return y, vjp(g)[0]

            with _way(name):
                fwd = _slope(_looped(lambda x, f=f: (f(x),), x), reps)
                fwd_bwd = _slope(_looped(both, x, g), reps)
            rows.append({"dtype": dtype, "name": name, "forward_ms": fwd, "fwd_bwd_ms": fwd_bwd})
            print(rows[-1], flush=True)
    return rows


# --- 3. train step --------------------------------------------------------------------


def step_rows(
    size: dict[str, int],
    reps: int,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    skip: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    import flax.linen as nn

    from benchmarks import bench_transformer_step as ts
    from benchmarks.bench_swap import swapped

    class Encoder(nn.Module):
        rate: float
        dtype: Any

        @nn.compact
        def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
            for _ in range(size["layers"]):
                x = ts.EncoderLayer(ts.FLAX, self.rate, size["heads"], size["mlp_dim"], self.dtype)(
                    x, deterministic
                )
            return x

    rows = []
    for dtype in dtypes:
        shape = (size["batch"], size["length"], size["width"])
        x = jax.random.normal(jax.random.key(0), shape, dtype)
        params = Encoder(0.0, dtype).init(jax.random.key(1), x, True)["params"]
        flax_step = ts.step_fn(Encoder(RATE, dtype))  # pyright: ignore[reportArgumentType]
        steps = {
            "no dropout": ts.step_fn(Encoder(0.0, dtype)),  # pyright: ignore[reportArgumentType]
            "flax dropout": flax_step,
            "swap_dropout(attention=False)": swapped(flax_step, attention=False),
            f"swap_dropout(attention=False), {KERNEL}": swapped(flax_step, attention=False),
        }
        steps = {name: step for name, step in steps.items() if name not in skip}
        compiled, stats = {}, {}
        for name, step in steps.items():
            run = lambda n, p, x, k, step=step: lax.fori_loop(  # noqa: E731
                0, n, lambda i, p: step(p, x, jax.random.fold_in(k, i)), p
            )
            with _way(name):
                t = time.perf_counter()
                exe = jax.jit(run).lower(jnp.int32(2), params, x, jax.random.key(2)).compile()
                compile_s = time.perf_counter() - t
            temp = int(getattr(exe.memory_analysis(), "temp_size_in_bytes", 0))
            compiled[name] = exe
            stats[name] = {"compile_s": compile_s, "temp_bytes": temp, "ms": []}
            print(dtype, name, stats[name], flush=True)
        for r in range(reps):
            for name in list(steps)[:: 1 if r % 2 == 0 else -1]:
                exe = compiled[name]
                times = {}
                for n in (2, 6):
                    t = time.perf_counter()
                    jax.block_until_ready(exe(jnp.int32(n), params, x, jax.random.key(2)))
                    times[n] = time.perf_counter() - t
                stats[name]["ms"].append((times[6] - times[2]) / 4 * 1e3)
        for name, s in stats.items():
            rows.append(
                {
                    "dtype": dtype,
                    "name": name,
                    "step_ms": float(np.median(s["ms"])),
                    "compile_s": s["compile_s"],
                    "temp_mib": s["temp_bytes"] / 2**20,
                }
            )
            print(rows[-1], flush=True)
    return rows


# --- driver ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the suite")
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    parser.add_argument("--render", type=Path, help="write RESULTS.md's tpu section from this")
    args = parser.parse_args(argv)
    if args.reference:
        reference(args.reference)
        return 0
    if args.render:
        try:
            result = json.loads(args.render.read_text())
        except (OSError, ValueError) as err:
            parser.error(f"--render must name a tpu_results.json this script wrote: {err}")
        write_section(Path(__file__).with_name("RESULTS.md"), SECTION, render(result))
        return 0
    if jax.default_backend() != "tpu" and not args.quick:
        parser.error(
            f"bench_tpu needs a TPU; jax's default backend is {jax.default_backend()!r} "
            "(--quick runs small sizes anywhere)"
        )
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "tpu_results.json"
    result: dict[str, Any] = {"environment": environment("python -m benchmarks.bench_tpu")}

    def save() -> None:
        result["environment"]["wall_seconds"] = time.perf_counter() - start
        path.write_text(json.dumps(result, indent=1))

    reps = 3 if args.quick else REPEATS
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("checks", lambda: checks(args.out)),
        ("per_call", lambda: per_call_rows((256, 1024) if args.quick else SHAPE, reps)),
        ("step", lambda: step_rows(QUICK_STEP if args.quick else STEP, 3 if args.quick else 5)),
    ]
    for name, part in parts:
        try:
            result[name] = part()
        except Exception:  # noqa: BLE001 - a part that fails is reported, the rest still runs
            result[name + "_error"] = traceback.format_exc()[-3000:]
            print(result[name + "_error"], flush=True)
        save()
    return 0


# --- RESULTS.md -----------------------------------------------------------------------

TARGETS = {  # (dtype, pass): most a dropmask row may take of x * c's time
    ("float32", "forward_ms"): 1.25,
    ("float32", "fwd_bwd_ms"): 1.3,
    ("bfloat16", "forward_ms"): 1.5,
    ("bfloat16", "fwd_bwd_ms"): 1.5,
}


def render(result: dict[str, Any]) -> str:
    """RESULTS.md's TPU section from ``tpu_results.json``'s contents."""
    env = result["environment"]
    lines = ["## TPU", "", environment_markdown(env)]
    checks_ = result.get("checks", {})
    for way in ("default", "kernel"):
        same = {k: v[way] for k, v in checks_.items() if isinstance(v, dict) and way in v}
        if same:
            bad = [k for k, ok in same.items() if not ok]
            lines.append(
                f"Checks ({way} path): {len(same) - len(bad)} of {len(same)} outputs equal a "
                "CPU process's bit for bit" + (f"; differ: {', '.join(bad)}" if bad else "") + ".\n"
            )
    rows = result.get("per_call", [])
    if rows:
        table = []
        for dtype in ("float32", "bfloat16"):
            base = {r["name"]: r for r in rows if r["dtype"] == dtype}
            if "x * c" not in base:
                continue
            ref = base["x * c"]
            flax_best = {
                k: min(base[f"flax {i}"][k] for i in IMPLS) for k in ("forward_ms", "fwd_bwd_ms")
            }
            for name, r in base.items():
                row = {"dtype": dtype, "name": name}
                for k in ("forward_ms", "fwd_bwd_ms"):
                    row[k] = r[k]
                    row[k + "_x"] = r[k] / ref[k]
                    row[k + "_flax"] = r[k] / flax_best[k]
                if name in (DEFAULT, KERNEL):
                    row["target"] = ", ".join(
                        f"{'fwd' if k == 'forward_ms' else 'fwd+bwd'} <= {TARGETS[(dtype, k)]}x: "
                        + ("met" if r[k] / ref[k] <= TARGETS[(dtype, k)] else "missed")
                        for k in ("forward_ms", "fwd_bwd_ms")
                    )
                table.append(row)
        lines.append(f"Per call at {list(SHAPE)}, rate {RATE}:\n")
        lines.append(
            markdown_table(
                table,
                [
                    ("dtype", "dtype"),
                    ("contestant", "name"),
                    ("forward ms", "forward_ms:.3f"),
                    ("/ x * c", "forward_ms_x:.2f"),
                    ("/ Flax's fastest", "forward_ms_flax:.2f"),
                    ("fwd+bwd ms", "fwd_bwd_ms:.3f"),
                    ("/ x * c", "fwd_bwd_ms_x:.2f"),
                    ("/ Flax's fastest", "fwd_bwd_ms_flax:.2f"),
                    ("target", "target"),
                ],
            )
        )
    steps = result.get("step", [])
    if steps:
        table = []
        for dtype in ("float32", "bfloat16"):
            base = {r["name"]: r for r in steps if r["dtype"] == dtype}
            if "no dropout" not in base:
                continue
            zero = base["no dropout"]
            for name, r in base.items():
                added = r["compile_s"] - zero["compile_s"]
                timed = r.get("step_ms") is not None
                table.append(
                    {
                        **r,
                        "ratio": r["step_ms"] / zero["step_ms"] if timed else None,
                        "added_compile_s": added if name != "no dropout" else None,
                    }
                )
        s = STEP
        lines.append(
            f"\n{s['layers']}-layer Flax Transformer train step [{s['batch']}, {s['length']}, "
            f"{s['width']}], {s['heads']} heads, MLP {s['mlp_dim']}, rate {RATE}:\n"
        )
        lines.append(
            markdown_table(
                table,
                [
                    ("dtype", "dtype"),
                    ("step", "name"),
                    ("ms", "step_ms:.1f"),
                    ("/ no dropout", "ratio:.3f"),
                    ("temporaries MiB", "temp_mib:.0f"),
                    ("compile s", "compile_s:.1f"),
                    ("compile s added", "added_compile_s:.1f"),
                ],
            )
        )
    lines.extend(f"\n{note}" for note in result.get("notes", []))
    for key in ("checks_error", "per_call_error", "step_error"):
        if key in result:
            lines.append(f"\n{key}: `{result[key].strip().splitlines()[-1]}`\n")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
