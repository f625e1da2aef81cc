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

    Example:
      >>> import tempfile
      >>> from dropmask.training import train
      >>> from dropmask.examples.digits.train import example  # the bundled digits
      >>> config = example.get_tiny_config()
      >>> config.steps = 2
      >>> with tempfile.TemporaryDirectory() as workdir:
      ...     first = train(example, config, workdir, devices=1, progress=False)
      ...     config.steps = 3  # resume the same run for one more step
      ...     more = train(example, config, workdir, resume=True, devices=1, progress=False)
      >>> (first.start_step, len(first.losses)), (more.start_step, len(more.losses))
      ((0, 2), (2, 1))
    """

    workdir: pathlib.Path
    start_step: int
    steps: int
    losses: list[float]
    final: dict[str, dict[str, float]]
    wall_seconds: float
    config: dict[str, Any]
