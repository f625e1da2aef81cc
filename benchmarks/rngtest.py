"""``make rngtest``: a bounded dieharder battery on dropmask's raw mask bit stream.

Dumps ``dropmask.testing.random_bits(jax.random.key(seed), (n,))`` (uint32,
little-endian: the Threefry-4x32-13 blocks that masks are cut from, at consecutive
counters under one key) to a file and runs a fixed list of dieharder tests on it with ``-g 201``
(file_input_raw), each as its own dieharder process reading the file from the start.
With ``--reference`` the same battery runs on ``jax.random.bits`` (threefry) for
comparison. Results replace the ``rngtest`` section of ``benchmarks/RESULTS.md``.

The file must outlast every test: a test that reads past its end has the file rewound
(reused data), which dieharder reports and this script marks as INVALID rather than
passing it. ``-Y 1`` (resolve ambiguity) reruns a WEAK test with 100 more psamples.

Usage: ``python -m benchmarks.rngtest [--reference] [--quick] [--jobs 2] [--words N]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._harness import cpu_model, write_section

SECTION = "rngtest"
DEFAULT_WORDS = 1 << 29  # 2 GiB: the largest test here (opso, squeeze) reads ~1 GiB


@dataclasses.dataclass(frozen=True)
class Test:
    """One dieharder invocation: ``-d number`` plus extra arguments."""

    number: int
    name: str
    args: tuple[str, ...] = ()
    resolve: bool = True  # -Y 1; off where a rerun would need far more data than we have


# Roughly longest first, so two workers pack well. Seconds are single-core wall times
# seen on this project's 2-core AMD EPYC machine; MB is data read.
BATTERY = (
    Test(7, "diehard_dna"),  # ~100 s, ~300 MB
    Test(102, "sts_serial"),  # ~55 s
    Test(17, "marsaglia_tsang_gcd", ("-p", "20"), resolve=False),  # ~45 s, 80 MB/psample
    Test(2, "diehard_rank_32x32"),  # ~40 s, ~700 MB
    Test(101, "sts_runs"),  # ~30 s
    Test(202, "rgb_permutations"),  # ~25 s
    Test(200, "rgb_bitdist", ("-n", "8")),  # ~20 s
    Test(203, "rgb_lagged_sum"),  # ~15 s
    Test(204, "rgb_kstest_test"),  # ~10 s
    Test(1, "diehard_operm5"),  # ~7 s
    Test(13, "diehard_squeeze"),  # ~6 s, ~1 GB
    Test(5, "diehard_opso"),  # ~5 s, ~1 GB
    Test(200, "rgb_bitdist", ("-n", "4")),
    Test(200, "rgb_bitdist", ("-n", "2")),
    Test(200, "rgb_bitdist", ("-n", "1")),
    Test(9, "diehard_count_1s_byt"),
    Test(3, "diehard_rank_6x8"),
    Test(6, "diehard_oqso"),
    Test(12, "diehard_3dsphere"),
    Test(16, "diehard_craps"),
    Test(10, "diehard_parking_lot"),
    Test(0, "diehard_birthdays"),
    Test(4, "diehard_bitstream"),
    Test(8, "diehard_count_1s_str"),
    Test(11, "diehard_2dsphere"),
    Test(15, "diehard_runs"),
    Test(100, "sts_monobit"),
)
QUICK_BATTERY = (
    Test(0, "diehard_birthdays"),
    Test(4, "diehard_bitstream"),
    Test(100, "sts_monobit"),
    Test(200, "rgb_bitdist", ("-n", "2")),
)

_RESULT = re.compile(
    r"^\s*(?P<test>\w+)\|\s*(?P<ntup>\d+)\|\s*(?P<tsamples>\d+)\|\s*(?P<psamples>\d+)\|"
    r"\s*(?P<p>[0-9.eE+-]+)\|\s*(?P<assessment>\w+)\s*$"
)
_REWOUND = re.compile(r"was rewound (\d+) times")


# --- streams -----------------------------------------------------------------------


def dropmask_bits() -> Callable[[jax.Array, int], jax.Array]:
    """dropmask's generator: its raw stream, from the testing hook."""
    from dropmask import testing

    fn = jax.jit(testing.random_bits, static_argnums=1)  # eager would run op by op
    return lambda key, n: fn(key, (n,))


def threefry_bits() -> Callable[[jax.Array, int], jax.Array]:
    fn = jax.jit(lambda key, n: jax.random.bits(key, (n,), jnp.uint32), static_argnums=1)
    return fn


