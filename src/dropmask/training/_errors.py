"""Errors of the training workflow, under dropmask's one exception base."""

from __future__ import annotations

import pathlib

from .._errors import DropmaskError, DropmaskValueError

__all__ = [
    "CheckpointError",
    "DamagedCheckpointError",
    "DataError",
    "NonFiniteLossError",
    "SaveError",
    "exit_status",
]


class CheckpointError(DropmaskValueError):
    """A checkpoint that is missing, that belongs to another config, model or dataset,
    or a save that could not happen (:class:`SaveError`).

    Example:
      >>> import tempfile, jax.numpy as jnp
      >>> from dropmask.training import CheckpointError, Checkpointer
      >>> with tempfile.TemporaryDirectory() as d:
      ...     ckpt = Checkpointer(d)
      ...     ckpt.save(1, {"w": jnp.ones(2)}, config={"lr": 0.1}, data_position={})
      ...     try:
      ...         ckpt.restore({"w": jnp.ones(2)}, config={"lr": 0.2})  # another config
      ...     except CheckpointError as err:  # a ValueError too
      ...         print(str(err).split(" was saved with ")[1].split(". ")[0])
      ...     ckpt.close()
      config.lr=0.1, but this run has config.lr=0.2
    """


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose files cannot be read back (truncated, corrupt or missing).

    Attributes:
      step: the checkpoint's step.
      path: its directory.
      why: what could not be read, and the reader's error.

    Example:
      >>> import pathlib, shutil, tempfile, jax.numpy as jnp
      >>> from dropmask.training import Checkpointer, DamagedCheckpointError
      >>> with tempfile.TemporaryDirectory() as d:
      ...     ckpt = Checkpointer(d)
      ...     ckpt.save(3, {"w": jnp.ones(2)}, config={}, data_position={})
      ...     shutil.rmtree(pathlib.Path(d, "3", "state"))  # the arrays' files are lost
      ...     try:
      ...         ckpt.restore({"w": jnp.ones(2)}, config={})
      ...     except DamagedCheckpointError as err:
      ...         print(err.step, err.why.split(" (")[0])
      ...     ckpt.close()
      3 its state cannot be read
    """

    def __init__(self, message: str, *, step: int, path: pathlib.Path, why: str) -> None:
        super().__init__(message)
        self.step = step
        self.path = path
        self.why = why


class SaveError(CheckpointError):
    """A checkpoint that was not saved; the message names the step and why (a step that
    exists or is older than the latest, a state holding NaN or inf, a write that failed).

    Example:
      >>> import tempfile, jax.numpy as jnp
      >>> from dropmask.training import Checkpointer, SaveError
      >>> with tempfile.TemporaryDirectory() as d:
      ...     ckpt = Checkpointer(d)
      ...     try:
      ...         ckpt.save(1, {"w": jnp.array([1.0, jnp.nan])}, config={}, data_position={})
      ...     except SaveError as err:  # a CheckpointError too
      ...         print(str(err).split(": ", 2)[2].split(", and")[0])
      ...     print(ckpt.steps())  # nothing was written
      ...     ckpt.close()
      the state's leaf ['w'] holds NaN or inf
      []
    """


class DataError(DropmaskValueError):
    """A data path that is missing or unreadable, or data a pipeline cannot use.

    Example:
      >>> from dropmask.training import DataError
      >>> from dropmask.examples.digits.train import example  # the bundled digits
      >>> config = example.get_tiny_config()
      >>> config.data_path = "no/such/digits.npz"
      >>> try:
      ...     example.load_data(config)
      ... except DataError as err:  # a ValueError too
      ...     print(str(err).split(". ")[0])
      config.data_path='no/such/digits.npz' does not exist
    """


class NonFiniteLossError(DropmaskValueError):
    """A train step's loss was NaN or infinite; the run stopped without saving it.

    Attributes:
      step: the first step (counted from 1) whose loss was not finite.

    Example:
      >>> import tempfile
      >>> from dropmask.training import NonFiniteLossError, train
      >>> from dropmask.examples.digits.train import example  # the bundled digits
      >>> config = example.get_tiny_config()
      >>> config.steps, config.learning_rate = 2, 1e30  # a step size that diverges
      >>> with tempfile.TemporaryDirectory() as workdir:
      ...     try:
      ...         train(example, config, workdir, devices=1, progress=False)
      ...     except NonFiniteLossError as err:
      ...         print(err.step, str(err).split(", so")[0])
      2 train: the loss is nan at step 2
    """

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


def exit_status(error: DropmaskError) -> int:
    """The status a command exits with after ``error``, as docs/cli.md states it.

    1 when the run failed once started: a non-finite loss, a checkpoint that could
    not be saved or read back. 2 for every other error dropmask raises, a refusal of
    what the user gave (flags, target, config, workdir), as argparse exits on a
    usage error.
    """
    return 1 if isinstance(error, NonFiniteLossError | DamagedCheckpointError | SaveError) else 2
