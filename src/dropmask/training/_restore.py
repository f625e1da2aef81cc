"""A finished (or interrupted) run's state rebuilt from its checkpoint, for use after training."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import ml_collections

from .._checks import check_instance, check_int_at_least
from .._errors import DropmaskValueError, user_error
from .._workflow import Example, base_config, run_keys
from ._checkpoint import Checkpointer
from ._errors import CheckpointError

__all__ = ["restore_run"]


def restore_run(
    workdir: str | os.PathLike[str],
    example: Example,
    *,
    step: int | None = None,
) -> tuple[Any, ml_collections.ConfigDict, Any]:
    """The state of checkpoint ``step`` (default: the latest) of a run, its config and data.

    Rebuilds what the loop built for the run in ``workdir``: the config saved with the
    checkpoint, the example's data for that config, and a state from the run's keys
    (:func:`run_keys` of ``config.seed``) into which the checkpoint is restored. The
    state is built with :meth:`Example.build_state`, so runs of one config restored side
    by side (the seeds of a rate comparison) share each jitted function's compilation.
    Nothing in ``workdir`` is written.

    Args:
      workdir: the run's directory, which holds ``checkpoints/`` (for a
        ``--compare-rates`` run, one of its ``rate_R/seed_S``).
      example: the :class:`Example` the run trained.
      step: which checkpoint; the latest by default.

    Returns:
      ``(state, config, data)``: the restored state (unsharded, on the default
      device), the run's config as a ``ConfigDict`` and ``example.load_data(config)``.

    Raises:
      DropmaskTypeError: ``example`` is not an :class:`Example`.
      DropmaskValueError: ``workdir`` holds no ``checkpoints/`` directory, or ``step``
        is not an int >= 0.
      CheckpointError: no checkpoint ``step``; the run's config has other entries than
        ``example``'s (another example trained it); or it holds another model than
        ``example`` builds for its config.
      DamagedCheckpointError: the checkpoint's files cannot be read back.
      DataError: ``example.load_data`` cannot read the run's data (e.g. its
        ``data_path`` moved).

    Example:
      >>> import tempfile
      >>> from dropmask.training import train
      >>> from dropmask.examples.digits.train import example  # the bundled digits
      >>> config = example.get_tiny_config()
      >>> config.steps = 2
      >>> with tempfile.TemporaryDirectory() as workdir:
      ...     result = train(example, config, workdir, devices=1, progress=False)
      ...     state, run_config, data = restore_run(workdir, example)
      >>> held_out = example.evaluate(state, run_config, data, "eval")
      >>> int(state.step), held_out == result.final["eval"]  # the run's last evaluation
      (2, True)
    """
    check_instance(
        example,
        Example,
        caller="restore_run",
        name="example",
        what="a dropmask.training.Example",
        fix="Pass the example the run trained, e.g. train.example.",
    )
    directory = pathlib.Path(workdir) / "checkpoints"
    if not directory.is_dir():
        raise user_error(
            DropmaskValueError,
            f"workdir must hold a run's checkpoints/, but {directory} does not exist",
            f"Train first (dropmask train {example.name} --workdir {workdir}), or pass the run's "
            "workdir (for --compare-rates, one of its rate_R/seed_S).",
            caller="restore_run",
        )
    if step is not None:
        check_int_at_least(
            step, 0, caller="restore_run", name="step", why=" (train steps taken)",
            fix=" Pass the checkpoint's step as a number, e.g. step=int(text).",
        )  # fmt: skip
    checkpointer = Checkpointer(directory)
    try:
        record = checkpointer.record(step)
        _check_same_example(record["config"], example, directory)
        config = ml_collections.ConfigDict(record["config"])
        data = example.load_data(config)
        _, params_key, dropout_key = run_keys(record["config"]["seed"])
        target = example.build_state(config, data, params_key, dropout_key)
        state, _ = checkpointer.restore(target, config=record["config"], step=record["step"])
    finally:
        checkpointer.close()
    return state, config, data


def _check_same_example(saved: dict[str, Any], example: Example, directory: pathlib.Path) -> None:
    """Raises unless the saved config has the entries of ``example``'s config: a run of
    another example would fail later on one entry, in words that hide the mismatch."""
    # The loop's own entries may be added to a config that lacks them (--mc-samples).
    loop = set(base_config())
    expected = set(example.get_config())
    extra, missing = sorted(set(saved) - expected - loop), sorted(expected - set(saved) - loop)
    if extra or missing:
        raise CheckpointError(
            f"restore_run: the run in {directory.parent} was not trained by example "
            f"{example.name!r}: its config has {extra or 'no'} entries that {example.name!r} "
            f"has not, and lacks {missing or 'none'}. Pass the example that trained it."
        )
