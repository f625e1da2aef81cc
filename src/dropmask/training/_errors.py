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
    or a save that could not happen (:class:`SaveError`)."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose files cannot be read back (truncated, corrupt or missing).

    Attributes:
      step: the checkpoint's step.
      path: its directory.
      why: what could not be read, and the reader's error.
    """

    def __init__(self, message: str, *, step: int, path: pathlib.Path, why: str) -> None:
        super().__init__(message)
        self.step = step
        self.path = path
        self.why = why


class SaveError(CheckpointError):
    """A checkpoint that was not saved; the message names the step and why (a step that
    exists or is older than the latest, a state holding NaN or inf, a write that failed)."""


class DataError(DropmaskValueError):
    """A data path that is missing or unreadable, or data a pipeline cannot use."""


class NonFiniteLossError(DropmaskValueError):
    """A train step's loss was NaN or infinite; the run stopped without saving it.

    Attributes:
      step: the first step (counted from 1) whose loss was not finite.
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
