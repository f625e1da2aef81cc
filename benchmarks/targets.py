"""``make bench``: every speed and memory target of dropmask's dropout, in one table.

Each target is measured the way a user meets it, with the spread of paired repeats:

* Dropout at ``[4096, 4096]``, rate 0.1, per pass (the slope between a short and a
  long loop of passes inside one jit, ``_common.Looped``), forward+backward with the
  two passes kept apart as the layers between them in a network keep them
  (``_common.vjp_apart``): dropmask against ``x * c`` (the memory-bound limit) and
  against ``flax.linen.Dropout``, each pair timed back to back.
* The residual ``jax.vjp`` keeps for dropout's backward pass, bytes per element.
* A Transformer encoder layer's train step (``bench_transformer_step``: Flax's WMT
  encoder block, ``[16, 256, 256]``, 8 heads, MLP 1024, SGD): what each library's
  dropout adds to the step against the same layer at rate 0, and the temporary memory
  it adds.
* Monte Carlo dropout (``bench_mc``): K samples of an MLP's prediction in one
  ``dropmask.uncertainty.sample`` call against K single forward passes with dropout
  on, paired per repeat.
* On a GPU only: dropout at ``x * c``'s bandwidth, and the train step against Flax's.

A speed target's measured value is the median of the paired repeats, with their
quartiles; where the quartiles lie on both sides of the threshold the verdict is
marked "within noise": this machine cannot tell the two apart. A failed target prints
FAIL; the command still exits 0 (it is a report) unless ``--strict``.

Usage: ``python -m benchmarks.run [--quick] [--strict] [--out benchmarks]``; the table
replaces the ``targets`` section of ``<out>/RESULTS.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import jax

from benchmarks import _common as common
from benchmarks import bench_mc, bench_transformer_step
from benchmarks._common import finite, quartiles

SECTION = "targets"


@dataclass(frozen=True)
class Size:
    """How large and how often: the target sizes, or ``--quick``'s."""

    dropout_shape: tuple[int, int]
    limit_pairs: int  # pairs against x * c (cheap loops)
    flax_pairs: int  # pairs against flax.linen.Dropout (slow loops)
    step: dict[str, int]  # bench_transformer_step.run's sizes
    quick: bool = False
    mc: dict[str, int] = field(default_factory=lambda: dict(bench_mc.QUICK))  # bench_mc's


FULL = Size(
    (4096, 4096),
    limit_pairs=21,
    flax_pairs=7,
    step={"batch": 16, "length": 256, "width": 256, "heads": 8, "mlp_dim": 1024, "repeats": 9},
    mc=dict(bench_mc.FULL),
)
QUICK = Size(
    (1024, 1024),
    limit_pairs=5,
    flax_pairs=3,
    step={"batch": 2, "length": 64, "width": 64, "heads": 2, "mlp_dim": 128, "repeats": 5},
    quick=True,
)


