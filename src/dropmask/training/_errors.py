"""Errors of the training workflow, under dropmask's one exception base."""

from __future__ import annotations

from .._errors import DropmaskValueError

__all__ = ["CheckpointError", "DataError"]


class CheckpointError(DropmaskValueError):
    """A checkpoint that is missing, or that belongs to another config, model or dataset."""


class DataError(DropmaskValueError):
    """A data path that is missing or unreadable, or data a pipeline cannot use."""
