"""Dropout on a CUDA GPU: per-pass times, achieved bandwidth, and GPU-vs-CPU mask checks.

Run on a machine with one CUDA GPU (an H200 was measured)::

    python -m benchmarks.bench_gpu --out DIR [--peak-gbps 4800] [--budget 330]

It writes ``DIR/gpu_results.json`` as it goes, so a run cut short still reports what it
finished. ``python -m benchmarks.bench_gpu --render DIR/gpu_results.json`` turns that file
into the ``gpu`` section of ``benchmarks/RESULTS.md``.

What it measures, in priority order (cases past ``--budget`` seconds are skipped):

1. Checks: the default mask on the GPU equals the one on the CPU (static and traced
   rate, gradients, ``broadcast_dims``, f16/bf16), ``vmap`` over keys equals a loop,
   eager equals ``jit``, and the compiled forward pass holds no ``conditional``.
2. Per-pass times (the slope between a loop of 2 passes and a longer one, as on CPU;
   ``_harness.Looped``) of the contestants of ``bench_dropout`` at [4096, 4096], f32
   and bf16, forward and forward+backward; achieved bandwidth counts the bytes an
   ideal dropout moves (``x`` in and ``y`` out; plus ``g`` in and ``dx`` out backward).
3. An MLP train step (``bench_train_step``: what dropout adds to a whole step).
4. The same as 2 at [8192, 8192], plus rows that force the other mask paths and time
   an experimental fused Pallas kernel (``benchmarks/_pallas_fused.py``, forward only).
5. The packed-mask generator alone, and the train-step temporary memory.
6. [1024, 1024] and [2048, 2048] with fewer contestants.
"""

from __future__ import annotations

import argparse
import json
import math
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

import dropmask
from benchmarks import _contestants, _harness
from benchmarks import bench_dropout as bd
from benchmarks._harness import Looped, per_pass_medians
from dropmask import testing

SECTION = "gpu"
REPEATS = 5
MAIN_SHAPES = ((4096, 4096), (8192, 8192))
SMALL_SHAPES = ((1024, 1024), (2048, 2048))


def extra_passes(n: int) -> int:
    """Extra passes of the long loop: about 5-10 ms of the limit on an H200."""
    return 512 if n <= 2**22 else (160 if n <= 2**24 else 48)


def forced_path(path: str) -> Callable[[jax.Array, Any], jax.Array]:
    """``dropmask.dropout`` at RATE with the mask computed by ``path`` (see
    ``dropmask.testing.PATHS``)."""
    return lambda x, key: testing.path_dropout(x, _contestants.RATE, key, path=path)


def pallas_fused(layout: str, rows: int, num_warps: int) -> Callable[[jax.Array, Any], jax.Array]:
    from benchmarks._pallas_fused import fused_dropout

    interpret = jax.default_backend() == "cpu"  # --smoke runs

    def apply(x: jax.Array, key: Any) -> jax.Array:
        words = testing.key_words(key)
        return fused_dropout(
            x,
            words,
            _contestants.KEEP,
            layout=layout,
            rows=rows,
            num_warps=num_warps,
            interpret=interpret,
        )

    return apply


def experimental(mode: str) -> list[_contestants.Contestant]:
    key = _contestants.threefry_key
    out = [
        _contestants.Contestant("forced path='per_element'", forced_path("per_element"), key),
        _contestants.Contestant("forced path='packed' (cond)", forced_path("packed"), key),
    ]
    if mode == "fwd":
        # Not the "columns" layout: its strided loads and stores make it the slowest.
        out += [
            _contestants.Contestant(
                "pallas fused, rows 256 (experimental)", pallas_fused("rows", 256, 4), key
            ),
            _contestants.Contestant(
                "pallas fused, joined 256 (experimental)", pallas_fused("joined", 256, 4), key
            ),
        ]
    return out


