"""Checkpoints on orbax-checkpoint: exact resume, keep the last N and the best.

A checkpoint holds every leaf of the train state (params, optimizer state, step, the
PRNG key as key data) plus a JSON record: the key impls, each leaf's path, shape and
dtype, the config, the data pipeline's position and the eval metrics. Orbax writes a
step into a temporary directory and renames it only once complete, so a run killed
mid-save leaves the previous checkpoints as they were; the partial directory is
ignored and cleaned up by the next run.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from .._errors import DropmaskValueError
from ._errors import CheckpointError
from ._serialization import keys_from_data, keys_to_data

__all__ = ["Checkpointer"]

# Config entries that only say how long or how often a run does things, or how it is
# evaluated (mc_samples); resuming with other values is how a run is extended or
# re-evaluated, so they are not compared on restore.
RUN_LENGTH_KEYS = frozenset(
    {"steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints", "mc_samples"}
)


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples become lists), for comparison."""
    return json.loads(json.dumps(value))


def _dtype(leaf: Any) -> np.dtype:
    """A leaf's dtype, for arrays and Python scalars alike."""
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.result_type(leaf)


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
      DropmaskValueError: ``keep < 1`` or ``best_mode`` is not ``'max'``/``'min'``.

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
        if not isinstance(keep, int) or keep < 1:
            raise DropmaskValueError(
                f"keep must be an int >= 1 (checkpoints to keep), got {keep!r}."
            )
        if best_mode not in ("max", "min"):
            raise DropmaskValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}.")
        self.directory = pathlib.Path(directory).absolute()
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
    ) -> None:
        """Writes ``state`` as checkpoint ``step`` (atomically) and prunes old ones.

        Args:
          step: the number of train steps the state has taken.
          state: a pytree (e.g. ``TrainState``); typed keys are saved as key data.
          config: the run's config as a JSON-friendly mapping.
          data_position: where the data pipeline is at ``step`` (checked on restore).
          metrics: eval metrics at ``step``; needed for ``best_metric`` to count it.
        """
        data, impls = keys_to_data(state)
        leaves = jax.tree.leaves(data)
        record = {
            "step": int(step),
            "key_impls": impls,
            "leaves": _leaf_records(data),
            "config": _plain(dict(config)),
            "data_position": _plain(dict(data_position)),
            "metrics": _plain(dict(metrics)) if metrics is not None else None,
        }
        items = {f"leaf{i:05d}": leaf for i, leaf in enumerate(leaves)}
        self._manager.save(
            int(step),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(items), record=ocp.args.JsonSave(record)
            ),
            metrics=dict(metrics) if metrics is not None else None,
        )
        self._manager.wait_until_finished()

    def record(self, step: int | None = None) -> dict[str, Any]:
        """The JSON record of checkpoint ``step`` (default: the latest).

        Raises:
          CheckpointError: there is no such checkpoint.
        """
        step = self._require(step)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(record=ocp.args.JsonRestore())
        )
        return dict(restored["record"])

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
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        )["state"]
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
        """Waits for pending writes and releases orbax's resources."""
        self._manager.close()

    def _require(self, step: int | None) -> int:
        steps = self.steps()
        if not steps:
            raise CheckpointError(
                f"no checkpoint in {self.directory}. Train without resuming first, or "
                f"point to the workdir of a run that saved checkpoints."
            )
        if step is None:
            return steps[-1]
        if step not in steps:
            raise CheckpointError(
                f"no checkpoint for step {step} in {self.directory}; it has steps {steps}."
            )
        return step

    @staticmethod
    def _check_config(saved: dict[str, Any], current: dict[str, Any], where: str) -> None:
        names = sorted((set(saved) | set(current)) - RUN_LENGTH_KEYS)
        for name in names:
            if saved.get(name, "<absent>") != current.get(name, "<absent>"):
                raise CheckpointError(
                    f"{where} was saved with config.{name}={saved.get(name, '<absent>')!r}, "
                    f"but this run has config.{name}={current.get(name, '<absent>')!r}. "
                    f"Resume with the same config, or train in a new workdir."
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
