"""Reporting for the digits demo: a text table, a JSON of metrics, a PNG of curves."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .configs import Config
    from .train import History


def final_metrics(history: History) -> dict[str, float]:
    """Last evaluation of a run, plus the generalization gaps (train minus test)."""
    final = {
        "train_accuracy": history.train_accuracy[-1],
        "test_accuracy": history.test_accuracy[-1],
        "train_loss": history.train_loss[-1],
        "test_loss": history.test_loss[-1],
    }
    final["accuracy_gap"] = final["train_accuracy"] - final["test_accuracy"]
    final["loss_gap"] = final["test_loss"] - final["train_loss"]
    return final


def table(histories: Sequence[History]) -> str:
    """A plain aligned table of final metrics, one row per run."""
    header = (
        "run",
        "train acc",
        "test acc",
        "acc gap",
        "train loss",
        "test loss",
        "loss gap",
        "time",
    )
    rows = [header]
    for h in histories:
        m = final_metrics(h)
        rows.append(
            (
                h.name,
                f"{m['train_accuracy']:.1%}",
                f"{m['test_accuracy']:.1%}",
                f"{m['accuracy_gap']:.1%}",
                f"{m['train_loss']:.3f}",
                f"{m['test_loss']:.3f}",
                f"{m['loss_gap']:.3f}",
                f"{h.seconds:.1f}s",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def save_json(config: Config, histories: Sequence[History], path: pathlib.Path) -> None:
    """Writes the config, each run's final metrics and its full curves to ``path``."""
    payload: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "runs": [{**dataclasses.asdict(h), "final": final_metrics(h)} for h in histories],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


def plot(histories: Sequence[History], path: pathlib.Path) -> None:
    """Saves accuracy and loss curves (train solid, test dashed) as a PNG at ``path``."""
    # Figure() renders with the Agg canvas without touching pyplot's global backend.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_acc, ax_loss = fig.subplots(1, 2)
    for color, h in zip(
        ("tab:red", "tab:blue", "tab:green", "tab:purple"), histories, strict=False
    ):
        ax_acc.plot(h.epoch, h.train_accuracy, color=color, label=f"{h.name} train")
        ax_acc.plot(h.epoch, h.test_accuracy, color=color, ls="--", label=f"{h.name} test")
        ax_loss.plot(h.epoch, h.train_loss, color=color, label=f"{h.name} train")
        ax_loss.plot(h.epoch, h.test_loss, color=color, ls="--", label=f"{h.name} test")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="Accuracy (deterministic eval)")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", yscale="log", title="Loss")
    ax_acc.legend(loc="lower right")
    ax_loss.legend(loc="lower left")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
