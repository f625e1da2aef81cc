"""The config entries every run has: one table, read by everything that lists them.

:func:`~dropmask.training.base_config` builds a config from it; the training loop
checks and reads its schedule from it; the compile cache leaves its per-run entries
out of a config's identity; a checkpoint's restore compares every config entry but
those that only say how long or how often a run does things. A new entry is one row.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ENTRIES", "PER_RUN_ENTRIES", "RUN_LENGTH_ENTRIES", "SCHEDULE_ENTRIES", "Entry"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One config entry of the loop.

    Attributes:
      name: the entry, as in ``config.NAME`` and ``--config.NAME=``.
      default: its value in :func:`~dropmask.training.base_config`.
      meaning: what it sets, for the docs.
      per_run: it varies between the runs of one config but never shapes the model or
        optimizer, so runs that differ only in it share each compilation.
      run_length: it says how long, how often or how a run is evaluated, or how it
        reacts to a non-finite loss: a run resumed with another value is extended,
        re-evaluated or let past a bad batch, so a restore does not compare it.
      schedule: the loop's schedule (when to log, evaluate and save) reads and checks
        it: a bool may be absent (``default`` then), an int must be present.
      at_least: the least value of a scheduled int; ``None``: any int.
    """

    name: str
    default: int | float | bool
    meaning: str
    per_run: bool
    run_length: bool
    schedule: bool = False
    at_least: int | None = None


ENTRIES: tuple[Entry, ...] = (
    Entry("seed", 0, "root of all randomness", per_run=True, run_length=False, schedule=True),
    # Not per-run: a learning-rate schedule may end at it.
    Entry(
        "steps",
        1000,
        "train steps in total",
        per_run=False,
        run_length=True,
        schedule=True,
        at_least=1,
    ),
    Entry(
        "rate",
        0.1,
        "the dropout rate that --rate and --compare-rates set",
        per_run=False,
        run_length=False,
    ),
    Entry(
        "log_every",
        50,
        "steps per train row of metrics.jsonl",
        per_run=True,
        run_length=True,
        schedule=True,
        at_least=1,
    ),
    Entry(
        "eval_every",
        200,
        "steps between evaluations",
        per_run=True,
        run_length=True,
        schedule=True,
        at_least=1,
    ),
    Entry(
        "checkpoint_every",
        500,
        "steps between checkpoints; the last step is always saved",
        per_run=True,
        run_length=True,
        schedule=True,
        at_least=0,
    ),
    Entry(
        "keep_checkpoints",
        3,
        "how many of the latest checkpoints to keep, besides the best",
        per_run=True,
        run_length=True,
        schedule=True,
        at_least=1,
    ),
    Entry(
        "mc_samples",
        0,
        "dropout samples of the Monte Carlo evaluation beside the deterministic one; 0: none",
        per_run=True,
        run_length=True,
    ),
    Entry(
        "allow_nonfinite_loss",
        False,
        "False: a NaN or infinite train loss stops the run at that step; True: train on, for "
        "steps that skip bad updates such as optax.apply_if_finite (a non-finite state is "
        "never saved either way)",
        per_run=True,
        run_length=True,
        schedule=True,
    ),
    Entry(
        "evaluate_at_checkpoints",
        True,
        "True: every checkpoint is also evaluated, so that any of them can be kept as the "
        "best; False: only at eval_every steps and the last, for runs whose evaluation "
        "costs much of their time",
        per_run=True,
        run_length=True,
        schedule=True,
    ),
)

PER_RUN_ENTRIES: tuple[str, ...] = tuple(e.name for e in ENTRIES if e.per_run)
RUN_LENGTH_ENTRIES: frozenset[str] = frozenset(e.name for e in ENTRIES if e.run_length)
SCHEDULE_ENTRIES: tuple[Entry, ...] = tuple(e for e in ENTRIES if e.schedule)
