"""Summaries of runs: ``summary.json``, ``curves.png`` and the tables printed at the end."""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ml_collections
import numpy as np

from ._logging import read_metrics, require

if TYPE_CHECKING:
    from .._workflow import Example
    from ._result import RunResult

__all__ = ["comparison_table", "run_table", "summarize_comparison", "write_run"]

GAP_SPLIT = "train_eval"
# The held-out calibration metrics of a run with config.mc_samples > 0, in table order.
CALIBRATION = ("nll", "ece", "mc_accuracy", "mc_nll", "mc_ece")


def gaps(final: dict[str, dict[str, float]]) -> dict[str, float]:
    """Train-set minus held-out value of each metric, when both were evaluated."""
    if GAP_SPLIT not in final or "eval" not in final:
        return {}
    train, held_out = final[GAP_SPLIT], final["eval"]
    return {name: train[name] - held_out[name] for name in held_out if name in train}


def write_run(result: RunResult, example: Example) -> None:
    """Writes ``summary.json`` and ``curves.png`` into the run's workdir."""
    summary = {
        "example": example.name,
        "metrics": result.final.get("eval", {}),
        "splits": result.final,
        "gap": gaps(result.final),
        "steps": result.steps,
        "start_step": result.start_step,
        "wall_seconds": result.wall_seconds,
        "config": result.config,
    }
    (result.workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_run(read_metrics(result.workdir / "metrics.jsonl"), result.workdir / "curves.png")


def _figure(columns: int) -> Any:
    # Figure() renders with the Agg canvas without touching pyplot's global backend.
    figure = require("matplotlib.figure").Figure
    return figure(figsize=(4.2 * columns, 3.6), layout="constrained")


def plot_run(rows: Sequence[dict[str, Any]], path: pathlib.Path) -> None:
    """One panel per metric: train rows solid, each eval split dashed, against step."""
    splits = sorted({row["split"] for row in rows}, key=lambda s: (s != "train", s))
    names = sorted({k for row in rows for k in row if k not in ("step", "split")})
    names.sort(key=lambda n: n != "loss")
    fig = _figure(max(len(names), 1))
    axes = np.atleast_1d(fig.subplots(1, max(len(names), 1)))
    for ax, name in zip(axes, names, strict=False):
        for split in splits:
            points = [(r["step"], r[name]) for r in rows if r["split"] == split and name in r]
            if points:
                steps, values = zip(*points, strict=True)
                style = "-" if split == "train" else "--"
                ax.plot(steps, values, style, marker="." if len(points) < 30 else None, label=split)
        ax.set(xlabel="step", title=name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.savefig(path, dpi=110)


def run_table(final: dict[str, dict[str, float]]) -> str:
    """The final evaluation as an aligned table, one row per split."""
    names = sorted({n for metrics in final.values() for n in metrics})
    rows = [["split", *names]]
    for split, metrics in final.items():
        rows.append([split, *(f"{metrics[n]:.4f}" if n in metrics else "" for n in names)])
    gap = gaps(final)
    if gap:
        rows.append(["gap", *(f"{gap[n]:+.4f}" if n in gap else "" for n in names)])
    return _align(rows)


def _align(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _stats(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(array.mean()),
        "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
        "min": float(array.min()),
        "max": float(array.max()),
    }


def summarize_comparison(
    example: Example,
    config: ml_collections.ConfigDict,
    runs: Sequence[tuple[float, int, RunResult]],
) -> dict[str, Any]:
    """Per rate: mean, std (over seeds, ddof=1), min and max of every final metric."""
    rates: dict[str, Any] = {}
    for rate in dict.fromkeys(r for r, _, _ in runs):
        mine = [result for r, _, result in runs if r == rate]
        entry: dict[str, Any] = {"rate": rate, "seeds": [s for r, s, _ in runs if r == rate]}
        for split in mine[0].final:
            entry[split] = {
                n: _stats([res.final[split][n] for res in mine]) for n in mine[0].final[split]
            }
        gap_values = [gaps(res.final) for res in mine]
        if gap_values[0]:
            entry["gap"] = {n: _stats([g[n] for g in gap_values]) for n in gap_values[0]}
        entry["runs"] = [
            {"seed": s, "final": res.final, "workdir": str(res.workdir)}
            for r, s, res in runs
            if r == rate
        ]
        rates[f"{rate:g}"] = entry
    return {
        "example": example.name,
        "best_metric": example.best_metric,
        "rates": rates,
        "config": config.to_dict(),
    }


def comparison_table(summary: dict[str, Any]) -> str:
    """Per rate: the held-out metric, the train-set metric and the gap, mean ± std."""
    metric = summary["best_metric"]
    header = ["rate", "seeds", f"eval {metric}", "min..max"]
    any_entry = next(iter(summary["rates"].values()))
    has_gap = "gap" in any_entry
    if has_gap:
        header += [f"train {metric}", "gap"]
    has_loss = metric != "loss" and "loss" in any_entry["eval"]
    if has_loss:
        header.append("eval loss")
    # With --mc-samples: calibration of the deterministic model beside the sampled one.
    calibration = [name for name in CALIBRATION if name in any_entry["eval"]]
    header += [name.replace("mc_", "mc ") for name in calibration]
    rows = [header]
    for key, entry in summary["rates"].items():
        held = entry["eval"][metric]
        seeds = len(entry["seeds"])
        pm = functools.partial(_pm, seeds=seeds)
        row = [key, str(seeds), pm(held), f"{held['min']:.4f}..{held['max']:.4f}"]
        if has_gap:
            row += [pm(entry[GAP_SPLIT][metric]), pm(entry["gap"][metric])]
        if has_loss:
            row.append(pm(entry["eval"]["loss"]))
        row += [pm(entry["eval"][name]) for name in calibration]
        rows.append(row)
    return _align(rows)


def _pm(stats: dict[str, float], *, seeds: int) -> str:
    # One seed has no spread to show: "± 0.0000" would claim a measured one.
    if seeds < 2:
        return f"{stats['mean']:.4f}"
    return f"{stats['mean']:.4f} ± {stats['std']:.4f}"


def seed_curves(curves: Sequence[Sequence[tuple[int, float]]]) -> tuple[list[int], np.ndarray]:
    """The steps every seed evaluated at, and ``values[seed, i]`` at those steps.

    Seeds are matched by step, not by position: runs may evaluate on different
    schedules (``eval_every`` is not part of a run's identity, and checkpoints add
    evaluations), and a step evaluated twice keeps its last value.
    """
    by_step = [dict(curve) for curve in curves]
    steps = sorted(set.intersection(*(set(c) for c in by_step))) if by_step else []
    return steps, np.array([[c[s] for s in steps] for c in by_step], dtype=float)


def plot_comparison(
    example: Example,
    summary: dict[str, Any],
    runs: Sequence[tuple[float, int, RunResult]],
    path: pathlib.Path,
) -> None:
    """Held-out curves per rate (mean, min-max band over seeds), final metric and gap."""
    metric = summary["best_metric"]
    fig = _figure(3)
    ax_curve, ax_final, ax_gap = fig.subplots(1, 3)
    colors = require("matplotlib").colormaps["viridis"](
        np.linspace(0.0, 0.85, len(summary["rates"]))
    )
    keys = list(summary["rates"])
    for color, key in zip(colors, keys, strict=True):
        entry = summary["rates"][key]
        curves = []
        for run in entry["runs"]:
            rows = read_metrics(pathlib.Path(run["workdir"]) / "metrics.jsonl")
            curves.append([(r["step"], r[metric]) for r in rows if r["split"] == "eval"])
        steps, values = seed_curves(curves)
        ax_curve.plot(steps, values.mean(0), color=color, label=f"rate {key}")
        ax_curve.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.2)
    ax_curve.set(xlabel="step", title=f"held-out {metric} (band: min-max over seeds)")
    ax_curve.legend()
    x = np.array([summary["rates"][k]["rate"] for k in keys])
    for split, marker in (("eval", "o"), (GAP_SPLIT, "s")):
        if split not in summary["rates"][keys[0]]:
            continue
        stats = [summary["rates"][k][split][metric] for k in keys]
        line = ax_final.errorbar(
            x,
            [s["mean"] for s in stats],
            yerr=[s["std"] for s in stats],
            marker=marker,
            capsize=4,
            label="held-out" if split == "eval" else "training data",
        )
        color = line.lines[0].get_color()
        for k in keys:
            seeds = [run["final"][split][metric] for run in summary["rates"][k]["runs"]]
            rate = summary["rates"][k]["rate"]
            ax_final.scatter([rate] * len(seeds), seeds, s=10, alpha=0.5, color=color)
    ax_final.set(xlabel="dropout rate", title=f"final {metric} (mean ± std over seeds)")
    ax_final.legend()
    if "gap" in summary["rates"][keys[0]]:
        stats = [summary["rates"][k]["gap"][metric] for k in keys]
        ax_gap.errorbar(
            x, [s["mean"] for s in stats], yerr=[s["std"] for s in stats], marker="o", capsize=4
        )
    ax_gap.set(xlabel="dropout rate", title=f"generalization gap ({metric}: train - held-out)")
    for ax in (ax_curve, ax_final, ax_gap):
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