STREAMS: dict[str, tuple[str, Callable[[], Callable[[jax.Array, int], jax.Array]]]] = {
    "dropmask": ("dropmask.testing.random_bits(key, (n,))", dropmask_bits),
    "threefry": ("jax.random.bits(key, (n,), uint32) [threefry2x32]", threefry_bits),
}


def dump(stream: str, path: Path, words: int, seed: int) -> float:
    """Writes ``words`` uint32 of ``stream`` for ``jax.random.key(seed)``; returns seconds."""
    start = time.perf_counter()
    bits = STREAMS[stream][1]()(jax.random.key(seed), words)
    arr = np.asarray(jax.block_until_ready(bits))
    if arr.dtype != np.uint32 or arr.shape != (words,):
        raise SystemExit(f"{stream}: expected uint32[{words}], got {arr.dtype}{list(arr.shape)}")
    arr.astype("<u4", copy=False).tofile(path)
    return time.perf_counter() - start


# --- dieharder -------------------------------------------------------------------------


def dieharder_version() -> str:
    out = subprocess.run(["dieharder", "-l"], capture_output=True, text=True, check=False)
    match = re.search(r"dieharder version (\S+)", out.stdout)
    return match.group(1) if match else "?"


def run_test(test: Test, path: Path, timeout: float) -> dict[str, Any]:
    """Runs one dieharder test on ``path``; returns its parsed final p-values."""
    cmd = ["dieharder", "-g", "201", "-f", str(path), "-d", str(test.number), *test.args]
    if test.resolve:
        cmd += ["-Y", "1"]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        text, error = out.stdout + out.stderr, None if out.returncode == 0 else out.returncode
    except subprocess.TimeoutExpired as err:
        text, error = str(err.stdout or ""), f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    lines = [m.groupdict() for m in map(_RESULT.match, text.splitlines()) if m]
    rewound = max((int(n) for n in _REWOUND.findall(text)), default=0)
    # With -Y 1 a WEAK test is rerun with more psamples and all its statistics are
    # printed again; the lines with the most psamples are the final ones.
    final_psamples = max((int(r["psamples"]) for r in lines), default=0)
    first = [r for r in lines if int(r["psamples"]) == min(int(x["psamples"]) for x in lines)]
    final = [r for r in lines if int(r["psamples"]) == final_psamples]
    rows = []
    for i, r in enumerate(final):
        assessment = r["assessment"]
        initially = first[i]["assessment"] if i < len(first) else assessment
        if initially == assessment:
            initially = None
        if rewound:
            assessment = f"INVALID (file rewound {rewound}x)"
        rows.append(
            {
                "test": r["test"],
                "ntup": int(r["ntup"]),
                "psamples": int(r["psamples"]),
                "p": float(r["p"]),
                "assessment": assessment,
                "first_assessment": initially,
            }
        )
    if not rows:
        rows.append(
            {
                "test": test.name,
                "ntup": None,
                "psamples": None,
                "p": None,
                "assessment": f"ERROR ({error or 'no result lines'})",
                "first_assessment": None,
            }
        )
    return {"test": test, "cmd": " ".join(cmd), "seconds": seconds, "rows": rows}


def run_battery(
    files: dict[str, Path], battery: tuple[Test, ...], jobs: int, timeout: float
) -> dict[str, list[dict[str, Any]]]:
    """Runs every test on every stream file, ``jobs`` dieharder processes at a time."""
    work = [(stream, test) for test in battery for stream in files]
    results: dict[str, list[dict[str, Any]]] = {stream: [] for stream in files}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(run_test, test, files[stream], timeout): (stream, test)
            for stream, test in work
        }
        for fut in concurrent.futures.as_completed(futures):
            stream, test = futures[fut]
            res = fut.result()
            summary = ", ".join(f"{r['p']}:{r['assessment']}" for r in res["rows"][:3])
            extra = " ..." if len(res["rows"]) > 3 else ""
            print(
                f"  [{stream}] {test.name} {' '.join(test.args)} "
                f"({res['seconds']:.0f} s): {summary}{extra}",
                flush=True,
            )
            results[stream].append(res)
    order = {(t.number, t.args): i for i, t in enumerate(battery)}
    for stream in results:
        results[stream].sort(key=lambda r: order[(r["test"].number, r["test"].args)])
    return results


# --- report ---------------------------------------------------------------------------


