"""The one training loop every example shares: devices, checkpoints, resume, logging.

``train`` runs one config in one workdir; ``compare_rates`` runs it for several
dropout rates and seeds, each in its own subdirectory, and reports the spread.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from .._errors import DropmaskValueError, user_error
from .._workflow import SCHEDULE_ENTRIES, Example, run_keys
from . import _summary, _uncertainty
from ._checkpoint import Checkpointer, config_difference
from ._config import check_config
from ._errors import CheckpointError, DamagedCheckpointError, NonFiniteLossError
from ._logging import MetricsLog, require
from ._parallel import check_batch_splits, make_mesh, replicate, shard_batch
from ._rate_schedule import RateSchedule
from ._result import RunResult

__all__ = ["RunResult", "compare_rates", "train"]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The loop's config entries, checked once: when to log, evaluate and save.

    Its fields are the table's scheduled entries (``SCHEDULE_ENTRIES``), which
    :meth:`from_config` reads and checks.
    """

    seed: int
    steps: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    keep_checkpoints: int
    allow_nonfinite_loss: bool = False
    evaluate_at_checkpoints: bool = True

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> Schedule:
        """Reads and validates the scheduled entries of :func:`base_config` from ``config``.

        Raises:
          DropmaskValueError: an int entry is missing, not an int, or below its
            minimum, or a bool entry (optional, its default when absent) is not a bool.
        """
        values: dict[str, Any] = {}
        least: dict[str, int] = {}
        for entry in SCHEDULE_ENTRIES:
            if isinstance(entry.default, bool):
                value = config.get(entry.name, entry.default)
                if not isinstance(value, bool):
                    raise user_error(
                        DropmaskValueError,
                        f"config.{entry.name} must be a bool, got {value!r}",
                        f"Set it with --config.{entry.name}=True or False.",
                        caller=None,
                    )
                values[entry.name] = value
            elif entry.at_least is None:
                value = config.get(entry.name)
                if not isinstance(value, int) or isinstance(value, bool):
                    raise user_error(
                        DropmaskValueError,
                        f"config.{entry.name} must be an int, got {value!r}",
                        f"Set it with --config.{entry.name}=N.",
                        caller=None,
                    )
                values[entry.name] = value
            else:
                least[entry.name] = entry.at_least
        check_config(config, at_least=least)
        values.update((name, config.get(name)) for name in least)
        return cls(**values)

    def saves(self, done: int) -> bool:
        """Whether a checkpoint is written after step ``done`` (always after the last)."""
        every = self.checkpoint_every
        return done == self.steps or (every > 0 and done % every == 0)

    def evaluates(self, done: int) -> bool:
        """Whether the eval splits are evaluated after step ``done`` (always after the
        last; at a checkpoint when ``evaluate_at_checkpoints``, so that it can be ranked
        as the best)."""
        scheduled = done == self.steps or done % self.eval_every == 0
        return scheduled or (self.evaluate_at_checkpoints and self.saves(done))


