"""Hyperparameters of the digits demo: one frozen dataclass, a default and a tiny config."""

from __future__ import annotations

import dataclasses

# load_digits has 1797 images; the test split must keep at least one image per class.
NUM_EXAMPLES = 1797
NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that decides a run of the demo.

    The defaults make a wide MLP overfit on purpose: 200 training images (the other
    1597 are the test set) and far more capacity and epochs than they need, so the
    run without dropout drives its training loss to ~0 and the gap to the test set
    shows.

    Attributes:
      seed: root of all randomness: ``jax.random.key(seed)`` is split into the main
        (data order), params and dropout keys; also seeds the split and label noise.
      train_size: number of training images, stratified by class.
      label_noise: fraction of training labels replaced by uniformly random ones
        (test labels stay clean); 0 for the plain dataset.
      hidden: widths of the hidden Dense layers.
      rate: dropout rate after each hidden layer in the dropout run.
      input_rate: dropout rate on the input pixels in the dropout run.
      learning_rate: Adam learning rate.
      batch_size: examples per step; the last partial batch of an epoch is dropped
        so every step has the same shape (one compilation).
      epochs: passes over the training split.
      eval_every: epochs between evaluations on the full train and test splits.
    """

    seed: int = 0
    train_size: int = 200
    label_noise: float = 0.0
    hidden: tuple[int, ...] = (512, 512)
    rate: float = 0.5
    input_rate: float = 0.2
    learning_rate: float = 1e-3
    batch_size: int = 50
    epochs: int = 200
    eval_every: int = 5

    def __post_init__(self) -> None:
        for name in ("rate", "input_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}.")
        if not 0.0 <= self.label_noise <= 1.0:
            raise ValueError(f"label_noise must be in [0, 1], got {self.label_noise!r}.")
        if not NUM_CLASSES <= self.train_size <= NUM_EXAMPLES - NUM_CLASSES:
            raise ValueError(
                f"train_size must be in [{NUM_CLASSES}, {NUM_EXAMPLES - NUM_CLASSES}] so both "
                f"splits hold every class, got {self.train_size}."
            )
        if not 1 <= self.batch_size <= self.train_size:
            raise ValueError(
                f"batch_size must be in [1, train_size={self.train_size}], got {self.batch_size}."
            )
        if self.epochs < 1 or self.eval_every < 1:
            raise ValueError(
                f"epochs and eval_every must be >= 1, got {self.epochs} and {self.eval_every}."
            )
        if not self.hidden or any(width < 1 for width in self.hidden):
            raise ValueError(f"hidden must be non-empty positive widths, got {self.hidden}.")


def default() -> Config:
    """The demo's configuration (about 10 s per run on 2 CPU cores)."""
    return Config()


def tiny() -> Config:
    """A seconds-long configuration for tests: narrow, few epochs, a larger step size."""
    return Config(
        train_size=100, hidden=(32,), learning_rate=1e-2, batch_size=25, epochs=3, eval_every=1
    )
