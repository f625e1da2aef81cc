"""Epoch-based batches as a pure function of the step, and where the step is in the data.

The batch of step ``s`` depends only on the data key, ``s`` and the sizes: epoch
``s // steps_per_epoch`` is a permutation drawn from ``fold_in(data_key, epoch)``,
and the last partial batch of each epoch is dropped so every step has one shape. A
run resumed at any step therefore sees the batches an uninterrupted run would.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_int_at_least
from .._errors import DropmaskValueError, user_error

__all__ = ["epoch_batch", "epoch_position", "steps_per_epoch"]


def steps_per_epoch(*, num_examples: int, batch_size: int, caller: str = "steps_per_epoch") -> int:
    """Full batches per epoch, ``num_examples // batch_size``.

    Raises:
      DropmaskValueError: ``batch_size`` is not in ``[1, num_examples]``.
    """
    for name, value in (("num_examples", num_examples), ("batch_size", batch_size)):
        check_int_at_least(value, 1, caller=caller, name=name)
    if batch_size > num_examples:
        raise user_error(
            DropmaskValueError,
            f"batch_size must be <= num_examples={num_examples}, got {batch_size}",
            "Lower config.batch_size or use more data.",
            caller=caller,
        )
    return int(num_examples) // int(batch_size)


@functools.lru_cache(maxsize=4)
def _order(key_data: bytes, impl: str, epoch: int, n: int) -> np.ndarray:
    # One permutation per epoch, drawn once: consecutive steps reuse it.
    key = jax.random.wrap_key_data(jnp.asarray(np.frombuffer(key_data, np.uint32)), impl=impl)
    return np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n))


def epoch_batch(
    data_key: jax.Array, step: int, *, num_examples: int, batch_size: int
) -> np.ndarray:
    """The example indices of ``step``'s batch: ``int[batch_size]``, host-side.

    Args:
      data_key: the run's data key (typed, e.g. from :func:`run_keys`).
      step: the train step, from 0.
      num_examples: the training examples.
      batch_size: examples per step.

    Returns:
      Indices into the training examples, distinct within an epoch.

    Raises:
      DropmaskValueError: a negative step, or sizes ``steps_per_epoch`` refuses.

    Example:
      >>> key = jax.random.key(0)
      >>> first = epoch_batch(key, 0, num_examples=10, batch_size=4)
      >>> second = epoch_batch(key, 1, num_examples=10, batch_size=4)
      >>> first.shape, len(set(first) | set(second))
      ((4,), 8)
    """
    per_epoch = steps_per_epoch(
        num_examples=num_examples, batch_size=batch_size, caller="epoch_batch"
    )
    check_int_at_least(step, 0, caller="epoch_batch", name="step")
    epoch, index = divmod(int(step), per_epoch)
    order = _order(
        np.asarray(jax.random.key_data(data_key)).tobytes(),
        str(jax.random.key_impl(data_key)),
        epoch,
        int(num_examples),
    )
    return order[index * batch_size : (index + 1) * batch_size]


def epoch_position(step: int, *, num_examples: int, batch_size: int) -> dict[str, int]:
    """Where ``step`` is in the data: for :attr:`Example.data_position`.

    Returns:
      ``{'epoch', 'batch', 'steps_per_epoch', 'num_examples'}``; a checkpoint saves it
      and a resume with other data or batch size is refused.

    Example:
      >>> epoch_position(9, num_examples=10, batch_size=4)
      {'epoch': 4, 'batch': 1, 'steps_per_epoch': 2, 'num_examples': 10}
    """
    per_epoch = steps_per_epoch(
        num_examples=num_examples, batch_size=batch_size, caller="epoch_position"
    )
    epoch, index = divmod(int(step), per_epoch)
    return {
        "epoch": epoch,
        "batch": index,
        "steps_per_epoch": per_epoch,
        "num_examples": int(num_examples),
    }
