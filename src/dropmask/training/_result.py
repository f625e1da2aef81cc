"""What a training run returns: read by the loop's callers and by the report writer."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

__all__ = ["RunResult"]


@dataclasses.dataclass
class RunResult:
    """What one call of :func:`train` did.

    Attributes:
      workdir: the run directory.
      start_step: the step training started from (0, or the restored checkpoint's).
      steps: the step it ended at (``config.steps``).
      losses: the train loss of every step run by this call, in order.
      final: ``{split: {metric: value}}`` of the last evaluation.
      wall_seconds: wall time of this call, compilation included.
      config: the config as a plain dict.
    """

    workdir: pathlib.Path
    start_step: int
    steps: int
    losses: list[float]
    final: dict[str, dict[str, float]]
    wall_seconds: float
    config: dict[str, Any]