@dataclass
class Target:
    """One target: ``values`` (paired repeats, or one exact measurement) against ``bound``.

    ``at_most``: the target is ``median <= bound`` (else ``>=``). ``scale`` and ``unit``
    only format the numbers (``scale=100, unit="%"`` prints a share as percent).
    """

    name: str
    bound: float
    at_most: bool
    values: list[float]
    unit: str = "x"
    scale: float = 1.0
    note: str = ""
    extra_check: bool | None = None  # e.g. the output check; False fails the target
    backend_only: str | None = None  # the backend the bound is meant for
    fields: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Median, quartiles, verdict and whether the spread straddles the bound."""
        values = finite(self.values)
        if not values:
            return {"median": None, "q1": None, "q3": None, "status": "FAIL", "noise": False}
        q1, med, q3 = quartiles(values) if len(values) > 1 else (values[0],) * 3
        passed = med <= self.bound if self.at_most else med >= self.bound
        if self.extra_check is False:
            passed = False
        noise = len(values) > 1 and q1 <= self.bound <= q3
        status = "PASS" if passed else "FAIL"
        here = jax.default_backend()
        if self.backend_only is not None and here != self.backend_only:
            status = "n/a"
        return {"median": med, "q1": q1, "q3": q3, "status": status, "noise": noise}

    def row(self) -> dict[str, Any]:
        s = self.summary()

        def fmt(v: float) -> str:
            return f"{v * self.scale:.3g}{self.unit}"

        threshold = f"{'<=' if self.at_most else '>='} {fmt(self.bound)}"
        if s["median"] is None:
            measured = "no finite value"
        elif len(self.values) > 1:
            kept = len(finite(self.values))
            dropped = len(self.values) - kept
            measured = (
                f"{fmt(s['median'])} (quartiles {fmt(s['q1'])} to {fmt(s['q3'])}, "
                f"{kept} pairs{f', {dropped} discarded' if dropped else ''})"
            )
        else:
            measured = fmt(s["median"])
        status = s["status"] + (" (within noise)" if s["noise"] and s["status"] != "n/a" else "")
        notes = [self.note] if self.note else []
        if self.extra_check is False:
            notes.append("output check failed")
        if s["status"] == "n/a":
            notes.append(
                f"the bound is for {self.backend_only}, this ran on {jax.default_backend()}"
            )
        return {
            "target": f"{self.name} {threshold}",
            "measured": measured,
            "status": status,
            "note": "; ".join(notes),
            **{k: s[k] for k in ("median", "q1", "q3")},
        }


# --- measurements ---------------------------------------------------------------------


def _on_gpu() -> bool:
    """Whether to add the GPU-only rows."""
    return jax.default_backend() == "gpu"


def dropout_targets(size: Size) -> list[Target]:
    """Dropout per pass against the limit and against Flax; residual bytes."""
    ours, flax, limit = common.contestants(full=False)[0]
    shape = size.dropout_shape
    label = f"{list(shape)} rate {common.RATE}"
    out: list[Target] = []
    loops: dict[tuple[str, str, str], common.Looped] = {}

    def loop(c: common.Contestant, dtype: str, mode: str) -> common.Looped:
        if (c.name, dtype, mode) not in loops:
            loops[(c.name, dtype, mode)] = common.loop(c, shape, dtype, mode)
        return loops[(c.name, dtype, mode)]

    on_gpu = _on_gpu()
    print(f"  dropmask / x * c, f32 fwd+bwd {label} ...", flush=True)
    ok = common.checked(ours, shape, "f32", "fwd+bwd")["ok"]
    ratios = common.paired_per_pass_ratios(
        loop(ours, "f32", "fwd+bwd"), loop(limit, "f32", "fwd+bwd"), repeats=size.limit_pairs
    )
    out.append(
        Target(
            f"f32 fwd+bwd (passes apart), {label}: time / x * c",
            1.9,
            True,
            ratios,
            extra_check=ok,
            backend_only="cpu",
        )
    )
    for dtype in common.DTYPES:
        for mode in common.MODES:
            print(f"  flax.linen.Dropout / dropmask, {dtype} {mode} {label} ...", flush=True)
            ok = common.checked(ours, shape, dtype, mode)["ok"]
            speedups = common.paired_per_pass_ratios(
                loop(flax, dtype, mode), loop(ours, dtype, mode), repeats=size.flax_pairs
            )
            out.append(
                Target(
                    f"{dtype} {mode}, {label}: speedup over flax.linen.Dropout",
                    8.0,
                    False,
                    speedups,
                    extra_check=ok,
                )
            )
            if on_gpu:
                # The fraction of x * c's bandwidth: limit time / dropmask time, paired.
                fractions = common.paired_per_pass_ratios(
                    loop(limit, dtype, mode), loop(ours, dtype, mode), repeats=size.limit_pairs
                )
                out.append(
                    Target(
                        f"GPU {dtype} {mode}, {label}: bandwidth / x * c's",
                        0.85,
                        False,
                        fractions,
                        unit="%",
                        scale=100,
                        extra_check=ok,
                        backend_only="gpu",
                    )
                )
    for dtype_name, dtype in common.DTYPES.items():
        res = common.residuals(ours, dtype)
        growing = ", ".join(res["growing_residuals"]) or "nothing that grows with x"
        out.append(
            Target(
                f"{dtype_name} dropout residual for the backward pass",
                0.13,
                True,
                [res["residual_bytes_per_element"]],
                unit=" B/element",
                note=f"keeps {growing} (+{res['residual_bytes_constant']:.0f} B constant)",
            )
        )
    return out


def step_targets(size: Size) -> list[Target]:
    """The Transformer train step, f32 and bf16 (see ``bench_transformer_step``)."""
    out: list[Target] = []
    s = size.step
    label = f"[{s['batch']}, {s['length']}, {s['width']}], {s['heads']} heads, MLP {s['mlp_dim']}"
    on_gpu = _on_gpu()
    for dtype in common.DTYPES:
        print(f"  Transformer train step, {dtype} {label} ...", flush=True)
        result = bench_transformer_step.run(dtype_name=dtype, **s)
        flax_row, ours_row = result["rows"]
        name = f"{dtype} Transformer step {label}"
        flax_share = quartiles(result["added_shares"][bench_transformer_step.FLAX])[1]
        out += [
            Target(
                f"{name}: dropmask's added time / Flax's",
                0.1,
                True,
                result["added_time_ratios"] or [math.nan],
                note="pairs where Flax's addition was not positive are left out",
                backend_only="cpu",
            ),
            Target(
                f"{name}: dropmask's added time / step without dropout",
                0.04,
                True,
                result["added_shares"][bench_transformer_step.DROPMASK],
                unit="%",
                scale=100,
                note=f"Flax's: {100 * flax_share:.1f}% (median)",
                backend_only="cpu",
            ),
            Target(
                f"{name}: dropmask's added temporary memory / Flax's",
                0.05,
                True,
                [
                    ours_row["added_temp_bytes"] / flax_row["added_temp_bytes"]
                    if flax_row["added_temp_bytes"] > 0
                    else math.nan
                ],
                note=(
                    f"dropmask +{ours_row['added_temp_bytes'] / 2**20:.2f} MiB, Flax "
                    f"+{flax_row['added_temp_bytes'] / 2**20:.2f} MiB"
                ),
            ),
        ]
        if on_gpu:
            seconds = result["step_seconds"]
            dm_name = bench_transformer_step.contestant_name(
                (bench_transformer_step.DROPMASK, bench_transformer_step.RATE)
            )
            flax_name = bench_transformer_step.contestant_name(
                (bench_transformer_step.FLAX, bench_transformer_step.RATE)
            )
            ours_s, flax_s = seconds[dm_name], seconds[flax_name]
            out.append(
                Target(
                    f"GPU {name}: dropmask step time / Flax's",
                    1.0,
                    True,
                    [o / f for o, f in zip(ours_s, flax_s, strict=True)],
                    backend_only="gpu",
                )
            )
    return out


def mc_targets(size: Size) -> list[Target]:
    """K Monte Carlo dropout samples in one call against K single passes."""
    m = size.mc
    label = (
        f"MLP [{m['batch']}, {m['width']}] x {m['layers']} layers, K={m['samples']}, "
        f"rate {common.RATE}"
    )
    print(f"  uncertainty.sample / K single passes, {label} ...", flush=True)
    ratios = bench_mc.run(
        m["batch"], m["width"], m["layers"], m["samples"], repeats=5 if size.quick else 11
    )
    return [Target(f"f32 {label}: K samples in one call / K single passes", 1.15, True, ratios)]


def run(size: Size) -> list[Target]:
    """Measures every target at ``size``."""
    return dropout_targets(size) + step_targets(size) + mc_targets(size)


def markdown(targets: list[Target], size: Size) -> str:
    """The one table: target / measured / status / note, and what it means."""
    rows = [t.row() for t in targets]
    lines = [
        "Speed values are medians of paired repeats (quartiles beside them); "
        '"within noise": the quartiles lie on both sides of the bound. Dropout times are '
        "per pass (slope of a short and a long loop of passes in one jit); "
        "forward+backward keeps the passes apart as the layers between them in a network "
        "do. Step times: each library's layer with dropout against the same layer at "
        "rate 0, paired per repeat.",
        "",
    ]
    if size.quick:
        lines += ["**--quick: smaller sizes than the targets'; for checking the suite.**", ""]
    if jax.default_backend() != "gpu":
        lines += [f"GPU rows skipped: JAX's backend here is {jax.default_backend()!r}.", ""]
    table = common.markdown_table(
        rows,
        [("target", "target"), ("measured", "measured"), ("status", "status"), ("note", "note")],
    )
    return "\n".join(lines) + "\n" + table


def failed(targets: list[Target]) -> list[str]:
    """Names of the targets that FAIL here."""
    return [t.name for t in targets if t.summary()["status"] == "FAIL"]
