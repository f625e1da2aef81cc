"""``make bench``: runs the dropmask benchmarks and writes RESULTS.md and results.json.

Usage: ``python -m benchmarks.run [--quick] [--out benchmarks] [--peak-gbps 4800]``.

Runs ``benchmarks/bench_dropout.py`` and, when it exists, ``benchmarks/bench_masking.py``
(``run(quick) -> list[dict]``), prints their tables, and replaces the benchmark section of
``<out>/RESULTS.md`` (other sections, such as ``make rngtest``'s, are kept).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import jax

BENCH_SECTION = "bench"


def write_section(path: Path, name: str, body: str) -> None:
    """Replaces the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in ``path``.

    The section is appended if absent; the rest of the file is left as it was.
    """
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}\n"
    text = path.read_text() if path.exists() else "# dropmask benchmark results\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return "not installed"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=False
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(argv: list[str]) -> dict[str, Any]:
    """Where and how the numbers were measured."""
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    dev = jax.devices()[0]
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "load_average_at_start": os.getloadavg(),
        "backend": jax.default_backend(),
        "device": f"{dev.platform}: {getattr(dev, 'device_kind', '?')}",
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "equinox": _version("equinox"),
        "haiku": _version("haiku"),
        "optax": _version("optax"),
        "dropmask": _version("dropmask"),
        "python": platform.python_version(),
        "git_commit": (_git("rev-parse", "--short", "HEAD") or "?") + (" (dirty)" if dirty else ""),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "command": " ".join(["python -m benchmarks.run", *argv]),
    }


def environment_markdown(env: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in env["load_average_at_start"])
    return (
        f"- date: {env['date_utc']}\n"
        f"- machine: {env['cpu_model']}, {env['cpu_count']} cores "
        f"({env['cpus_usable']} usable), load average at start {load}\n"
        f"- backend: {env['device']}\n"
        f"- versions: jax {env['jax']}, jaxlib {env['jaxlib']}, flax {env['flax']}, "
        f"equinox {env['equinox']}, haiku {env['haiku']}, optax {env['optax']}, "
        f"dropmask {env['dropmask']} @ {env['git_commit']}, python {env['python']}\n"
        f"- command: `XLA_FLAGS={env['xla_flags']!r} {env['command']}`\n"
    )


def run_masking(quick: bool) -> tuple[list[dict[str, Any]] | None, str]:
    """Runs ``benchmarks/bench_masking.py`` if present; returns (rows, markdown)."""
    if importlib.util.find_spec("benchmarks.bench_masking") is None:
        return None, "bench_masking.py not present; skipped.\n"
    try:
        bench_masking = importlib.import_module("benchmarks.bench_masking")
        rows = list(bench_masking.run(quick))
    except Exception:  # noqa: BLE001 - report another benchmark's failure, keep ours
        return None, "bench_masking.run failed:\n\n```\n" + traceback.format_exc() + "```\n"
    cols = ["name", "anchor", "n_elements", "dropmask_ms", "anchor_ms", "ratio", "ratio_quartiles"]
    lines = [
        "Per pass (the slope between a short and a long loop of passes, as for dropout); "
        "ratio = dropmask / anchor, the median of back-to-back pairs; below 1 is faster.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return rows, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="dropmask benchmarks (make bench)")
    parser.add_argument("--quick", action="store_true", help="smallest size, few repeats")
    parser.add_argument("--out", default="benchmarks", help="folder for RESULTS.md/results.json")
    parser.add_argument(
        "--peak-gbps",
        type=float,
        default=None,
        help="GPU peak memory bandwidth in GB/s (H200: 4800), for achieved-bandwidth columns",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from benchmarks import bench_dropout

    env = environment(argv)
    print(environment_markdown(env))
    print("running bench_dropout ...", flush=True)
    dropout = bench_dropout.run(quick=args.quick, peak_gbps=args.peak_gbps)
    print(dropout["markdown"])
    print("running bench_masking ...", flush=True)
    masking_rows, masking_md = run_masking(args.quick)
    print(masking_md)
    print("running bench_train_step ...", flush=True)
    from benchmarks import bench_train_step

    step_size = bench_train_step.QUICK if args.quick else bench_train_step.CPU
    step_rows = bench_train_step.run(*step_size)
    print(bench_train_step.markdown(step_rows))

    body = (
        "## Benchmarks (`make bench`)\n\n"
        + environment_markdown(env)
        + "\nTimings are medians of round-robin repeats on a shared machine; re-run for "
        "final numbers. Ratios compare contestants measured in the same run.\n\n"
        + "## Dropout\n\n"
        + dropout["markdown"]
        + "\n## Masking\n\n"
        + masking_md
    )
    write_section(out / "RESULTS.md", BENCH_SECTION, body)
    step_body = "## Train step (`make bench`)\n\n" + environment_markdown(env) + "\n"
    write_section(
        out / "RESULTS.md", "train-step", step_body + bench_train_step.markdown(step_rows)
    )
    payload = {
        "environment": env,
        "dropout": {k: v for k, v in dropout.items() if k != "markdown"},
        "masking": masking_rows,
        "train_step": step_rows,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {out / 'RESULTS.md'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