class Run:
    """Collects results, saving them after every step so that a cut-short run reports."""

    def __init__(self, out: Path, budget: float, peak_gbps: float) -> None:
        self.start = time.time()
        self.budget = budget
        self.path = out / "gpu_results.json"
        self.data: dict[str, Any] = {
            "peak_gbps": peak_gbps,
            "checks": [],
            "speed": [],
            "memory": [],
            "errors": [],
            "skipped": [],
        }

    def elapsed(self) -> float:
        return time.time() - self.start

    def log(self, *args: Any) -> None:
        print(f"[{self.elapsed():6.1f}s]", *args, flush=True)

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")

    def error(self, where: str) -> None:
        self.data["errors"].append(f"{where}: {traceback.format_exc()[-2000:]}")
        self.log("ERROR", self.data["errors"][-1])


def environment() -> dict[str, Any]:
    dev = jax.devices()[0]
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": f"{dev.platform}: {getattr(dev, 'device_kind', '?')}",
        "nvidia_smi": smi,
        "jax": jax.__version__,
        "flax": _harness.version("flax"),
        "equinox": _harness.version("equinox"),
        "haiku": _harness.version("haiku"),
        "python": sys.version.split()[0],
    }


# --- 1. checks ---------------------------------------------------------------------

_CONFIGS = [
    ("[4096, 4096] f32 rate 0.1", (4096, 4096), jnp.float32, 0.1, ()),
    ("[3, 5, 77] f32 rate 0.3", (3, 5, 77), jnp.float32, 0.3, ()),
    ("[8, 64] bf16 rate 0.5", (8, 64), jnp.bfloat16, 0.5, ()),
    ("[2, 33, 64] broadcast_dims=(1,) rate 0.2", (2, 33, 64), jnp.float32, 0.2, (1,)),
    ("[1000, 3] f16 rate 0.013", (1000, 3), jnp.float16, 0.013, ()),
]


def _on(device: Any, fn: Callable[..., Any], *args: Any) -> np.ndarray:
    with jax.default_device(device):
        return np.asarray(fn(*[jax.device_put(a, device) for a in args]))


def _same_on_cpu_and_gpu(name: str, x: np.ndarray, rate: float, bdims: tuple[int, ...]) -> dict:
    cpu, gpu = jax.devices("cpu")[0], jax.devices()[0]
    key = jax.random.key(7)

    def drop(x: jax.Array, k: jax.Array, r: Any) -> jax.Array:
        return dropmask.dropout(x, r, k, broadcast_dims=bdims)

    static = jax.jit(lambda x, k: drop(x, k, rate))
    traced = jax.jit(drop)
    grad = jax.jit(jax.grad(lambda x, k: jnp.sum(drop(x, k, rate).astype(jnp.float32) ** 2)))
    r = jnp.float32(rate)
    row: dict[str, Any] = {
        "check": f"GPU == CPU, {name}",
        "static rate": bool((_on(gpu, static, x, key) == _on(cpu, static, x, key)).all()),
        "traced rate": bool((_on(gpu, traced, x, key, r) == _on(cpu, traced, x, key, r)).all()),
        "gradient": bool((_on(gpu, grad, x, key) == _on(cpu, grad, x, key)).all()),
    }
    row["ok"] = all(v for k, v in row.items() if k != "check")
    return row


