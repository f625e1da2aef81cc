"""Digits data: a stratified train/test split of ``sklearn.datasets.load_digits``.

The dataset ships with scikit-learn, so nothing is downloaded. Everything here is
host-side NumPy except the per-epoch shuffle, which is drawn from a JAX key so that
the whole demo derives from one root key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

# load_digits pixels are integers in [0, 16].
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


def load(train_size: int, *, seed: int, label_noise: float = 0.0) -> tuple[Split, Split]:
    """Loads digits and splits them into stratified train and test sets.

    Args:
      train_size: images in the train split; the remaining ``1797 - train_size`` are
        the test split.
      seed: seeds the split and the label noise.
      label_noise: fraction of *training* labels replaced by a uniformly random class
        (which may equal the true one); test labels are never changed.

    Returns:
      ``(train, test)`` splits.
    """
    digits = load_digits()
    images = (digits.data / _MAX_PIXEL).astype(np.float32)
    labels = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, train_size=train_size, stratify=labels, random_state=seed
    )
    if label_noise > 0:
        rng = np.random.default_rng(seed)
        flip = rng.random(len(y_train)) < label_noise
        random_labels = rng.integers(0, 10, len(y_train), dtype=np.int32)
        y_train = np.where(flip, random_labels, y_train).astype(np.int32)
    return Split(x_train, y_train), Split(x_test, y_test)


def batches(split: Split, batch_size: int, key: jax.Array) -> Iterator[dict[str, np.ndarray]]:
    """Yields one shuffled epoch of full batches.

    Args:
      split: the data to batch.
      batch_size: examples per batch; the remainder of the epoch is dropped so that
        every batch has the same shape and ``train_step`` compiles once.
      key: PRNG key for this epoch's order, e.g. ``fold_in(main_key, epoch)``.

    Yields:
      ``{'image': float32[batch_size, 64], 'label': int32[batch_size]}``.
    """
    order = np.asarray(jax.random.permutation(key, len(split)))
    for start in range(0, len(split) - batch_size + 1, batch_size):
        idx = order[start : start + batch_size]
        yield {"image": split.image[idx], "label": split.label[idx]}
