"""Checkpointer: exact round trips (typed keys included), retention, atomicity, refusals."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dropmask import DropmaskError
from dropmask.training import (
    Checkpointer,
    CheckpointError,
    DamagedCheckpointError,
    SaveError,
    TrainState,
    from_bytes,
    to_bytes,
)


class _MLP(nn.Module):
    width: int = 8

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(2)(nn.relu(nn.Dense(self.width)(x)))


def _state(width: int = 8, impl: str = "threefry2x32", seed: int = 0) -> TrainState:
    model = _MLP(width)
    params = model.init(jax.random.key(seed), jnp.ones((1, 3)))["params"]
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.adam(1e-2), key=jax.random.key(7, impl=impl)
    )
    # One real update so that the optimizer moments are not all zeros.
    grads = jax.tree.map(jnp.ones_like, state.params)
    return state.apply_gradients(grads=grads)


def _assert_same(a: TrainState, b: TrainState) -> None:
    assert jax.random.key_impl(a.key) == jax.random.key_impl(b.key)
    np.testing.assert_array_equal(jax.random.key_data(a.key), jax.random.key_data(b.key))
    a_leaves, b_leaves = jax.tree.leaves(a.replace(key=0)), jax.tree.leaves(b.replace(key=0))
    assert len(a_leaves) == len(b_leaves)
    for x, y in zip(a_leaves, b_leaves, strict=True):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


CONFIG = {"width": 8, "learning_rate": 0.01, "steps": 10}


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_round_trip_restores_params_opt_state_step_and_key_impl(tmp_path, impl):
    saved = _state(impl=impl)
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, saved, config=CONFIG, data_position={"epoch": 0, "batch": 1})
    # Restore into a state built from another seed: every value must come from disk.
    restored, record = ckpt.restore(_state(impl=impl, seed=1), config=CONFIG)
    ckpt.close()
    _assert_same(restored, saved)
    assert int(restored.step) == 1
    assert record["step"] == 1 and record["data_position"] == {"epoch": 0, "batch": 1}
    assert record["config"] == CONFIG


def test_keeps_the_last_n_and_the_best(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2, best_metric="accuracy", best_mode="max")
    state = _state()
    for step, accuracy in [(1, 0.5), (2, 0.9), (3, 0.6), (4, 0.7), (5, 0.1)]:
        ckpt.save(step, state, config=CONFIG, data_position={}, metrics={"accuracy": accuracy})
    assert ckpt.steps() == [2, 4, 5]
    assert ckpt.best_step() == 2 and ckpt.latest_step() == 5
    ckpt.close()
    loss_mode = Checkpointer(tmp_path / "min", keep=1, best_metric="loss", best_mode="min")
    for step, loss in [(1, 0.3), (2, 0.1), (3, 0.2)]:
        loss_mode.save(step, state, config=CONFIG, data_position={}, metrics={"loss": loss})
    assert loss_mode.steps() == [2, 3] and loss_mode.best_step() == 2
    loss_mode.close()


def test_a_partial_save_is_ignored_and_the_previous_checkpoint_restores(tmp_path):
    state = _state()
    ckpt = Checkpointer(tmp_path)
    ckpt.save(3, state, config=CONFIG, data_position={})
    ckpt.close()
    # What a process killed mid-save leaves: orbax's temporary directory, never renamed.
    partial = tmp_path / "4.orbax-checkpoint-tmp-1234567"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "manifest.ocdbt").write_bytes(b"\x00 truncated")
    again = Checkpointer(tmp_path)
    assert again.steps() == [3]
    restored, record = again.restore(_state(seed=1), config=CONFIG)
    again.close()
    assert record["step"] == 3
    _assert_same(restored, state)


def test_another_config_is_refused_naming_the_entry(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, _state(), config=CONFIG, data_position={})
    with pytest.raises(
        CheckpointError, match=r"config\.learning_rate=0\.01.*config\.learning_rate=0\.1"
    ):
        ckpt.restore(_state(), config={**CONFIG, "learning_rate": 0.1})
    # Run-length entries may change: that is how a run is extended.
    ckpt.restore(_state(), config={**CONFIG, "steps": 20})
    ckpt.close()


def test_another_model_shape_is_refused_naming_the_leaf(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, _state(width=8), config=CONFIG, data_position={})
    with pytest.raises(
        CheckpointError, match=r"\['kernel'\] is float32\(8, 2\) there and float32\(4, 2\) here"
    ):
        ckpt.restore(_state(width=4), config=CONFIG)
    with pytest.raises(CheckpointError, match="impls"):
        ckpt.restore(_state(impl="rbg"), config=CONFIG)
    with pytest.raises(CheckpointError, match="only in this run"):
        ckpt.restore({"w": jnp.ones(3)}, config=CONFIG)
    ckpt.close()


def test_another_data_position_is_refused(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, _state(), config=CONFIG, data_position={"epoch": 0, "train_size": 96})
    with pytest.raises(CheckpointError, match="data position"):
        ckpt.restore(_state(), config=CONFIG, data_position={"epoch": 0, "train_size": 97})
    ckpt.close()


def test_restore_without_checkpoints_says_so(tmp_path):
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        ckpt.restore(_state(), config=CONFIG)
    with pytest.raises(CheckpointError, match="no checkpoint for step 9"):
        ckpt.save(1, _state(), config=CONFIG, data_position={})
        ckpt.record(9)
    ckpt.close()


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"keep": 0}, "keep"), ({"best_mode": "up"}, "best_mode")]
)
def test_bad_options(tmp_path, kwargs, match):
    with pytest.raises(DropmaskError, match=match):
        Checkpointer(tmp_path, **kwargs)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_to_bytes_round_trips_typed_keys(impl):
    state = _state(impl=impl)
    restored = from_bytes(_state(impl=impl, seed=1), to_bytes(state))
    _assert_same(restored, state)


# Every way a save can fail to happen raises, naming the step and why.


def _w(state: TrainState) -> np.ndarray:
    return np.asarray(state.params["Dense_0"]["kernel"])


def test_saving_an_existing_step_raises_and_overwrite_replaces_it(tmp_path):
    first, second = _state(seed=0), _state(seed=1)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(5, first, config=CONFIG, data_position={})
    with pytest.raises(SaveError, match=r"step 5 was not saved.*already exists.*overwrite="):
        ckpt.save(5, second, config=CONFIG, data_position={})
    np.testing.assert_array_equal(_w(ckpt.restore(second, config=CONFIG)[0]), _w(first))
    ckpt.save(5, second, config=CONFIG, data_position={}, overwrite=True)
    np.testing.assert_array_equal(_w(ckpt.restore(first, config=CONFIG)[0]), _w(second))
    assert ckpt.steps() == [5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["5"]
    ckpt.close()


def test_saving_a_step_older_than_the_latest_raises(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(5, _state(), config=CONFIG, data_position={})
    with pytest.raises(SaveError, match=r"step 3 was not saved.*older than the latest.*5"):
        ckpt.save(3, _state(), config=CONFIG, data_position={})
    assert ckpt.steps() == [5]
    ckpt.close()


@pytest.mark.parametrize(
    ("orbax_save", "match"),
    [
        (lambda *a, **k: False, r"step 2 was not saved.*declined.*returned False"),
        (lambda *a, **k: True, r"step 2 was not saved.*not a complete checkpoint"),
    ],
)
def test_a_save_orbax_declines_or_does_not_finish_raises(tmp_path, monkeypatch, orbax_save, match):
    ckpt = Checkpointer(tmp_path)
    monkeypatch.setattr(ckpt._manager, "save", orbax_save)
    with pytest.raises(SaveError, match=match):
        ckpt.save(2, _state(), config=CONFIG, data_position={})
    ckpt.close()


def test_a_failed_overwrite_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    first = _state(seed=0)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(5, first, config=CONFIG, data_position={})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt._manager, "save", disk_full)
    with pytest.raises(SaveError, match=r"step 5 was not saved.*No space left on device"):
        ckpt.save(5, _state(seed=1), config=CONFIG, data_position={}, overwrite=True)
    monkeypatch.undo()
    assert ckpt.steps() == [5]
    np.testing.assert_array_equal(_w(ckpt.restore(_state(seed=1), config=CONFIG)[0]), _w(first))
    ckpt.close()


def test_a_non_finite_state_is_never_saved_unless_allowed(tmp_path):
    state = _state()
    bad = state.replace(params={**state.params, "Dense_1": {**state.params["Dense_1"]}})
    bad.params["Dense_1"]["bias"] = bad.params["Dense_1"]["bias"].at[0].set(jnp.nan)
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(
        SaveError, match=r"step 1 was not saved.*\['Dense_1'\]\['bias'\].*NaN or inf"
    ):
        ckpt.save(1, bad, config=CONFIG, data_position={})
    assert ckpt.steps() == []
    ckpt.save(1, bad, config=CONFIG, data_position={}, allow_nonfinite=True)
    restored, _ = ckpt.restore(state, config=CONFIG)
    assert np.isnan(np.asarray(restored.params["Dense_1"]["bias"])[0])
    ckpt.close()


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
def test_save_refuses_a_step_that_is_not_a_count(tmp_path, step):
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(DropmaskError, match=r"Checkpointer.save: step must be an int >= 0.*got"):
        ckpt.save(step, _state(), config=CONFIG, data_position={})
    ckpt.close()


def test_save_refuses_metrics_without_the_best_metric(tmp_path):
    ckpt = Checkpointer(tmp_path, best_metric="accuracy")
    with pytest.raises(
        DropmaskError, match=r"metrics must hold best_metric 'accuracy'.*\['loss'\]"
    ):
        ckpt.save(1, _state(), config=CONFIG, data_position={}, metrics={"loss": 0.5})
    assert ckpt.steps() == []
    ckpt.close()


def _truncate_arrays(step_dir) -> None:
    for path in (step_dir / "state" / "d").iterdir():
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("damage", "what"),
    [
        (lambda d: (d / "record" / "metadata").write_text("{not json"), "record"),
        (_truncate_arrays, "state"),
        (lambda d: (d / "state" / "_METADATA").write_text("{not json"), "state"),
    ],
)
def test_a_damaged_checkpoint_is_reported_by_path_and_set_aside_whole(tmp_path, damage, what):
    state = _state()
    ckpt = Checkpointer(tmp_path / "ckpt")
    for step in (4, 8):
        ckpt.save(step, state, config=CONFIG, data_position={})
    ckpt.close()
    damage(tmp_path / "ckpt" / "8")
    files = sorted(
        p.relative_to(tmp_path / "ckpt" / "8") for p in (tmp_path / "ckpt" / "8").rglob("*")
    )
    ckpt = Checkpointer(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "8"
    with pytest.raises(
        DamagedCheckpointError, match=rf"checkpoint 8 at {path} is damaged: its {what}"
    ):
        ckpt.restore(_state(seed=1), config=CONFIG)
    moved = ckpt.set_aside(8, tmp_path / "damaged")
    assert moved == tmp_path / "damaged" / "8"
    assert sorted(p.relative_to(moved) for p in moved.rglob("*")) == files  # nothing deleted
    assert ckpt.steps() == [4]
    restored, record = ckpt.restore(_state(seed=1), config=CONFIG)
    assert record["step"] == 4
    _assert_same(restored, state)
    ckpt.close()


@pytest.mark.parametrize(
    ("encoded", "match"),
    [
        (b"not msgpack at all", r"from_bytes: encoded must be bytes written by .*to_bytes"),
        (b"", r"from_bytes: encoded must be bytes written by .*to_bytes, got 0 bytes"),
        (to_bytes({"w": jnp.ones(3)}), r"must hold target's structure.*\['w'\]"),
        (
            lambda: to_bytes(_state(width=4)),
            r"params/Dense_0/kernel is float32\(4, 2\) there and float32\(8, 2\)",
        ),
    ],
)
def test_from_bytes_refuses_what_to_bytes_did_not_write_for_this_target(encoded, match):
    encoded = encoded() if callable(encoded) else encoded
    with pytest.raises(DropmaskError, match=match) as info:
        from_bytes(_state(), encoded)
    assert "msgpack" not in str(info.value) and "unpack" not in str(info.value)
    with pytest.raises(DropmaskError, match="from_bytes: encoded must be bytes.*'rb'"):
        from_bytes(_state(), "text")


def test_a_directory_that_is_a_file_is_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for directory in (afile, afile / "ckpt"):
        with pytest.raises(DropmaskError, match=rf"Checkpointer: directory must be.*{afile} is a"):
            Checkpointer(directory)


@pytest.mark.slow  # waits on the checkpointer's threads
def test_a_checkpointer_closed_before_any_save_leaves_no_thread_behind(tmp_path):
    # Orbax removes earlier partial saves on a thread; left running at exit, it printed
    # a traceback after a command's one-line refusal.
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    script = (
        "from dropmask.training import Checkpointer\n"
        f"Checkpointer({str(tmp_path / 'checkpoints')!r}).close()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_damaged_checkpoint_is_reported_once_every_read_it_started_has_finished(
    tmp_path, monkeypatch
):
    # The race a truncated file makes now and then, made every time: the first read
    # fails at once while the others are still in flight. Reads left in flight when the
    # restore raised were finalized later (at exit, most often), each printing
    # "Exception ignored in: <coroutine object _read_array_index_and_device_put ...>".
    import asyncio
    import gc
    import sys

    from orbax.checkpoint._src.serialization import serialization

    state = {f"w{i}": jnp.full((4,), float(i)) for i in range(6)}
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state, config=CONFIG, data_position={})
    reads = {"started": 0, "finished": 0}
    read_shard = serialization._read_shard

    async def first_fails_others_take_a_while(t, **kwargs):
        reads["started"] += 1
        try:
            if reads["started"] == 1:
                raise ValueError("a damaged file")
            await asyncio.sleep(0.1)
            return await read_shard(t, **kwargs)
        finally:
            reads["finished"] += 1

    reports = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    monkeypatch.setattr(serialization, "_read_shard", first_fails_others_take_a_while)
    with pytest.raises(DamagedCheckpointError, match="its state cannot be read"):
        ckpt.restore(state, config=CONFIG)
    assert reads == {"started": len(state), "finished": len(state)}
    assert "new_event_loop" not in vars(asyncio.get_event_loop_policy())
    gc.collect()
    assert reports == []
    monkeypatch.undo()
    restored, _ = ckpt.restore(state, config=CONFIG)  # orbax's own loops are as they were
    ckpt.close()
    assert all(np.array_equal(restored[k], state[k]) for k in state)