def checks(run: Run, big: tuple[int, int]) -> None:
    key = jax.random.key(7)
    for name, shape, dtype, rate, bdims in _CONFIGS:
        shape = big if shape == (4096, 4096) else shape
        try:
            x = np.asarray(jax.random.normal(jax.random.key(1), shape)).astype(dtype)
            row = _same_on_cpu_and_gpu(name, x, rate, bdims)
        except Exception:  # noqa: BLE001 - record and go on
            run.error(name)
            row = {"check": f"GPU == CPU, {name}", "ok": False}
        run.data["checks"].append(row)
        run.log(row)
        run.save()
    first = len(run.data["checks"])
    try:
        x = jax.random.normal(jax.random.key(2), (64, 256))
        keys = jax.random.split(key, 3)
        vmapped = np.asarray(jax.vmap(lambda k: dropmask.dropout(x, 0.1, k))(keys))
        looped = np.stack([np.asarray(dropmask.dropout(x, 0.1, k)) for k in keys])
        jitted = np.asarray(jax.jit(lambda x, k: dropmask.dropout(x, 0.1, k))(x, keys[0]))
        hlo = (
            jax.jit(lambda x, k: dropmask.dropout(x, 0.1, k))
            .lower(jnp.ones(big), key)
            .compile()
            .as_text()
        )
        run.data["checks"] += [
            {"check": "vmap over keys == loop (GPU)", "ok": bool((vmapped == looped).all())},
            {"check": "eager == jit (GPU)", "ok": bool((looped[0] == jitted).all())},
            {
                "check": "compiled forward has no conditional (GPU)",
                "ok": " conditional(" not in hlo,
                "fusions": hlo.count(" fusion("),
            },
        ]
        for shape, dtype in ((big, jnp.float32), ((512, 256), jnp.bfloat16)):
            x = jax.random.normal(jax.random.key(3), shape, dtype)
            want = np.asarray(
                jax.jit(lambda x, k: dropmask.dropout(x, _contestants.RATE, k))(x, key)
            )
            for layout in ("rows", "joined"):
                fused = jax.jit(pallas_fused(layout, 256, 4))
                run.data["checks"].append(
                    {
                        "check": f"experimental pallas {layout} == dropout, {shape} "
                        f"{jnp.dtype(dtype).name}",
                        "ok": bool((np.asarray(fused(x, key)) == want).all()),
                    }
                )
    except Exception:  # noqa: BLE001
        run.error("transform checks")
    for row in run.data["checks"][first:]:
        run.log(row)
    run.save()


# --- 2-6. speed, train step, generator and memory ------------------------------------


def time_case(
    run: Run, cs: list[_contestants.Contestant], shape: tuple[int, int], dtype_name: str, mode: str
) -> None:
    n = math.prod(shape)
    x, g = _contestants.inputs(shape, _contestants.DTYPES[dtype_name])
    extra = extra_passes(n)
    loops: dict[str, Looped] = {}
    for c in cs:
        aux = c.make_aux(x.dtype)
        try:
            if mode == "fwd":
                loop = Looped(lambda p, c=c: _contestants.looped_fwd(c, p), (x, aux), extra=extra)
            else:
                loop = Looped(
                    lambda p, c=c: _contestants.looped_fwd_bwd(c, p), (x, aux, g), extra=extra
                )
            jax.block_until_ready(loop.short_fn(*loop.args))
            loops[c.name] = loop
        except Exception:  # noqa: BLE001 - an experimental kernel may not compile
            run.error(f"{c.name} {shape} {dtype_name} {mode}")
    seconds = per_pass_medians(loops, repeats=REPEATS)
    ideal = (2 if mode == "fwd" else 4) * n * jnp.dtype(_contestants.DTYPES[dtype_name]).itemsize
    limit = seconds[_contestants.LIMIT]
    for c in cs:
        if c.name not in seconds:
            continue
        s = seconds[c.name]
        row = {
            "shape": list(shape),
            "dtype": dtype_name,
            "mode": mode,
            "contestant": c.name,
            "us_per_pass": s * 1e6,
            "passes": f"2/{2 + extra}",
            "ratio_to_limit": s / limit,
            "ideal_gbps": ideal / s / 1e9,
            "frac_of_peak": ideal / s / 1e9 / run.data["peak_gbps"],
        }
        if c.is_dropout:
            fn = _contestants.fwd_fn(c) if mode == "fwd" else _contestants.fwd_bwd_fn(c)
            out = fn(x, c.make_aux(x.dtype)) if mode == "fwd" else fn(x, c.make_aux(x.dtype), g)
            y, dx = (out, None) if mode == "fwd" else out
            row.update(_contestants.check_output(x, y, g if dx is not None else None, dx))
        run.data["speed"].append(row)
        run.log({k: row[k] for k in ("contestant", "us_per_pass", "ratio_to_limit", "ideal_gbps")})
    run.save()


