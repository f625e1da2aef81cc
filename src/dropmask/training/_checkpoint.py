"""Checkpoints on orbax-checkpoint: exact resume, keep the last N and the best.

A checkpoint holds every leaf of the train state (params, optimizer state, step, the
PRNG key as key data) plus a JSON record: the key impls, each leaf's path, shape and
dtype, the config and the named config it started from, the data pipeline's position
and the eval metrics. Orbax writes a step into a temporary directory and renames it
only once complete, so a run killed mid-save leaves the previous checkpoints as they
were; the partial directory is ignored and cleaned up by the next run.

A save either writes its step or raises, naming the step and why: orbax on its own
declines some saves by returning ``False`` (a step that exists, a step older than
the latest, its save-interval policy), which would let a caller believe a state is
saved that is not. Here those cases are checked first and orbax is told to write
(``force=True``), its return value is checked, and the step's directory must exist
once the write has finished. A checkpoint that cannot be read back raises
:class:`DamagedCheckpointError` naming its path, once every read orbax started on it has
finished (``_finished_reads.py``): none is left to print at exit.

orbax is imported by the methods that use it, not with this module: every example
imports :mod:`dropmask.training`, and ``dropmask audit`` runs examples without
writing a checkpoint.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._checks import check_choice, check_int_at_least
from .._errors import DropmaskValueError, user_error
from .._workflow import RUN_LENGTH_ENTRIES
from ._errors import CheckpointError, DamagedCheckpointError, SaveError
from ._finished_reads import reads_finish_before_loops_close
from ._serialization import keys_from_data, keys_to_data
from ._serialization import leaf_dtype as _dtype

__all__ = ["Checkpointer", "config_difference"]


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples become lists), for comparison."""
    return json.loads(json.dumps(value))


