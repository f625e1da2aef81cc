"""Flax-style code run on dropmask's dropout without an edit (``swap_dropout``).

The model is ``bench_transformer_step``'s encoder layer as Flax's WMT example writes
it, with ``flax.linen.Dropout`` and Flax's default attention function; the swapped
contestant is that very layer, its train step traced under
``dropmask.linen.swap_dropout(attention=True)`` (the default impl). Rows:

* Step time: the swapped step with dropout against Flax's step without dropout, paired
  per repeat: at most that step's time.
* Temporaries: what the swapped step's dropout adds over Flax's step without dropout,
  against what Flax's dropout adds (the residual the backward pass keeps).
* Attention at a long sequence (2048 tokens in the targets' size): only the attention
  weights dropped (the other sites at rate 0), so that the temporaries dropout adds
  (over the same step at rate 0) are the attention's dropout mask alone. Flax's step
  holds a ``[batch, heads, q, k]`` mask; the swapped step must add less than one such
  mask of bytes (a bit-packed mask is an eighth of it), and its temporaries must not
  exceed Flax's.

Each row's output check: the same step swapped with ``impl="flax"`` is bit-identical
to Flax's.

Usage: ``python -m benchmarks.bench_swap [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from benchmarks import bench_transformer_step as ts
from benchmarks._harness import Looped, paired_per_pass_seconds, quartiles
from dropmask import linen as dl

STEP_FULL = {"batch": 16, "length": 256, "width": 256, "heads": 8, "mlp_dim": 1024, "repeats": 9}
STEP_QUICK = {"batch": 2, "length": 64, "width": 64, "heads": 2, "mlp_dim": 128, "repeats": 5}
LONG_FULL = {"batch": 2, "length": 2048, "width": 256, "heads": 8, "mlp_dim": 1024}
LONG_QUICK = {"batch": 1, "length": 512, "width": 64, "heads": 2, "mlp_dim": 128}
FLAX0, FLAX, SWAPPED = "flax, no dropout", "flax, dropout", "flax, dropout, swapped"
SWAPPED0 = "flax, no dropout, swapped"


def swapped(
    step: Callable[..., Any], impl: str = "fast", attention: bool = True
) -> Callable[..., Any]:
    """``step`` traced under ``swap_dropout(impl, attention=attention)``."""

    @functools.wraps(step)
    def run(*args: Any) -> Any:
        with dl.swap_dropout(impl=impl, attention=attention):  # pyright: ignore[reportArgumentType]
            return step(*args)

    return run


def _setup(
    batch: int, length: int, width: int, heads: int, mlp_dim: int, rate: float, attention: float
) -> tuple[dict[str, Callable[..., Any]], tuple[Any, ...], bool]:
    """The steps, their arguments, and whether the step swapped with ``impl="flax"`` (the
    dropout layers; dropmask's attention computes the same function, not the same bits)
    is bit-identical to Flax's."""
    kx, kp = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (batch, length, width))
    layer = functools.partial(ts.EncoderLayer, ts.FLAX, heads=heads, mlp_dim=mlp_dim, dtype=None)
    without = layer(0.0)
    with_dropout = layer(rate, attention_rate=attention)
    params = without.init(kp, x, True)["params"]
    args = (params, x, jax.random.key(1))
    flax_step = ts.step_fn(with_dropout)
    steps = {
        FLAX0: ts.step_fn(without),
        FLAX: flax_step,
        SWAPPED: swapped(flax_step),
        SWAPPED0: swapped(ts.step_fn(without)),
    }
    flax_impl = swapped(flax_step, "flax", attention=False)
    same = jax.tree.map(np.array_equal, jax.jit(flax_step)(*args), jax.jit(flax_impl)(*args))
    return steps, args, all(jax.tree.leaves(same))