def generator_alone(run: Run, shape: tuple[int, int]) -> None:
    n = math.prod(shape)
    x, _ = _contestants.inputs(shape, jnp.float32)
    limit = next(c for c in _contestants.contestants()[0] if c.name == _contestants.LIMIT)
    loops = {
        "generator": Looped(
            lambda p: _contestants.looped_mask_words(shape, p),
            (x, jax.random.key(0)),
            extra=extra_passes(n),
        ),
        _contestants.LIMIT: Looped(
            lambda p: _contestants.looped_fwd(limit, p),
            (x, limit.make_aux(x.dtype)),
            extra=extra_passes(n),
        ),
    }
    seconds = per_pass_medians(loops, repeats=REPEATS)
    row = {
        "shape": list(shape),
        "generator_us_per_pass": seconds["generator"] * 1e6,
        "limit_f32_fwd_us_per_pass": seconds[_contestants.LIMIT] * 1e6,
        "ratio": seconds["generator"] / seconds[_contestants.LIMIT],
    }
    run.data.setdefault("generator", []).append(row)
    run.log(row)
    run.save()


def train_step(run: Run, dtype_name: str, smoke: bool) -> None:
    from benchmarks import bench_train_step

    size = bench_train_step.QUICK if smoke else bench_train_step.GPU
    rows = bench_train_step.run(*size, dtype_name, extra=16, repeats=REPEATS)
    run.data.setdefault("train_step", []).append(rows)
    run.log(bench_train_step.markdown(rows))
    run.save()


def memory(run: Run) -> None:
    cs, _ = _contestants.contestants()
    base = bd.train_step_temp_bytes(None)
    per_layer = bd.MLP_BATCH * bd.MLP_WIDTH * bd.MLP_DROPOUT_LAYERS
    for c in cs:
        if c.is_dropout:
            temp = bd.train_step_temp_bytes(c)
            run.data["memory"].append(
                {
                    "contestant": c.name,
                    "temp_bytes": temp,
                    "extra_bytes_per_element_per_layer": (temp - base) / per_layer,
                }
            )
    run.data["memory"].append({"contestant": "no dropout", "temp_bytes": base})
    run.log(run.data["memory"])
    run.save()


def measure(
    out: Path,
    budget: float,
    peak_gbps: float,
    main_shapes: tuple[tuple[int, int], ...] = MAIN_SHAPES,
    small_shapes: tuple[tuple[int, int], ...] = SMALL_SHAPES,
) -> None:
    run = Run(out, budget, peak_gbps)
    run.data["environment"] = environment()
    run.log(run.data["environment"])
    run.save()
    checks(run, main_shapes[0])
    full, notes = _contestants.contestants()
    run.data["notes"] = notes
    few = [c for c in full if c.name in (_contestants.LIMIT, _contestants.FLAX, "eqx.nn.Dropout")]
    few.insert(1, full[0])  # the dropmask default
    plan: list[tuple[Any, ...]] = []
    for shape in main_shapes:
        for dtype_name in _contestants.DTYPES:
            for mode in _contestants.MODES:
                extra = experimental(mode) if shape == main_shapes[-1] else []
                plan.append(("speed", full + extra, shape, dtype_name, mode))
        if shape == main_shapes[0]:
            plan += [("train_step", "f32"), ("train_step", "bf16")]
    plan += [("generator", shape) for shape in main_shapes] + [("memory",)]
    for shape in small_shapes:
        for dtype_name in _contestants.DTYPES:
            for mode in _contestants.MODES:
                plan.append(("speed", few, shape, dtype_name, mode))
    for step in plan:
        label = " ".join(str(s) for s in step if not isinstance(s, list))
        if run.elapsed() > budget:
            run.data["skipped"].append(label)
            continue
        try:
            if step[0] == "speed":
                run.log(label)
                time_case(run, *step[1:])
            elif step[0] == "generator":
                generator_alone(run, step[1])
            elif step[0] == "train_step":
                train_step(run, step[1], smoke=main_shapes != MAIN_SHAPES)
            else:
                memory(run)
        except Exception:  # noqa: BLE001 - keep the rest of the plan
            run.error(label)
    run.log("done; skipped:", run.data["skipped"])
    run.save()


# --- rendering -------------------------------------------------------------------------


