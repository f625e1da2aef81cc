"""Digits data: a stratified train/test split, and each step's batch as a pure function.

scikit-learn ships the 1797 8x8 images, so nothing is downloaded; ``config.data_path``
may name an ``.npz`` with the same arrays instead. The batch of step ``s`` depends only
on the data, the data key and ``s`` (:func:`dropmask.training.epoch_batch`), so a run
resumed at any step sees the batches an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import pathlib
import zipfile

import jax
import ml_collections
import numpy as np

from dropmask import DropmaskValueError
from dropmask._optional import require
from dropmask.training import DataError, check_config, epoch_batch, epoch_position

NUM_CLASSES = 10
NUM_PIXELS = 64
# The pixels of load_digits are integers in [0, 16].
_MAX_PIXEL = 16.0


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of the dataset.

    Attributes:
      image: ``float32[n, 64]`` flattened 8x8 images scaled to ``[0, 1]``.
      label: ``int32[n]`` digit classes in ``[0, 10)``.
    """

    image: np.ndarray
    label: np.ndarray

    def __len__(self) -> int:
        return len(self.label)


@dataclasses.dataclass(frozen=True)
class Data:
    """The train split (possibly with noisy labels) and the clean test split."""

    train: Split
    test: Split


def _read(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``(pixels, classes)`` of ``path``, or of the bundled digits when empty."""
    if not path:
        digits = require("sklearn.datasets", caller="digits").load_digits()
        return digits.data, digits.target
    file = pathlib.Path(path)
    expected = "an .npz with arrays 'data' [n, 64] (pixels in [0, 16]) and 'target' [n]"
    if not file.is_file():
        raise DataError(
            f"config.data_path={path!r} does not exist. Give {expected}, or leave it empty "
            f"for scikit-learn's bundled digits."
        )
    try:
        with np.load(file) as arrays:
            data, target = arrays["data"], arrays["target"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise DataError(
            f"config.data_path={path!r} is not readable as {expected}: {error}."
        ) from None
    if data.ndim != 2 or data.shape[1] != NUM_PIXELS or target.shape != (len(data),):
        raise DataError(
            f"config.data_path={path!r} holds data {data.shape} and target {target.shape}; "
            f"expected {expected}."
        )
    return data, target


def load(config: ml_collections.ConfigDict) -> Data:
    """Loads the digits and splits them into stratified train and test sets.

    Uses ``config.data_path``, ``train_size``, ``data_seed`` (split and label noise)
    and ``label_noise`` (fraction of *training* labels replaced by a uniformly random
    class, which may equal the true one; test labels never change).

    Raises:
      DataError: a missing or unreadable ``data_path``, too few images per class for
        ``train_size``, or a ``batch_size`` outside ``[1, train_size]``.
      DropmaskValueError: a ``model`` other than ``"mlp"`` or ``"conv"``, a
        ``block_size`` or ``data_seed`` below 0, a ``label_noise`` outside
        ``[0, 1]``, a width in ``hidden`` below 1 or a ``learning_rate`` <= 0
        (checked here, the first thing a run does with its config).
    """
    train_test_split = require("sklearn.model_selection", caller="digits").train_test_split
    check_config(
        config,
        widths=["hidden"],
        at_least={"data_seed": 0, "block_size": 0},
        in_range={"label_noise": (0.0, 1.0)},
        positive=["learning_rate"],
    )
    if config.model not in ("mlp", "conv"):
        raise DropmaskValueError(
            f"config.model must be 'mlp' or 'conv', got {config.model!r}. Set it with "
            f"--config.model=conv."
        )

    pixels, classes = _read(config.data_path)
    images = (np.asarray(pixels) / _MAX_PIXEL).astype(np.float32)
    labels = np.asarray(classes).astype(np.int32)
    if not NUM_CLASSES <= config.train_size <= len(labels) - NUM_CLASSES:
        raise DataError(
            f"config.train_size must be in [{NUM_CLASSES}, {len(labels) - NUM_CLASSES}] so "
            f"both splits hold every class, got {config.train_size}."
        )
    if not 1 <= config.batch_size <= config.train_size:
        raise DataError(
            f"config.batch_size must be in [1, train_size={config.train_size}], got "
            f"{config.batch_size}. Lower it or raise train_size."
        )
    x_train, x_test, y_train, y_test = train_test_split(
        images,
        labels,
        train_size=config.train_size,
        stratify=labels,
        random_state=config.data_seed,
    )
    if config.label_noise > 0:
        rng = np.random.default_rng(config.data_seed)
        flip = rng.random(len(y_train)) < config.label_noise
        random_labels = rng.integers(0, NUM_CLASSES, len(y_train), dtype=np.int32)
        y_train = np.where(flip, random_labels, y_train).astype(np.int32)
    return Data(Split(x_train, y_train), Split(x_test, y_test))


def train_batch(
    config: ml_collections.ConfigDict, data: Data, data_key: jax.Array, step: int
) -> dict[str, np.ndarray]:
    """The batch of ``step``: ``{'image': f32[batch_size, 64], 'label': i32[batch_size]}``."""
    idx = epoch_batch(data_key, step, num_examples=len(data.train), batch_size=config.batch_size)
    return {"image": data.train.image[idx], "label": data.train.label[idx]}


def position(config: ml_collections.ConfigDict, data: Data, step: int) -> dict[str, int]:
    """Where the pipeline is at ``step``: epoch, batch within it, and the epoch's shape."""
    return epoch_position(step, num_examples=len(data.train), batch_size=config.batch_size)


def split_batch(config: ml_collections.ConfigDict, data: Data, split: str) -> dict[str, np.ndarray]:
    """The test split (``'eval'``) or the training split (``'train_eval'``) as one batch."""
    del config
    part = data.test if split == "eval" else data.train
    return {"image": part.image, "label": part.label}