def _rows_by_key(results: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for res in results:
        seen: dict[tuple, int] = {}
        for r in res["rows"]:
            base = (res["test"].number, res["test"].args, r["test"], r["ntup"])
            k = seen.get(base, 0)
            seen[base] = k + 1
            out[(*base, k)] = r
    return out


def _cell(r: dict[str, Any] | None) -> tuple[str, str]:
    if r is None:
        return "-", "-"
    p = "-" if r["p"] is None else f"{r['p']:.6f}"
    assessment = r["assessment"]
    if r.get("first_assessment"):
        assessment += f" (first {r['first_assessment']}, resolved with -Y 1)"
    return p, assessment


def report(results: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> str:
    streams = list(results)
    keyed = {s: _rows_by_key(results[s]) for s in streams}
    keys = list(dict.fromkeys(k for s in streams for k in keyed[s]))
    head = ["test", "ntup"]
    for s in streams:
        head += [f"{s} p-value", f"{s} assessment"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        any_row = next(keyed[s][k] for s in streams if k in keyed[s])
        cells = [any_row["test"], str(any_row["ntup"])]
        for s in streams:
            cells += list(_cell(keyed[s].get(k)))
        lines.append("| " + " | ".join(cells) + " |")
    summary = []
    for s in streams:
        counts: dict[str, int] = {}
        for r in keyed[s].values():
            word = r["assessment"].split()[0]
            counts[word] = counts.get(word, 0) + 1
        total = sum(counts.values())
        summary.append(
            f"- {s}: {STREAMS[s][0]} — {total} p-values: "
            + ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))
        )
    seconds = {s: sum(r["seconds"] for r in results[s]) for s in streams}
    return (
        "## Random bit stream (`make rngtest`, dieharder)\n\n"
        f"- date: {meta['date']}; machine: {meta['cpu']}, {meta['cores']} cores; "
        f"dieharder {meta['dieharder']}, jax {jax.__version__}\n"
        f"- stream: key = jax.random.key({meta['seed']}), n = {meta['words']} uint32 words "
        f"({meta['words'] * 4 / 2**30:.2f} GiB, little-endian), one dieharder process per "
        f"test (`-g 201 -f FILE -d N`, `-Y 1` unless noted), each reading the file from "
        f"its start\n"
        f"- command: `{meta['command']}`; wall time {meta['wall']:.0f} s "
        f"({', '.join(f'{s} {v:.0f} s of tests' for s, v in seconds.items())}, "
        f"{meta['jobs']} at a time)\n"
        f"- assessment: dieharder's (WEAK: p < 0.005 or p > 0.995; FAILED: p < 1e-6 or "
        f"p > 1 - 1e-6). With ~100 p-values, one or two WEAK before resolution are expected "
        f"of a good generator.\n\n" + "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="dieharder battery on dropmask's bit stream")
    parser.add_argument("--words", type=int, default=None, help="uint32 words per stream file")
    parser.add_argument("--seed", type=int, default=0, help="jax.random.key(seed)")
    parser.add_argument("--reference", action="store_true", help="also test threefry")
    parser.add_argument("--quick", action="store_true", help="4 short tests, 256 MiB file")
    parser.add_argument("--jobs", type=int, default=2, help="dieharder processes at a time")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test")
    parser.add_argument("--dir", default=None, help="where stream files go (default: a temp dir)")
    parser.add_argument("--keep-files", action="store_true", help="keep the stream files")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="file to update")
    args = parser.parse_args(argv)

    if shutil.which("dieharder") is None:
        raise SystemExit("dieharder not found: apt-get install -y dieharder (make rngtest does)")
    words = args.words or ((1 << 26) if args.quick else DEFAULT_WORDS)
    battery = QUICK_BATTERY if args.quick else BATTERY
    streams = ["dropmask", "threefry"] if args.reference else ["dropmask"]
    dropmask_bits()  # fail before any work if the generator is missing

    start = time.perf_counter()
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="dropmask-rngtest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    files = {s: workdir / f"{s}.u32" for s in streams}
    try:
        for s, path in files.items():
            secs = dump(s, path, words, args.seed)
            print(f"wrote {path} ({words} words, {secs:.1f} s)", flush=True)
        results = run_battery(files, battery, args.jobs, args.timeout)
    finally:
        if not args.keep_files:
            for path in files.values():
                path.unlink(missing_ok=True)
            if args.dir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "dieharder": dieharder_version(),
        "seed": args.seed,
        "words": words,
        "jobs": args.jobs,
        "wall": time.perf_counter() - start,
        "command": " ".join(["python -m benchmarks.rngtest", *argv]),
    }
    body = report(results, meta)
    print(body)
    write_section(Path(args.results), SECTION, body)
    print(f"updated the {SECTION} section of {args.results}")
    bad = [
        r
        for s in results
        for res in results[s]
        for r in res["rows"]
        if s == "dropmask" and r["assessment"].split()[0] in ("FAILED", "ERROR", "INVALID")
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
