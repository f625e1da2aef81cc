"""restore_run: a trained run's state, config and data back from its checkpoint."""

import json

import jax
import numpy as np
import pytest
from digits_tiny import EXAMPLES, example_named, tiny_config

from dropmask import DropmaskTypeError, DropmaskValueError
from dropmask.training import CheckpointError, restore_run, train


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    return example_named(request.param)


@pytest.fixture(scope="module")
def run(example, tmp_path_factory):
    """A 12-step tiny run, checkpoints at steps 4, 8 and 12."""
    return train(example, tiny_config(), tmp_path_factory.mktemp("run"), devices=1, progress=False)


def _files(directory):
    return sorted((p.relative_to(directory), p.stat().st_mtime_ns) for p in directory.rglob("*"))


@pytest.mark.slow
def test_the_latest_checkpoint_gives_the_runs_final_state_config_and_data(example, run):
    before = _files(run.workdir)
    state, config, data = restore_run(run.workdir, example)
    assert int(state.step) == 12
    assert config.to_dict() == json.loads(json.dumps(run.config))  # as saved: lists for tuples
    # The loop's own final evaluation, repeated on the restored state.
    for split, metrics in run.final.items():
        again = example.evaluate(state, config, data, split)
        assert again == pytest.approx(metrics, rel=1e-6, abs=0), split
    assert _files(run.workdir) == before  # restoring writes nothing


@pytest.mark.slow
def test_step_picks_an_earlier_checkpoint_and_an_absent_one_is_named(example, run):
    latest, _, _ = restore_run(run.workdir, example)
    earlier, _, _ = restore_run(run.workdir, example, step=8)
    assert int(earlier.step) == 8
    assert jax.random.key_impl(earlier.key) == jax.random.key_impl(latest.key)
    differ = jax.tree.map(
        lambda a, b: not np.array_equal(np.asarray(a), np.asarray(b)),
        earlier.params,
        latest.params,
    )
    assert any(jax.tree.leaves(differ))
    with pytest.raises(CheckpointError, match="no checkpoint for step 5"):
        restore_run(run.workdir, example, step=5)


def test_a_workdir_without_checkpoints_is_refused_before_anything_is_created(tmp_path):
    example = example_named("digits")
    with pytest.raises(DropmaskValueError, match=r"restore_run: workdir must hold a run's"):
        restore_run(tmp_path, example)
    assert list(tmp_path.iterdir()) == []


def test_example_must_be_an_example(tmp_path):
    with pytest.raises(DropmaskTypeError, match="restore_run: example must be a"):
        restore_run(tmp_path, "digits")  # type: ignore[arg-type]


@pytest.mark.parametrize("step", ["3", 3.0, True, -1])
def test_step_that_is_not_an_int_is_named_before_any_checkpoint_is_read(tmp_path, step):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(DropmaskValueError, match=r"restore_run: step must be an int >= 0"):
        restore_run(tmp_path, example_named("digits"), step=step)


def test_a_run_of_another_example_is_named_as_such(tmp_path):
    import dataclasses

    import ml_collections

    from dropmask.training import Checkpointer

    # A checkpoint of digits, restored with an example whose config has other entries.
    digits = example_named("digits")
    config = tiny_config()
    state = digits.create_state(
        config, digits.load_data(config), jax.random.key(0), jax.random.key(1)
    )
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    checkpointer.save(1, state, config=config.to_dict(), data_position={})
    checkpointer.close()

    def other_config():
        other = ml_collections.ConfigDict({k: v for k, v in config.items() if k != "hidden"})
        other.embed_dim = 8
        return other

    other = dataclasses.replace(digits, name="other", get_config=other_config)
    with pytest.raises(CheckpointError, match=r"not trained by example 'other'.*'hidden'.*'embed"):
        restore_run(tmp_path, other)
    assert int(restore_run(tmp_path, digits)[0].step) == int(state.step)