def step_rows(quick: bool) -> dict[str, Any]:
    """Step times (paired) and temporaries of Flax's step without and with dropout and
    of the swapped one."""
    s = dict(STEP_QUICK if quick else STEP_FULL)
    repeats = s.pop("repeats")
    steps, args, same = _setup(**s, rate=ts.RATE, attention=ts.RATE)
    loops = {
        name: Looped(lambda n, step=step: ts.looped_steps(step, n), args, extra=6)
        for name, step in steps.items()
    }
    del loops[SWAPPED0]  # the rows' baseline is Flax's step without dropout
    seconds = paired_per_pass_seconds(loops, repeats=repeats)
    temps = {name: ts.temp_bytes(step, args) for name, step in steps.items()}
    return {"size": s, "seconds": seconds, "temp_bytes": temps, "bit_identical": same}


def long_rows(quick: bool) -> dict[str, Any]:
    """Temporaries with only the attention weights dropped, at a long sequence."""
    s = LONG_QUICK if quick else LONG_FULL
    steps, args, same = _setup(**s, rate=0.0, attention=ts.RATE)
    temps = {name: ts.temp_bytes(step, args) for name, step in steps.items()}
    mask = s["batch"] * s["heads"] * s["length"] ** 2  # one byte per [b, h, q, k] element
    return {"size": s, "temp_bytes": temps, "mask_bytes": mask, "bit_identical": same}


def targets(quick: bool) -> list[Any]:
    """The ``make bench`` rows (``benchmarks.targets.Target``)."""
    from benchmarks.targets import Target  # targets.py registers this module

    step = step_rows(quick)
    s = step["size"]
    label = f"[{s['batch']}, {s['length']}, {s['width']}], {s['heads']} heads, MLP {s['mlp_dim']}"
    name = f"f32 Flax-style Transformer step {label}, swap_dropout(attention=True)"
    sec, temps = step["seconds"], step["temp_bytes"]
    flax_ratio = quartiles([f / b for f, b in zip(sec[FLAX], sec[FLAX0], strict=True)])[1]
    ours_added, flax_added = temps[SWAPPED] - temps[FLAX0], temps[FLAX] - temps[FLAX0]
    long = long_rows(quick)
    ls, lt, mask = long["size"], long["temp_bytes"], long["mask_bytes"]
    long_name = (
        f"f32 Flax-style step [{ls['batch']}, {ls['length']}, {ls['width']}], {ls['heads']} "
        f"heads, attention dropout {ts.RATE} only, swap_dropout(attention=True)"
    )
    # Each against its own attention without dropout: the two attention functions
    # differ in what they hold even then.
    long_added, long_flax_added = lt[SWAPPED] - lt[SWAPPED0], lt[FLAX] - lt[FLAX0]
    mib = 2**20
    return [
        Target(
            f"{name}: step with dropout / Flax's without",
            1.0,
            True,
            [o / b for o, b in zip(sec[SWAPPED], sec[FLAX0], strict=True)],
            note=f"Flax's with dropout: {flax_ratio:.3f}x (median)",
            extra_check=step["bit_identical"],
            backend_only="cpu",
        ),
        Target(
            f"{name}: temporaries its dropout adds / Flax's dropout adds",
            0.05,
            True,
            [ours_added / flax_added if flax_added > 0 else float("nan")],
            note=(
                f"over Flax's step without dropout ({temps[FLAX0] / mib:.1f} MiB): swapped "
                f"{ours_added / mib:+.2f} MiB, Flax {flax_added / mib:+.2f} MiB"
            ),
            extra_check=step["bit_identical"],
        ),
        Target(
            f"{long_name}: temporaries attention dropout adds / one [b, h, q, k] byte mask",
            0.25,
            True,
            [long_added / mask],
            note=(
                f"swapped {long_added / mib:+.1f} MiB, Flax {long_flax_added / mib:+.1f} MiB "
                f"({long_flax_added / mask:.2f} masks); one mask {mask / mib:.1f} MiB"
            ),
            extra_check=long["bit_identical"],
        ),
        Target(
            f"{long_name}: temporaries / Flax's",
            1.0,
            True,
            [lt[SWAPPED] / lt[FLAX]],
            note=f"swapped {lt[SWAPPED] / mib:.1f} MiB, Flax {lt[FLAX] / mib:.1f} MiB",
            extra_check=long["bit_identical"],
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for target in targets(args.quick):
        row = target.row()
        print(f"{row['target']}: {row['measured']} {row['status']} ({row['note']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
