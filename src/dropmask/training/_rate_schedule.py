"""``config.rate_schedule``: the dropout rate as a function of the step, for the loop.

An example opts in by having a ``rate_schedule`` entry in its config (``"constant"`` by
default) and by reading ``batch["rate"]`` in its train step when it is there. For any
other schedule the loop puts this step's rate into the batch as a replicated float32
scalar: a run-time value, so the train step compiles once for the whole run. The rate
depends only on the config and the step, both in every checkpoint, so a resumed run
continues the schedule exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from .. import _schedules
from .._errors import DropmaskValueError, user_error

__all__ = ["RateSchedule"]

_KINDS = ("early", "late", "warmdown")
_FORMS = "'constant', 'early:STEP', 'late:STEP' or 'warmdown:STEP'"


@dataclasses.dataclass(frozen=True)
class RateSchedule:
    """A parsed ``config.rate_schedule``, applied to ``config.rate``.

    Attributes:
      kind: ``"early"`` (``rate`` before ``step``, 0 from it: early dropout),
        ``"late"`` (0 before ``step``, ``rate`` from it) or ``"warmdown"`` (``rate``
        falling linearly to 0 at ``step``).
      step: the step where the schedule switches.
      rate: ``config.rate``.

    Example:
      >>> schedule = RateSchedule("early", step=2, rate=0.5)  # early dropout
      >>> [float(schedule(step)) for step in range(4)]
      [0.5, 0.5, 0.0, 0.0]
    """

    kind: str
    step: int
    rate: float

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> RateSchedule | None:
        """The config's schedule; None without a ``rate_schedule`` entry or for ``"constant"``.

        Raises:
          DropmaskValueError: a ``rate_schedule`` not of the forms above.

        Example:
          >>> config = ml_collections.ConfigDict({"rate": 0.1, "rate_schedule": "early:50"})
          >>> RateSchedule.from_config(config)
          RateSchedule(kind='early', step=50, rate=0.1)
        """
        text = config.get("rate_schedule")
        if text is None or text == "constant":
            return None
        kind, _, number = str(text).partition(":")
        if kind not in _KINDS or not number.isdigit() or (kind == "warmdown" and int(number) < 1):
            raise user_error(
                DropmaskValueError,
                f"--config.rate_schedule must be {_FORMS} (STEP a step count, >= 1 for "
                f"warmdown), got {text!r}. E.g. --config.rate_schedule=early:200",
                caller=None,
            )
        rate: Any = config.rate
        return cls(kind, int(number), float(rate))

    def __call__(self, step: int) -> np.ndarray:
        """The rate at ``step``: a float32 NumPy scalar, from :mod:`dropmask`'s schedules."""
        value: Any
        if self.kind == "early":
            value = _schedules.early_dropout(step, self.rate, until=self.step)
        elif self.kind == "late":
            value = _schedules.late_dropout(step, self.rate, start=self.step)
        else:
            value = _schedules.linear_warmdown(step, self.rate, until=self.step)
        return np.asarray(value, np.float32)