def checkpoint_steps(workdir: pathlib.Path) -> list[int]:
    """Steps of the complete checkpoints under ``workdir/checkpoints`` (none: ``[]``)."""
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def check_writable(workdir: pathlib.Path) -> None:
    """Refuses a workdir that is a file, or that cannot be created or written.

    Raises:
      DropmaskValueError: ``workdir`` (or one of its parents) is not a directory,
        or the nearest existing one is not writable.
    """
    workdir = workdir.absolute()
    existing = next(p for p in (workdir, *workdir.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == workdir else f"cannot be created: {existing} is a file"
        raise user_error(
            DropmaskValueError,
            f"workdir must be a directory, but {workdir} {what}",
            "Pass --workdir a directory path (it is created if missing).",
            caller="train",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise user_error(
            DropmaskValueError,
            f"workdir must be writable, but {existing} is not writable by this user",
            "Pass --workdir a directory you can write to.",
            caller="train",
        )


def check_workdir(workdir: pathlib.Path, *, resume: bool) -> None:
    """Refuses an unusable workdir, to overwrite a run's checkpoints, and to resume a run
    that has none.

    Raises:
      DropmaskValueError: ``workdir`` is a file, or cannot be created or written.
      CheckpointError: ``workdir`` has checkpoints and ``resume`` is False, or it
        has none and ``resume`` is True.
    """
    check_writable(workdir)
    steps = checkpoint_steps(workdir)
    if steps and not resume:
        raise CheckpointError(
            f"{workdir} already holds checkpoints (steps {steps}); pass --resume to continue "
            f"that run, or choose another --workdir."
        )
    if resume and not steps:
        raise CheckpointError(
            f"--resume found no checkpoint in {workdir / 'checkpoints'}. Drop --resume to "
            f"start a new run there, or point --workdir at an earlier run."
        )


def train(
    example: Example,
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    *,
    resume: bool = False,
    devices: int | None = None,
    progress: bool = True,
    label: str | None = None,
    config_name: str | None = None,
) -> RunResult:
    """Trains ``example`` with ``config``, writing everything to ``workdir``.

    The global batch of step ``s`` is ``example.train_batch(config, data, data_key,
    s)``, sharded over a ``'data'`` mesh of ``devices`` local devices per process;
    the state is replicated. Every ``log_every`` steps a ``train`` row (the mean of
    the step metrics) goes to ``metrics.jsonl`` and TensorBoard; every
    ``eval_every`` steps and at the end each of ``example.eval_splits`` is
    evaluated; every ``checkpoint_every`` steps and at the end a checkpoint is
    saved, and evaluated too unless ``config.evaluate_at_checkpoints`` is False (then
    only the checkpoints at evaluated steps can be kept as the best). At the end
    ``summary.json`` and ``curves.png`` are written.

    Args:
      example: the application.
      config: its config (e.g. ``example.get_config()`` with overrides).
      workdir: the run directory; created if missing.
      resume: continue from the latest checkpoint in ``workdir/checkpoints``.
      devices: local devices per process to shard the batch over (all if ``None``).
      progress: show a progress bar with the live loss and throughput.
      label: the progress bar's title.
      config_name: the example's named config that ``config`` started from
        (``dropmask train --config NAME``); ``None``: its default. Each checkpoint
        records it, so that a resume whose config differs, started from another,
        names the one to pass again.

    Returns:
      A :class:`RunResult`.

    A damaged latest checkpoint (files that cannot be read back) is moved to
    ``workdir/damaged_checkpoints/`` with a one-line note on stderr, and the run
    resumes from the newest complete one: resuming is exact, so the steps in between
    give the same state again. Nothing is deleted.

    Raises:
      CheckpointError: ``workdir`` has checkpoints but ``resume`` is False, or
        ``resume`` is True and there are none, or they belong to another config,
        model or data pipeline, or the latest is past ``config.steps``, or none is
        complete.
      NonFiniteLossError: a step's loss was NaN or infinite (unless
        ``config.allow_nonfinite_loss``); nothing after the last checkpoint is saved.
      DropmaskValueError: a bad config entry or device count, or a workdir that is
        a file or not writable.

    Example:
      >>> import os, tempfile
      >>> from dropmask.examples.digits.train import example  # the bundled digits
      >>> config = example.get_tiny_config()
      >>> config.steps = 2
      >>> with tempfile.TemporaryDirectory() as workdir:
      ...     result = train(example, config, workdir, devices=1, progress=False)
      ...     written = sorted(os.listdir(workdir))
      >>> len(result.losses), sorted(result.final)  # a loss per step, the last evaluation
      (2, ['eval', 'train_eval'])
      >>> written
      ['checkpoints', 'curves.png', 'metrics.jsonl', 'summary.json', 'tensorboard']
    """
    started = time.perf_counter()
    workdir = pathlib.Path(workdir)
    schedule = Schedule.from_config(config)
    rates = RateSchedule.from_config(config)
    _uncertainty.check(example, config)
    check_workdir(workdir, resume=resume)
    mesh = make_mesh(devices)
    checkpointer, data, data_key, state, start = _start(
        example, config, workdir, schedule, mesh, resume=resume, config_name=config_name
    )
    primary = jax.process_index() == 0
    log = MetricsLog(workdir, start=start, enabled=primary)
    bar = _progress_bar(schedule, start, label or example.name, progress and primary, label)
    try:
        losses, final = _run_steps(
            example,
            config,
            config_name,
            schedule,
            rates,
            mesh,
            checkpointer,
            data,
            data_key,
            state,
            start,
            log,
            bar,
        )
    finally:
        bar.close()
        log.close()
        checkpointer.close()
    result = RunResult(
        workdir=workdir,
        start_step=start,
        steps=schedule.steps,
        losses=losses,
        final=final,
        wall_seconds=time.perf_counter() - started,
        config=config.to_dict(),
    )
    if primary:
        _summary.write_run(result, example)
    return result


def _progress_bar(schedule: Schedule, start: int, desc: str, show: bool, label: str | None) -> Any:
    """The progress bar over the run's steps; a labelled bar (one of several runs) is
    cleared when it closes."""
    return require("tqdm").tqdm(
        total=schedule.steps,
        initial=start,
        desc=desc,
        unit="step",
        disable=not show,
        leave=label is None,
        dynamic_ncols=True,
    )


def _run_steps(
    example: Example,
    config: ml_collections.ConfigDict,
    config_name: str | None,
    schedule: Schedule,
    rates: RateSchedule | None,
    mesh: Any,
    checkpointer: Checkpointer,
    data: Any,
    data_key: Any,
    state: Any,
    start: int,
    log: MetricsLog,
    bar: Any,
) -> tuple[list[float], dict[str, dict[str, float]]]:
    """Steps ``start`` to ``schedule.steps``, logging, evaluating and saving on schedule:
    ``(every step's loss, the last evaluation)``."""
    losses: list[float] = []
    window: list[Any] = []
    final: dict[str, dict[str, float]] = {}
    window_start = time.perf_counter()
    for step in range(start, schedule.steps):
        batch = shard_batch(example.train_batch(config, data, data_key, step), mesh)
        batch_size = len(next(iter(batch.values())))
        if rates is not None:
            batch = {**batch, "rate": replicate(rates(step), mesh)}
        state, metrics = example.train_step(state, batch)
        window.append(metrics)
        done = step + 1
        saving = schedule.saves(done)
        log_row = done % schedule.log_every == 0 or done == schedule.steps
        evaluating = schedule.evaluates(done)
        if not schedule.allow_nonfinite_loss and (log_row or saving or evaluating):
            # Checked where the loop syncs with the devices anyway, before
            # anything of these steps is logged, evaluated or saved.
            _check_finite(jax.device_get(window), done - len(window) + 1, checkpointer)
        if log_row:
            host = jax.device_get(window)
            means = {name: float(np.mean([m[name] for m in host])) for name in host[0]}
            losses.extend(float(m["loss"]) for m in host)
            per_second = len(window) * batch_size / (time.perf_counter() - window_start)
            window, window_start = [], time.perf_counter()
            log.write(done, "train", means)
            bar.set_postfix(loss=f"{means['loss']:.4f}", ex_per_s=f"{per_second:,.0f}")
        bar.update(1)
        if evaluating:
            final = _evaluate(example, state, config, data, log, done)
        if saving:
            position = example.position(config, data, done)
            checkpointer.save(
                done,
                state,
                config=config.to_dict(),
                data_position=position,
                # Only this step's metrics rank a checkpoint as the best.
                metrics=final.get("eval") if evaluating else None,
                config_name=config_name,
            )
    if start >= schedule.steps:
        # Nothing left to train: report the restored state without logging its
        # evaluation a second time.
        final = _evaluate(example, state, config, data, None, start)
    return losses, final


def _start(
    example: Example,
    config: ml_collections.ConfigDict,
    workdir: pathlib.Path,
    schedule: Schedule,
    mesh: Any,
    *,
    resume: bool,
    config_name: str | None,
) -> tuple[Checkpointer, Any, jax.Array, Any, int]:
    """Opens the checkpoints, loads the data, builds (or restores) the placed state.

    Returns:
      ``(checkpointer, data, data_key, state, start_step)``.
    """

    def open_checkpoints() -> Checkpointer:
        return Checkpointer(
            workdir / "checkpoints",
            keep=schedule.keep_checkpoints,
            best_metric=example.best_metric,
            best_mode=example.best_mode,
        )

    start, checkpointer, damaged = 0, None, []
    try:
        if resume:
            # Refuse another config, or a run already past config.steps, before
            # loading data or building a model.
            checkpointer = open_checkpoints()
            start = _readable_step(checkpointer, config, damaged, config_name)
            if start > schedule.steps:
                raise CheckpointError(
                    f"--resume: the latest checkpoint in {checkpointer.directory} is step "
                    f"{start}, past config.steps={schedule.steps}; nothing was changed. "
                    f"Pass --steps above {start} to train on, or --steps {start} to "
                    f"evaluate it."
                )
        data = example.load_data(config)
        data_key, params_key, dropout_key = run_keys(schedule.seed)
        check_batch_splits(example.train_batch(config, data, data_key, start), mesh)
        # The example checks its config entries in load_data and create_state: a new
        # run refuses a bad one before it creates a directory or starts orbax's threads.
        state = replicate(example.build_state(config, data, params_key, dropout_key), mesh)
        checkpointer = checkpointer or open_checkpoints()
        if resume:
            state, start = _restore_complete(
                checkpointer, example, config, data, state, start, damaged, workdir, config_name
            )
    except BaseException:
        if checkpointer is not None:
            checkpointer.close()
        raise
    return checkpointer, data, data_key, state, start


def _restore_complete(
    checkpointer: Checkpointer,
    example: Example,
    config: ml_collections.ConfigDict,
    data: Any,
    target: Any,
    start: int,
    damaged: list[DamagedCheckpointError],
    workdir: pathlib.Path,
    config_name: str | None,
) -> tuple[Any, int]:
    """Restores checkpoint ``start``, or the newest complete one before it.

    Each damaged checkpoint is moved to ``workdir/damaged_checkpoints/`` (never
    deleted) with a one-line note, so that the run can save its step again.

    Returns:
      ``(state, step)``: the restored state and its step.
    """
    while True:
        try:
            state, _ = checkpointer.restore(
                target,
                config=config.to_dict(),
                step=start,
                data_position=example.position(config, data, start),
            )
            break
        except DamagedCheckpointError as error:
            damaged.append(error)
            start = _readable_step(checkpointer, config, damaged, config_name)
    for error in damaged:
        moved = checkpointer.set_aside(error.step, workdir / "damaged_checkpoints")
        if jax.process_index() == 0:
            print(
                f"dropmask: checkpoint {error.step} at {error.path} is damaged: {error.why}; "
                f"moved it to {moved} and resumed from checkpoint {start}, the newest "
                f"complete one (resuming is exact: the steps after {start} give the same "
                f"state again).",
                file=sys.stderr,
            )
    return state, start


def _readable_step(
    checkpointer: Checkpointer,
    config: ml_collections.ConfigDict,
    damaged: list[DamagedCheckpointError],
    config_name: str | None,
) -> int:
    """The newest checkpoint whose record reads and matches ``config``, skipping
    the ones in ``damaged`` and adding to it those found damaged here.

    Raises:
      CheckpointError: a readable checkpoint was saved with another config (the
        message names the named config it started from, when that differs from
        ``config_name``, else the entry), or no checkpoint is readable (the message
        names the damaged ones, kept as they are).
    """
    skip = {error.step for error in damaged}
    for step in reversed(checkpointer.steps()):
        if step in skip:
            continue
        try:
            record = checkpointer.record(step)
        except DamagedCheckpointError as error:
            damaged.append(error)
            continue
        _check_named_config(record, config, config_name, checkpointer.directory)
        return int(checkpointer.check_config(config.to_dict(), step)["step"])
    steps = ", ".join(str(error.step) for error in damaged)
    are = "steps {} are" if len(damaged) > 1 else "step {} is"
    raise CheckpointError(
        f"--resume found no complete checkpoint in {checkpointer.directory}: "
        f"{are.format(steps)} damaged (checkpoint {damaged[0].step}: {damaged[0].why}) "
        f"and kept as they are. Train in another --workdir, without --resume"
    )


def _check_named_config(
    record: dict[str, Any],
    config: ml_collections.ConfigDict,
    config_name: str | None,
    directory: pathlib.Path,
) -> None:
    """Refuses a resume from another named config than the checkpoint's, naming it, when
    the configs differ (a record without ``config_name`` predates it: the entries decide)."""
    if "config_name" not in record or record["config_name"] == config_name:
        return
    difference = config_difference(record["config"], config.to_dict())
    if difference is None:
        return
    name, there, here = difference

    def start(config_name: str | None) -> str:
        return "the default config" if config_name is None else f"--config {config_name}"

    again = (
        "without --config"
        if record["config_name"] is None
        else f"with --config {record['config_name']} (pass it again)"
    )
    raise CheckpointError(
        f"--resume: checkpoint {record['step']} in {directory} was made with "
        f"{start(record['config_name'])}, but this run starts from {start(config_name)} "
        f"(config.{name} is {there!r} there and {here!r} here). Resume {again}, or train "
        f"in a new workdir."
    )


def _check_finite(host_metrics: list[Any], first_step: int, checkpointer: Checkpointer) -> None:
    """Raises at the first of these steps (``first_step``, ...) whose loss is not finite."""
    for offset, metrics in enumerate(host_metrics):
        loss = float(metrics["loss"])
        if not math.isfinite(loss):
            latest = checkpointer.latest_step()
            saved = (
                f"the latest checkpoint is step {latest}"
                if latest is not None
                else "no checkpoint was saved"
            )
            step = first_step + offset
            again = "resume with --resume" if latest is not None else "train again"
            raise NonFiniteLossError(
                f"train: the loss is {loss} at step {step}, so the run stopped there and "
                f"saved nothing after it ({saved}). Lower config.learning_rate or check the "
                f"data, then {again}; to train on past non-finite losses (e.g. with "
                f"optax.apply_if_finite), set --config.allow_nonfinite_loss=True",
                step=step,
            )


def _evaluate(
    example: Example,
    state: Any,
    config: ml_collections.ConfigDict,
    data: Any,
    log: MetricsLog | None,
    step: int,
) -> dict[str, dict[str, float]]:
    out = {}
    for split in example.eval_splits:
        metrics = {k: float(v) for k, v in example.evaluate(state, config, data, split).items()}
        metrics.update(_uncertainty.metrics(example, state, config, data, split, step))
        if log is not None:
            log.write(step, split, metrics)
        out[split] = metrics
    return out


def run_dir(workdir: pathlib.Path, rate: float, seed: int) -> pathlib.Path:
    """Where :func:`compare_rates` puts the run of one rate and seed."""
    return workdir / f"rate_{rate:g}" / f"seed_{seed}"


def compare_rates(
    example: Example,
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    rates: Sequence[float],
    seeds: Sequence[int],
    *,
    resume: bool = False,
    devices: int | None = None,
    progress: bool = True,
    config_name: str | None = None,
) -> dict[str, Any]:
    """Trains one run per (rate, seed), same data, and reports the spread per rate.

    Each run is :func:`train` with ``config.rate`` and ``config.seed`` replaced, in
    ``workdir/rate_R/seed_S``. Then ``workdir/summary.json`` (per rate: mean, std,
    min and max over seeds of each split's metrics, and of the generalization gap)
    and ``workdir/curves.png`` are written.

    Args:
      example: the application.
      config: the base config.
      workdir: the comparison's directory.
      rates: dropout rates, e.g. ``(0.0, 0.3, 0.6)``.
      seeds: seeds per rate, e.g. ``(0, 1, 2)``.
      resume: continue the runs that have checkpoints and start the others.
      devices: see :func:`train`.
      progress: show a progress bar per run.
      config_name: see :func:`train`.

    Returns:
      The contents of ``summary.json``.

    Raises:
      CheckpointError: a run directory already holds checkpoints and ``resume`` is
        False (checked for every run before any training).
      DropmaskValueError: no rates or seeds, or a rate outside ``[0, 1)``.

    Example:
      >>> import tempfile
      >>> from dropmask.examples.digits.train import example  # the bundled digits
      >>> config = example.get_tiny_config()
      >>> config.steps = 2
      >>> with tempfile.TemporaryDirectory() as workdir:
      ...     summary = compare_rates(example, config, workdir, rates=(0.0, 0.5), seeds=(0,),
      ...                             devices=1, progress=False)
      >>> sorted(summary["rates"]), sorted(summary["rates"]["0.5"]["eval"]["accuracy"])
      (['0', '0.5'], ['max', 'mean', 'min', 'std'])
    """
    started = time.perf_counter()
    workdir = pathlib.Path(workdir)
    if not rates or not seeds:
        raise user_error(
            DropmaskValueError,
            f"compare_rates needs at least one rate and one seed, got rates={list(rates)} and "
            f"seeds={list(seeds)}",
            caller=None,
        )
    for rate in rates:
        if not 0.0 <= rate < 1.0:
            raise user_error(
                DropmaskValueError,
                f"each rate to compare must be in [0, 1), got {rate!r}",
                "Pass e.g. --compare-rates 0,0.3,0.6.",
                caller=None,
            )
    if not resume:
        for rate in rates:
            for seed in seeds:
                check_workdir(run_dir(workdir, rate, seed), resume=False)
    runs = []
    for rate in rates:
        for seed in seeds:
            run_config = config.copy_and_resolve_references()
            run_config.rate = float(rate)
            run_config.seed = int(seed)
            directory = run_dir(workdir, rate, seed)
            result = train(
                example,
                run_config,
                directory,
                resume=resume and bool(checkpoint_steps(directory)),
                devices=devices,
                progress=progress,
                label=f"rate {rate:g} seed {seed}",
                config_name=config_name,
            )
            runs.append((rate, seed, result))
    summary = _summary.summarize_comparison(example, config, runs)
    summary["wall_seconds"] = time.perf_counter() - started
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        _summary.plot_comparison(example, summary, runs, workdir / "curves.png")
    return summary
