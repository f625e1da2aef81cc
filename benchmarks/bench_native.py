"""How far a fused native CPU kernel would get: dropout's generator and apply in one C
pass (``benchmarks/native/fused_dropout.c``), timed beside XLA in one run.

The CPU targets of the dropout benchmark (forward at most 1.3x the ``x * c`` limit,
bf16 no worse) are missed by XLA's two-pass forward (generator, then apply). This
benchmark asks whether a hand-written kernel that generates and applies the mask in
one streaming pass would meet them, and with which generator:

- Threefry-4x32-13 (dropmask's; the C kernel's mask and output are checked bit for
  bit against ``dropmask.dropout`` before anything is timed);
- Threefry-4x32-20 (dropmask's generator before 0.2), Philox-4x32-10, ARS-5 and ARS-7
  (AES-NI), the alternatives from the same paper (Salmon et al., SC 2011). Random123's
  defaults are Threefry-20, Philox-10 and ARS-7, which it describes as a safety margin
  over the fewest rounds with no known flaws (12 for Threefry-4x32); Threefry-13 and
  ARS-5 give up some or all of that margin for speed.

Every row is a paired per-pass ratio against XLA's ``x * c`` loop (the denominator of
the dropout targets), with the same slope timing as ``make bench``
(``benchmarks/_harness.py``). Not a library path: nothing here is used by dropmask.

Usage: ``python -m benchmarks.bench_native [--repeats 11] [--out benchmarks]``
(``make bench-native``). Needs gcc with OpenMP and an x86-64 CPU with AVX2 and AES-NI
(ARS uses 256-bit VAES where the CPU has it).
"""

from __future__ import annotations

import os

# libgomp reads these once, when the library loads: sleep between parallel regions
# instead of spinning, so idle OpenMP threads do not steal XLA's cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
os.environ.setdefault("OMP_NUM_THREADS", str(_CPUS or 1))

import argparse  # noqa: E402
import ctypes  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import dropmask  # noqa: E402
from benchmarks import _contestants  # noqa: E402
from benchmarks._harness import Looped, looped, paired_per_pass_ratios, quartiles  # noqa: E402
from dropmask import testing  # noqa: E402

SOURCE = Path(__file__).parent / "native" / "fused_dropout.c"
SECTION = "native"
SHAPE = (4096, 4096)
RATE = _contestants.RATE
GENERATORS = {
    0: "Threefry-4x32-20",
    1: "Threefry-4x32-13 (dropmask)",
    2: "Philox-4x32-10",
    3: "ARS-5 (AES-NI)",
    4: "ARS-7 (AES-NI)",
}
DROPMASK = 1  # the C kernels' number for dropmask's generator
_ELEMENTS_PER_LOOP_STEP = 256  # 8 words of 32 elements per OpenMP iteration


def cpu_flags() -> set[str]:
    """The CPU feature flags Linux reports (empty where /proc/cpuinfo is missing)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def unsupported() -> str | None:
    """Why the kernels cannot run here, or None."""
    if shutil.which("gcc") is None:
        return "gcc not found"
    if not {"avx2", "aes"} <= cpu_flags():
        return "the CPU lacks AVX2 or AES-NI"
    return None


def build(folder: Path) -> ctypes.CDLL:
    """Compiles the kernels into ``folder`` and loads them."""
    why = unsupported()
    if why is not None:
        raise RuntimeError(f"bench_native needs gcc and an x86-64 CPU with AVX2 and AES-NI: {why}.")
    has_vaes = "vaes" in cpu_flags()
    lib = folder / "fused_dropout.so"
    flags = ["-O3", "-mavx2", "-mbmi2", "-maes", "-fopenmp", "-shared", "-fPIC"]
    if has_vaes:
        flags.append("-mvaes")
    else:
        flags.append("-DNO_VAES")
    subprocess.run(["gcc", *flags, str(SOURCE), "-o", str(lib)], check=True)
    native = ctypes.CDLL(str(lib))
    u32p = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
    f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    u16p = np.ctypeslib.ndpointer(np.uint16, flags="C_CONTIGUOUS")
    i64, i32, u32, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_uint32, ctypes.c_float
    native.packed_words.argtypes = [i32, u32p, u32p, i64, u32, i32]
    native.scale_f32.argtypes = [f32p, i64, f32, i32]
    native.scale_bf16.argtypes = [u16p, i64, f32, i32]
    native.dropout_f32.argtypes = [i32, u32p, f32p, i64, u32, f32, i32]
    native.dropout_bf16.argtypes = [i32, u32p, u16p, i64, u32, f32, i32]
    for fn in ("packed_words", "scale_f32", "scale_bf16", "dropout_f32", "dropout_bf16"):
        getattr(native, fn).restype = None
    native.has_vaes = has_vaes
    return native


@dataclass(frozen=True)
class Mask:
    """dropmask's 16-bit threshold at RATE, and the f32 scale it applies to kept values."""

    value: int
    scale: float

    @classmethod
    def at(cls, rate: float) -> Mask:
        thr = testing.threshold(float(np.float32(1.0) - np.float32(rate)))
        return cls(int(thr.value), float(np.float32(1.0) / np.float32(thr.realised)))


