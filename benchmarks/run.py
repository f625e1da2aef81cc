"""``make bench`` and ``make bench-full``: run the benchmarks, print them, record them.

``python -m benchmarks.run [--quick] [--strict]`` (``make bench``) measures every target
(``benchmarks/targets.py``) and ends with one table of target / measured / status,
which replaces the ``targets`` section of ``<out>/RESULTS.md``.

``python -m benchmarks.run --full`` (``make bench-full``) runs the full tables instead:
dropout at every size and contestant (``bench_dropout.py``), masking
(``bench_masking.py``) and the MLP train step (``bench_train_step.py``), into the
``bench`` and ``train-step`` sections. Other sections (``make rngtest``'s, the GPU's)
are kept.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks._harness import environment, environment_markdown, write_section

BENCH_SECTION = "bench"


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


def full(args: argparse.Namespace, env: dict[str, Any], out: Path) -> None:
    """The full tables (``make bench-full``)."""
    from benchmarks import bench_dropout, bench_train_step

    print("running bench_dropout ...", flush=True)
    dropout = bench_dropout.run(quick=args.quick, peak_gbps=args.peak_gbps)
    print(dropout["markdown"])
    print("running bench_masking ...", flush=True)
    masking_rows, masking_md = run_masking(args.quick)
    print(masking_md)
    print("running bench_train_step ...", flush=True)
    step_size = bench_train_step.QUICK if args.quick else bench_train_step.CPU
    step_rows = bench_train_step.run(*step_size)
    print(bench_train_step.markdown(step_rows))
    env["wall_seconds"] = time.time() - env.pop("start")
    env["load_average_at_end"] = os.getloadavg()
    body = (
        "## Benchmarks (`make bench-full`)\n\n"
        + environment_markdown(env)
        + "\nTimings are medians of round-robin repeats on a shared machine; re-run for "
        "final numbers. Ratios compare contestants measured in the same run.\n\n"
        + "## Dropout\n\n"
        + dropout["markdown"]
        + "\n## Masking\n\n"
        + masking_md
    )
    write_section(out / "RESULTS.md", BENCH_SECTION, body)
    step_body = "## Train step (`make bench-full`)\n\n" + environment_markdown(env) + "\n"
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


def targets(args: argparse.Namespace, env: dict[str, Any], out: Path) -> int:
    """Every target in one table (``make bench``); 1 if one fails and ``--strict``."""
    from benchmarks import bench_compile
    from benchmarks import targets as t

    size = t.QUICK if args.quick else t.FULL
    measured, compile_table = t.run(size)
    env["wall_seconds"] = time.time() - env.pop("start")
    env["load_average_at_end"] = os.getloadavg()
    table = t.markdown(measured, size)
    body = "## Targets (`make bench`)\n\n" + environment_markdown(env) + "\n" + table
    write_section(out / "RESULTS.md", t.SECTION, body, first=True)
    compile_body = (
        "## Compile time (`make bench`)\n\n"
        + environment_markdown(env)
        + "\n"
        + bench_compile.__doc__.split("\n\n")[1].replace("\n", " ")
        + "\n\n"
        + compile_table
        + "\n"
    )
    write_section(out / "RESULTS.md", "compile", compile_body)
    print("\n" + table)
    print(f"wrote the targets section of {out / 'RESULTS.md'}")
    failures = t.failed(measured)
    if failures and args.strict:
        print(f"--strict: {len(failures)} target(s) failed", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="dropmask benchmarks (make bench)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--full", action="store_true", help="the full tables (make bench-full)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target fails")
    parser.add_argument("--out", default="benchmarks", help="folder for RESULTS.md")
    parser.add_argument(
        "--peak-gbps",
        type=float,
        default=None,
        help="GPU peak memory bandwidth in GB/s (H200: 4800), for --full's bandwidth columns",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(" ".join(["python -m benchmarks.run", *argv]))
    print(environment_markdown(env), flush=True)
    env["start"] = time.time()
    if args.full:
        full(args, env, out)
        return 0
    return targets(args, env, out)


if __name__ == "__main__":
    sys.exit(main())
