"""epoch_batch / epoch_position: batches as a pure function of the step."""

import jax
import numpy as np
import pytest

from dropmask import DropmaskValueError
from dropmask.training import epoch_batch, epoch_position


def test_an_epoch_visits_each_example_once_and_the_next_reshuffles():
    key = jax.random.key(3)
    epoch = [epoch_batch(key, s, num_examples=10, batch_size=3) for s in range(3)]
    seen = np.concatenate(epoch)
    assert len(set(seen.tolist())) == 9 and seen.max() < 10  # the remainder is dropped
    again = [epoch_batch(key, s, num_examples=10, batch_size=3) for s in (2, 0, 1)]
    np.testing.assert_array_equal(np.concatenate([again[1], again[2], again[0]]), seen)
    following = np.concatenate(
        [epoch_batch(key, s, num_examples=10, batch_size=3) for s in (3, 4, 5)]
    )
    assert not np.array_equal(following, seen)
    other_key = epoch_batch(jax.random.key(4), 0, num_examples=10, batch_size=3)
    assert not np.array_equal(other_key, epoch[0])


def test_position_names_epoch_and_batch():
    assert epoch_position(7, num_examples=10, batch_size=3) == {
        "epoch": 2,
        "batch": 1,
        "steps_per_epoch": 3,
        "num_examples": 10,
    }


@pytest.mark.parametrize(
    ("step", "num_examples", "batch_size", "words"),
    [(-1, 10, 3, "step must be"), (0, 10, 11, "batch_size must be <="), (0, 0, 1, "num_examples")],
)
def test_bad_sizes_are_refused_with_the_fix(step, num_examples, batch_size, words):
    with pytest.raises(DropmaskValueError, match=words):
        epoch_batch(jax.random.key(0), step, num_examples=num_examples, batch_size=batch_size)