def _bf16_bits(x: jax.Array) -> np.ndarray:
    return np.asarray(jax.lax.bitcast_convert_type(x, jnp.uint16)).copy()


def check_exact(native: ctypes.CDLL, shape: tuple[int, ...] = (64, 1024)) -> dict[str, Any]:
    """Threefry-13 in C against dropmask, bit for bit: the packed words and the dropout
    outputs in f32 and bf16. The other generators: their drop fraction within 6 sigma.
    Raises if anything differs, so no broken kernel is timed."""
    if shape[-1] % 32 or math.prod(shape) % _ELEMENTS_PER_LOOP_STEP:
        raise ValueError(
            f"the C kernels pack words of 32 along the last axis, 256 elements per step: "
            f"need a last axis that is a multiple of 32 and a size that is a multiple of "
            f"256, got shape {shape}."
        )
    key = jax.random.key(7)
    words = np.asarray(testing.key_words(key))
    mask = Mask.at(RATE)
    n = math.prod(shape)
    expected_words = np.asarray(testing.packed_mask_words(key, shape, RATE))
    got_words = np.zeros(n // 32, np.uint32)
    native.packed_words(DROPMASK, words, got_words, n // 32, mask.value, 1)
    if not np.array_equal(got_words, expected_words.reshape(-1)):
        raise AssertionError("C Threefry-13 packed words differ from dropmask's.")
    x = jax.random.normal(jax.random.key(1), shape, jnp.float32)
    want = np.asarray(dropmask.dropout(x, RATE, key, impl="fast"))
    got = np.asarray(x).copy()
    native.dropout_f32(DROPMASK, words, got, n, mask.value, mask.scale, 1)
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        raise AssertionError("C fused f32 dropout differs from dropmask.dropout.")
    xb = x.astype(jnp.bfloat16)
    want_b = _bf16_bits(dropmask.dropout(xb, RATE, key, impl="fast"))
    got_b = _bf16_bits(xb)
    native.dropout_bf16(DROPMASK, words, got_b, n, mask.value, mask.scale, 1)
    if not np.array_equal(got_b, want_b):
        raise AssertionError("C fused bf16 dropout differs from dropmask.dropout.")
    fractions = {}
    big = 1 << 22
    sigma = math.sqrt(RATE * (1 - RATE) / big)
    for gen in GENERATORS:
        flags = np.zeros(big // 32, np.uint32)
        native.packed_words(gen, words, flags, big // 32, mask.value, 1)
        kept = int(np.unpackbits(flags.view(np.uint8)).sum())
        drop = 1 - kept / big
        if abs(drop - RATE) > 6 * sigma:
            raise AssertionError(f"{GENERATORS[gen]}: drop fraction {drop:.5f}, want {RATE}.")
        fractions[GENERATORS[gen]] = drop
    return {"bit_exact_vs_dropmask": True, "drop_fraction_2**22": fractions}


def _native_loop(call: Callable[[int], None]) -> Looped:
    """A :class:`Looped` over a C kernel that runs ``passes`` passes in one call."""

    def make(passes: int) -> Callable[[], None]:
        return lambda: call(passes)

    return looped(make, ())


def native_loops(native: ctypes.CDLL, dtype_name: str) -> dict[str, Looped]:
    """The C contestants for one dtype, each working in place on its own buffer."""
    mask = Mask.at(RATE)
    words = np.asarray(testing.key_words(jax.random.key(0)))
    n = math.prod(SHAPE)
    if n % _ELEMENTS_PER_LOOP_STEP:
        raise ValueError(f"the C kernels need a multiple of 256 elements, got {n}.")
    x = jax.random.normal(jax.random.key(1), SHAPE, jnp.float32)
    c = float(1.0 / (1.0 - RATE))
    if dtype_name == "f32":
        buffer, scale, dropout = lambda: np.asarray(x).copy(), native.scale_f32, native.dropout_f32
    else:
        buffer = lambda: _bf16_bits(x.astype(jnp.bfloat16))  # noqa: E731
        scale, dropout = native.scale_bf16, native.dropout_bf16
    # Each C call takes its pass count last; every contestant gets its own buffer.
    loops = {"C x * c": _native_loop(functools.partial(scale, buffer(), n, c))}
    for gen, name in GENERATORS.items():
        loops[f"C fused, {name}"] = _native_loop(
            functools.partial(dropout, gen, words, buffer(), n, mask.value, mask.scale)
        )
    if dtype_name == "f32":  # the generator alone writes the same words for any dtype
        for gen, name in GENERATORS.items():
            out = np.zeros(n // 32, np.uint32)
            loops[f"C generator alone, {name}"] = _native_loop(
                functools.partial(native.packed_words, gen, words, out, n // 32, mask.value)
            )
    return loops


def run(repeats: int = 11) -> dict[str, Any]:
    """All rows: per dtype, each contestant's paired per-pass ratios to XLA's ``x * c``."""
    ours, _, limit_contestant = _contestants.contestants(full=False)[0]
    with tempfile.TemporaryDirectory() as folder:
        native = build(Path(folder))
        checks = check_exact(native)
        rows = []
        for dtype_name in _contestants.DTYPES:
            limit = _contestants.loop(limit_contestant, SHAPE, dtype_name, "fwd")
            contestants = {
                f"XLA {ours.name}": _contestants.loop(ours, SHAPE, dtype_name, "fwd"),
                **native_loops(native, dtype_name),
            }
            if dtype_name == "f32":
                x, _ = _contestants.inputs(SHAPE, jnp.float32)
                contestants["XLA generator alone (dropmask's packed words)"] = looped(
                    lambda passes: _contestants.looped_mask_words(SHAPE, passes),
                    (x, jax.random.key(0)),
                )
            for name, loop in contestants.items():
                print(f"  {dtype_name} {name} ...", flush=True)
                ratios = paired_per_pass_ratios(loop, limit, repeats=repeats)
                rows.append({"dtype": dtype_name, "name": name, "vs_xla_limit": ratios})
    return {"checks": checks, "rows": rows, "shape": list(SHAPE), "rate": RATE}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Forward dropout at rate {result['rate']}, {result['shape']}, per pass, as a ratio "
        "to XLA's `x * c` loop (the dropout targets' denominator: 1.3x is the f32 target); "
        "median and quartiles of back-to-back pairs.",
        "",
        "| dtype | contestant | vs XLA `x * c` |",
        "|---|---|---|",
    ]
    for row in result["rows"]:
        q1, q2, q3 = quartiles(row["vs_xla_limit"])
        spread = f"{q2:.2f}x ({q1:.2f}-{q3:.2f}, {len(row['vs_xla_limit'])} pairs)"
        lines.append(f"| {row['dtype']} | {row['name']} | {spread} |")
    fractions = ", ".join(
        f"{name} {frac:.4f}" for name, frac in result["checks"]["drop_fraction_2**22"].items()
    )
    lines += [
        "",
        "Checked before timing: the C Threefry-13 kernel's packed words and its f32 and "
        f"bf16 outputs equal dropmask's bit for bit; drop fractions over 2**22: {fractions}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11, help="pairs per ratio")
    parser.add_argument("--out", default="benchmarks", help="folder for RESULTS.md / JSON")
    args = parser.parse_args(argv)
    from benchmarks._harness import environment, environment_markdown, write_section

    env = environment(" ".join(["python -m benchmarks.bench_native", *argv]))
    env["omp"] = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    print(environment_markdown(env), flush=True)
    result = run(repeats=args.repeats)
    text = markdown(result)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    body = "## Fused native kernel (`make bench-native`)\n\n" + environment_markdown(env)
    write_section(out / "RESULTS.md", SECTION, body + "\n" + text)
    payload = {"environment": env, **result}
    (out / "native_results.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {out / 'RESULTS.md'} and {out / 'native_results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