def config_difference(
    saved: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[str, Any, Any] | None:
    """``(entry, saved value, current value)`` of the first entry in which two configs
    differ, the run-length entries left out (``'<absent>'`` for a missing one); None
    when they agree."""
    saved, current = _plain(dict(saved)), _plain(dict(current))
    for name in sorted((set(saved) | set(current)) - RUN_LENGTH_ENTRIES):
        if saved.get(name, "<absent>") != current.get(name, "<absent>"):
            return name, saved.get(name, "<absent>"), current.get(name, "<absent>")
    return None


def _first_line(error: BaseException, limit: int = 160) -> str:
    """An exception as one short line: its type and the start of its message."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _nonfinite_paths(tree: Any) -> list[str]:
    """Paths of the floating leaves of ``tree`` that hold a NaN or an infinity."""
    paths_leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    floating = [
        (jax.tree_util.keystr(path), leaf)
        for path, leaf in paths_leaves
        if np.issubdtype(_dtype(leaf), np.inexact)
    ]
    # One reduction per leaf, fetched together: a single sync with the devices.
    finite = jax.device_get([jax.numpy.isfinite(leaf).all() for _, leaf in floating])
    return [path for (path, _), ok in zip(floating, finite, strict=True) if not ok]


def _sync(name: str) -> None:
    """Waits for every process (a no-op in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _leaf_records(tree: Any) -> list[tuple[str, list[int], str]]:
    paths_leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [
        (jax.tree_util.keystr(path), list(np.shape(leaf)), str(_dtype(leaf)))
        for path, leaf in paths_leaves
    ]


class Checkpointer:
    """Saves and restores train states under ``directory``, one subdirectory per step.

    Args:
      directory: where the checkpoints live; created on the first save.
      keep: how many of the latest checkpoints to keep (at least 1).
      best_metric: an eval metric name; the checkpoint with its best value is kept
        besides the latest ``keep``. ``None`` keeps only the latest.
      best_mode: ``'max'`` (e.g. accuracy) or ``'min'`` (e.g. loss).

    Raises:
      DropmaskValueError: ``keep < 1``, ``best_mode`` is not ``'max'``/``'min'``, or
        ``directory`` (or a parent) is a file.

    Example:
      >>> import tempfile, jax, jax.numpy as jnp
      >>> state = {"w": jnp.ones(3), "key": jax.random.key(0), "step": jnp.int32(5)}
      >>> with tempfile.TemporaryDirectory() as d:
      ...     ckpt = Checkpointer(d, keep=2)
      ...     ckpt.save(5, state, config={"lr": 0.1}, data_position={"epoch": 0})
      ...     restored, record = ckpt.restore(state, config={"lr": 0.1})
      ...     ckpt.close()
      >>> record["step"], record["data_position"]
      (5, {'epoch': 0})
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep: int = 3,
        best_metric: str | None = None,
        best_mode: str = "max",
    ) -> None:
        keep = check_int_at_least(
            keep, 1, caller="Checkpointer", name="keep", why=" (checkpoints to keep)"
        )
        check_choice(best_mode, ("max", "min"), caller="Checkpointer", name="best_mode")
        self.directory = pathlib.Path(directory).absolute()
        existing = next(p for p in (self.directory, *self.directory.parents) if p.exists())
        if not existing.is_dir():
            raise user_error(
                DropmaskValueError,
                f"directory must be a directory, but {existing} is a file",
                "Pass a directory path (it is created on the first save).",
                caller="Checkpointer",
            )
        import orbax.checkpoint as ocp
        from orbax.checkpoint import checkpoint_managers

        self.best_metric = best_metric
        self.best_mode = best_mode
        policies: list[Any] = [checkpoint_managers.LatestN(n=keep)]
        if best_metric is not None:
            policies.append(
                checkpoint_managers.BestN(
                    get_metric_fn=lambda metrics: metrics[best_metric],
                    reverse=best_mode == "min",
                    n=1,
                    keep_checkpoints_without_metrics=False,
                )
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,
            create=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "record")
        )

    def steps(self) -> list[int]:
        """The steps of complete checkpoints, oldest first (partial saves excluded)."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or ``None`` when there is none."""
        return self._manager.latest_step()

    def save(
        self,
        step: int,
        state: Any,
        *,
        config: Mapping[str, Any],
        data_position: Mapping[str, Any],
        metrics: Mapping[str, float] | None = None,
        overwrite: bool = False,
        allow_nonfinite: bool = False,
        config_name: str | None = None,
    ) -> None:
        """Writes ``state`` as checkpoint ``step`` (atomically) and prunes old ones.

        Returns only once the checkpoint is complete on disk; a save that does not
        happen raises, naming the step and why.

        Args:
          step: the number of train steps the state has taken.
          state: a pytree (e.g. ``TrainState``); typed keys are saved as key data.
          config: the run's config as a JSON-friendly mapping.
          data_position: where the data pipeline is at ``step`` (checked on restore).
          metrics: eval metrics at ``step``; needed for ``best_metric`` to count it.
          overwrite: replace checkpoint ``step`` if it exists. The old one is moved
            aside and deleted only once the new one is complete.
          allow_nonfinite: save a state whose floating leaves hold NaN or inf (e.g.
            a running minimum that starts at inf); by default such a state is refused.
          config_name: the named config that ``config`` started from (``dropmask
            train --config NAME``; ``None``: the default), kept in the record as
            ``config_name`` so that a resume from another start can say which.

        Raises:
          SaveError: nothing was saved because checkpoint ``step`` exists and
            ``overwrite`` is False, a newer checkpoint exists, the state holds NaN or
            inf, or orbax declined, failed or did not finish the write.
          DropmaskValueError: ``step`` is not an int >= 0, or ``metrics`` lacks
            ``best_metric``.
        """
        step, steps = self._check_save(step, metrics, overwrite)
        not_saved = f"Checkpointer.save: step {step} was not saved in {self.directory}"
        data, impls = keys_to_data(state)
        if not allow_nonfinite:
            bad = _nonfinite_paths(data)
            if bad:
                more = f" (and {len(bad) - 1} more leaves)" if len(bad) > 1 else ""
                raise SaveError(
                    f"{not_saved}: the state's leaf {bad[0]}{more} holds NaN or inf, and a "
                    f"non-finite state is never saved. Resume from the last checkpoint with "
                    f"a lower learning rate, or pass allow_nonfinite=True if the state "
                    f"holds inf on purpose."
                )
        record = {
            "step": step,
            "key_impls": impls,
            "leaves": _leaf_records(data),
            "config": _plain(dict(config)),
            "config_name": config_name,
            "data_position": _plain(dict(data_position)),
            "metrics": _plain(dict(metrics)) if metrics is not None else None,
        }
        self._write(step, steps, data, record, metrics)

    def _check_save(
        self, step: Any, metrics: Mapping[str, float] | None, overwrite: bool
    ) -> tuple[int, list[int]]:
        """``(step, existing steps)`` once ``save`` may write ``step``; raises otherwise."""
        step = check_int_at_least(
            step,
            0,
            caller="Checkpointer.save",
            name="step",
            why=" (train steps taken)",
            fix=" Pass e.g. int(state.step).",
        )
        if self.best_metric is not None and metrics is not None and self.best_metric not in metrics:
            raise user_error(
                DropmaskValueError,
                f"metrics must hold best_metric {self.best_metric!r}, got {sorted(metrics)}",
                "Pass the eval metrics, or metrics=None to save a checkpoint that does not "
                "compete for best.",
                caller="Checkpointer.save",
            )
        not_saved = f"Checkpointer.save: step {step} was not saved in {self.directory}"
        steps = self.steps()
        if step in steps and not overwrite:
            raise SaveError(
                f"{not_saved}: a checkpoint of step {step} already exists. Pass "
                f"overwrite=True to replace it, or save under another step."
            )
        if step not in steps and steps and steps[-1] > step:
            raise SaveError(
                f"{not_saved}: it is older than the latest checkpoint, step {steps[-1]}, and "
                f"checkpoints only move forward (keeping the latest would delete it at "
                f"once). Save it in another directory, or save a step after {steps[-1]}."
            )
        return step, steps

    def _write(
        self,
        step: int,
        steps: list[int],
        data: Any,
        record: dict[str, Any],
        metrics: Mapping[str, float] | None,
    ) -> None:
        """Writes checked checkpoint ``step`` through orbax and confirms it is on disk;
        an existing ``step`` is moved aside first and put back if the write fails."""
        not_saved = f"Checkpointer.save: step {step} was not saved in {self.directory}"
        items = {f"leaf{i:05d}": leaf for i, leaf in enumerate(jax.tree.leaves(data))}
        import orbax.checkpoint as ocp

        replaced = self._move_aside(step) if step in steps else None
        try:
            # force=True: the checks above decide; orbax's own policy would decline
            # a step that is not after its latest by returning False.
            written = self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(items), record=ocp.args.JsonSave(record)
                ),
                metrics=dict(metrics) if metrics is not None else None,
                force=True,
            )
            self._manager.wait_until_finished()
        except Exception as error:
            self._put_back(replaced, step)
            raise SaveError(
                f"{not_saved}: orbax failed to write it ({_first_line(error)}). Check the "
                f"directory's space and permissions, then save again."
            ) from error
        if not written:
            self._put_back(replaced, step)
            raise SaveError(
                f"{not_saved}: orbax declined the save (CheckpointManager.save returned "
                f"False). Save again, or report this with the orbax-checkpoint version."
            )
        if not (self.directory / str(step)).is_dir() or step not in self.steps():
            raise SaveError(
                f"{not_saved}: orbax reported it written, but {self.directory / str(step)} "
                f"is not a complete checkpoint (the write did not finish, or the "
                f"retention policy removed it). Save again, or report this."
            )
        if replaced is not None and jax.process_index() == 0:
            shutil.rmtree(replaced)

    def set_aside(self, step: int, destination: str | os.PathLike[str]) -> pathlib.Path:
        """Moves checkpoint ``step`` out of the managed directory, keeping its files.

        For a damaged checkpoint, so that a run can resume from an earlier one and
        save this step again; nothing is deleted.

        Args:
          step: a step in :meth:`steps`.
          destination: a directory; the checkpoint becomes ``destination/STEP``
            (``STEP-1``, ``STEP-2``, ... when that exists).

        Returns:
          The checkpoint's new path.

        Raises:
          CheckpointError: there is no checkpoint ``step``.
        """
        step = self._require(step)
        destination = pathlib.Path(destination).absolute()
        target, n = destination / str(step), 0
        while target.exists():
            n += 1
            target = destination / f"{step}-{n}"
        if jax.process_index() == 0:
            destination.mkdir(parents=True, exist_ok=True)
            os.replace(self.directory / str(step), target)
        _sync(f"dropmask-set-aside-{step}")
        self._manager.reload()
        return target

    def _move_aside(self, step: int) -> pathlib.Path:
        """Renames checkpoint ``step`` to a name orbax does not read as a step."""
        aside = self.directory / f"replaced-{step}"
        if jax.process_index() == 0:
            if aside.exists():
                shutil.rmtree(aside)
            os.replace(self.directory / str(step), aside)
        _sync(f"dropmask-replace-{step}")
        self._manager.reload()
        return aside

    def _put_back(self, aside: pathlib.Path | None, step: int) -> None:
        """Undoes :meth:`_move_aside` after a failed save, so that nothing is lost."""
        if aside is None:
            return
        if jax.process_index() == 0 and not (self.directory / str(step)).exists():
            os.replace(aside, self.directory / str(step))
        _sync(f"dropmask-put-back-{step}")
        self._manager.reload()

    def record(self, step: int | None = None) -> dict[str, Any]:
        """The JSON record of checkpoint ``step`` (default: the latest).

        Raises:
          CheckpointError: there is no such checkpoint.
          DamagedCheckpointError: its record cannot be read.
        """
        step = self._require(step)
        import orbax.checkpoint as ocp

        restored = self._read(step, "record", ocp.args.JsonRestore())
        if not isinstance(restored, Mapping) or not {"step", "config", "leaves"} <= set(restored):
            raise self._damaged(step, f"its record is not a checkpoint record: {restored!r:.80}")
        return dict(restored)

    def check_config(self, config: Mapping[str, Any], step: int | None = None) -> dict[str, Any]:
        """Checks ``config`` against checkpoint ``step`` (default: the latest); returns its record.

        Raises:
          CheckpointError: no checkpoint, or it was saved with another config (entries
            other than the run-length ones differ); the message names the entry.
        """
        step = self._require(step)
        record = self.record(step)
        where = f"checkpoint {step} in {self.directory}"
        self._check_config(record["config"], _plain(dict(config)), where)
        return record

    def best_step(self) -> int | None:
        """The kept checkpoint with the best ``best_metric``, or ``None``."""
        if self.best_metric is None:
            return None
        scored = []
        for step in self.steps():
            metrics = self.record(step).get("metrics") or {}
            if self.best_metric in metrics:
                scored.append((metrics[self.best_metric], step))
        if not scored:
            return None
        return (max if self.best_mode == "max" else min)(scored)[1]

    def restore(
        self,
        target: Any,
        *,
        config: Mapping[str, Any],
        step: int | None = None,
        data_position: Mapping[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Restores checkpoint ``step`` (default: the latest) into the structure of ``target``.

        Args:
          target: a state built for this run (same model and optimizer); its leaves
            give shapes, dtypes, shardings and key impls.
          config: this run's config; must equal the saved one except for
            run-length entries (``steps``, ``log_every``, ``eval_every``,
            ``checkpoint_every``, ``keep_checkpoints``).
          step: which checkpoint; the latest by default.
          data_position: where this run's pipeline is at the restored step, when the
            caller can compute it; must equal the saved position.

        Returns:
          ``(state, record)``: the restored state and the checkpoint's JSON record.

        Raises:
          CheckpointError: no checkpoint, or it was saved from another config, model
            shape, key impl or data pipeline; the message names the mismatch.
          DamagedCheckpointError: its files cannot be read back (truncated, corrupt
            or missing); the message names its path.
        """
        step = self._require(step)
        record = self.record(step)
        where = f"checkpoint {step} in {self.directory}"
        self._check_config(record["config"], _plain(dict(config)), where)
        data_target, impls = keys_to_data(target)
        self._check_leaves(record, _leaf_records(data_target), impls, where)
        leaves, treedef = jax.tree.flatten(data_target)
        abstract = {
            f"leaf{i:05d}": jax.ShapeDtypeStruct(
                np.shape(leaf), _dtype(leaf), sharding=getattr(leaf, "sharding", None)
            )
            for i, leaf in enumerate(leaves)
        }
        import orbax.checkpoint as ocp

        restored = self._read(step, "state", ocp.args.StandardRestore(abstract))
        values = [restored[f"leaf{i:05d}"] for i in range(len(leaves))]
        state = keys_from_data(jax.tree.unflatten(treedef, values), impls)
        if data_position is not None and _plain(dict(data_position)) != record["data_position"]:
            raise CheckpointError(
                f"{where} was saved at data position {record['data_position']}, but this "
                f"run's pipeline is at {_plain(dict(data_position))} for that step: the "
                f"dataset or batching changed. Restore with the data it was trained on."
            )
        return state, record

    def close(self) -> None:
        """Waits for pending writes and for the removal of earlier partial saves, then
        releases orbax's resources."""
        # Orbax removes the partial saves of earlier runs on a thread started with the
        # manager, and only a save waits for it: a checkpointer closed before its first
        # save (a refused resume) would leave the thread to print a traceback at exit.
        cleanup = getattr(self._manager, "_cleanup_tmp_directory_future", None)
        if cleanup is not None:
            cleanup.result()
        self._manager.close()

    def _read(self, step: int, item: str, args: Any) -> Any:
        """One item of checkpoint ``step``; any failure to read it means it is damaged."""
        import orbax.checkpoint as ocp

        try:
            with reads_finish_before_loops_close():
                return self._manager.restore(step, args=ocp.args.Composite(**{item: args}))[item]
        except Exception as error:
            raise self._damaged(
                step, f"its {item} cannot be read ({_first_line(error)})"
            ) from error

    def _damaged(self, step: int, why: str) -> DamagedCheckpointError:
        path = self.directory / str(step)
        return DamagedCheckpointError(
            f"checkpoint {step} at {path} is damaged: {why}. Restore an earlier step "
            f"(dropmask train --resume does, and keeps this one aside)",
            step=step,
            path=path,
            why=why,
        )

    def _require(self, step: int | None) -> int:
        steps = self.steps()
        if not steps:
            raise CheckpointError(
                f"no checkpoint in {self.directory}. Train without resuming first, or "
                f"point to the workdir of a run that saved checkpoints."
            )
        if step is None:
            return steps[-1]
        check_int_at_least(step, 0, caller="Checkpointer", name="step", why=" (train steps taken)")
        if step not in steps:
            raise CheckpointError(
                f"no checkpoint for step {step} in {self.directory}; it has steps {steps}."
            )
        return step

    @staticmethod
    def _check_config(saved: dict[str, Any], current: dict[str, Any], where: str) -> None:
        difference = config_difference(saved, current)
        if difference is not None:
            name, there, here = difference
            raise CheckpointError(
                f"{where} was saved with config.{name}={there!r}, but this run has "
                f"config.{name}={here!r}. Resume with the same config, or train in a new "
                f"workdir."
            )

    @staticmethod
    def _check_leaves(
        record: dict[str, Any],
        current: list[tuple[str, list[int], str]],
        impls: list[str | None],
        where: str,
    ) -> None:
        saved = [tuple(leaf) for leaf in record["leaves"]]
        saved_paths = {leaf[0] for leaf in saved}
        current_paths = {leaf[0] for leaf in current}
        missing, extra = sorted(saved_paths - current_paths), sorted(current_paths - saved_paths)
        if missing or extra:
            raise CheckpointError(
                f"{where} holds another model: only in the checkpoint {missing[:3]}, only "
                f"in this run {extra[:3]}. Resume with the model it was saved from."
            )
        if list(impls) != list(record["key_impls"]):
            raise CheckpointError(
                f"{where} saved PRNG keys of impls {record['key_impls']}, but this run's "
                f"state has {impls}. Create the key with the same impl."
            )
        for (path, shape, dtype), (_, saved_shape, saved_dtype) in zip(current, saved, strict=True):
            if list(shape) != list(saved_shape) or dtype != saved_dtype:
                raise CheckpointError(
                    f"{where} holds another model shape: {path} is {saved_dtype}"
                    f"{tuple(saved_shape)} there and {dtype}{tuple(shape)} here. Resume "
                    f"with the config it was saved from."
                )