def render(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        "## GPU (`python -m benchmarks.bench_gpu`)\n",
        f"- date: {env['date_utc']}; device: {env['device']} ({env['nvidia_smi']})",
        f"- versions: jax {env['jax']}, flax {env['flax']}, equinox {env['equinox']}, "
        f"haiku {env['haiku']}, python {env['python']}",
        f"- peak bandwidth for `frac of peak`: {data['peak_gbps']:.0f} GB/s (datasheet); "
        "achieved GB/s count the bytes an ideal dropout moves (forward: read x, write y; "
        "forward+backward: also read g, write dx).",
        f"- per pass: slope between loops of 2 and more passes, median of {REPEATS} "
        "round-robin repeats; rate 0.1.\n",
    ]
    lines += [f"- {a}" for a in data.get("annotations", [])]
    lines += ["", "### Checks\n"]
    for c in data["checks"]:
        extra = {k: v for k, v in c.items() if k not in ("check", "ok")}
        lines.append(f"- {'ok' if c['ok'] else 'FAILED'}: {c['check']} {extra or ''}".rstrip())
    by_case: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in data["speed"]:
        by_case.setdefault((tuple(r["shape"]), r["dtype"], r["mode"]), []).append(r)
    for (shape, dtype, mode), rows in by_case.items():
        lines += [
            f"\n### {mode}, {dtype}, {list(shape)}\n",
            "| contestant | us/pass | x limit | GB/s | frac of peak | drop % | check |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            drop = "-" if r.get("drop_frac") is None else f"{100 * r['drop_frac']:.2f}"
            ok = "-" if r.get("ok") is None else ("ok" if r["ok"] else "FAILED")
            lines.append(
                f"| {r['contestant']} | {r['us_per_pass']:.1f} | {r['ratio_to_limit']:.2f} | "
                f"{r['ideal_gbps']:.0f} | {r['frac_of_peak']:.2f} | {drop} | {ok} |"
            )
    if data.get("train_step"):
        from benchmarks import bench_train_step

        lines.append("\n### Train step\n")
        lines += [bench_train_step.markdown(rows) for rows in data["train_step"]]
    if data.get("generator"):
        lines += ["\n### Packed-mask generator alone (rate 0.1, 16 bits per element)\n"]
        for g in data["generator"]:
            lines.append(
                f"- {g['shape']}: {g['generator_us_per_pass']:.1f} us per pass, "
                f"{g['ratio']:.2f}x the f32 forward limit ({g['limit_f32_fwd_us_per_pass']:.1f} us)"
            )
    if data["memory"]:
        lines += ["\n### Train-step temporary memory (MLP, 2 dropout layers, [1024, 1024])\n"]
        for m in data["memory"]:
            per = m.get("extra_bytes_per_element_per_layer")
            tail = "" if per is None else f", {per:.3f} B per element per layer"
            lines.append(f"- {m['contestant']}: {m['temp_bytes']} B{tail}")
    if data["skipped"]:
        lines.append("\nSkipped (time budget): " + "; ".join(data["skipped"]))
    if data["errors"]:
        lines.append(f"\n{len(data['errors'])} errors, first lines:")
        lines += ["- " + e.splitlines()[0] for e in data["errors"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks", help="folder for gpu_results.json")
    parser.add_argument("--peak-gbps", type=float, default=4800.0, help="H200 datasheet: 4800")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds before skipping")
    parser.add_argument("--render", help="a gpu_results.json to write into RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes; runs on CPU too")
    args = parser.parse_args(argv)
    if args.render:
        from benchmarks._harness import write_section

        data = json.loads(Path(args.render).read_text())
        write_section(Path(args.out) / "RESULTS.md", SECTION, render(data))
        return 0
    if jax.default_backend() != "gpu" and not args.smoke:
        raise SystemExit(
            f"bench_gpu needs a CUDA GPU; jax's default backend is {jax.default_backend()!r} "
            "(--smoke runs tiny shapes anywhere)."
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        measure(out, args.budget, args.peak_gbps, ((256, 256), (256, 512)), ((128, 256),))
    else:
        measure(out, args.budget, args.peak_gbps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
