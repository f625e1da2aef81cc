"""Where a run's numbers go: ``metrics.jsonl``, TensorBoard events, and the progress bar."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

from .._optional import require
from ._errors import DataError

__all__ = ["MetricsLog", "read_metrics", "require"]


class MetricsLog:
    """Appends one JSON object per logged step and split, mirrored to TensorBoard.

    On resume from step ``start``, lines for later steps (written by the interrupted
    run after its last checkpoint) are dropped, and TensorBoard is told to purge them,
    so every step appears once.

    Args:
      workdir: the run directory; ``metrics.jsonl`` and ``tensorboard/`` go there.
      start: the step training starts from (0, or the restored checkpoint's step).
      enabled: False in every process but the first of a multi-process run.
    """

    def __init__(self, workdir: pathlib.Path, *, start: int, enabled: bool = True) -> None:
        self.path = workdir / "metrics.jsonl"
        self.enabled = enabled
        self._writer: Any = None
        if not enabled:
            return
        workdir.mkdir(parents=True, exist_ok=True)
        kept = [row for row in read_metrics(self.path) if row["step"] <= start]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        tensorboard = require("tensorboardX")
        self._writer = tensorboard.SummaryWriter(
            str(workdir / "tensorboard"), purge_step=start if start else None, flush_secs=30
        )

    def write(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        """Records ``metrics`` of ``split`` (``'train'``, ``'eval'``, ...) at ``step``."""
        if not self.enabled:
            return
        row = {"step": int(step), "split": split, **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for name, value in metrics.items():
            self._writer.add_scalar(f"{split}/{name}", float(value), int(step))

    def close(self) -> None:
        """Flushes the TensorBoard events."""
        if self._writer is not None:
            self._writer.close()


def read_metrics(path: pathlib.Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file (empty when it does not exist).

    A last line without its newline is a row a killed run was writing; it is
    dropped (it is past any checkpoint, so a resumed run writes it again).

    Raises:
      DataError: another line is not a JSON row with a ``step``; names the line.
    """
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise DataError(
                f"{path}:{number}: expected a JSON row with a step, got {line[:60]!r}. "
                f"Fix or delete that line (the metrics log of the run in this workdir)."
            )
        rows.append(row)
    return rows
