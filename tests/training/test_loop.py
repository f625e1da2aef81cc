"""The shared loop: exact resume, atomic saves under a kill, devices, workdir outputs."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from digits_tiny import EXAMPLES, ROOT, example_named, tiny_config

from dropmask import DropmaskError
from dropmask.training import (
    Checkpointer,
    CheckpointError,
    NonFiniteLossError,
    compare_rates,
    train,
)
from dropmask.training._logging import read_metrics
from dropmask.training._loop import checkpoint_steps

# Measured on 8 fake CPU devices against 1 (tiny digits config, 12 steps): the largest
# per-step loss difference is 2.4e-7 (1.0e-7 relative), from the order of the
# all-reduce's sums; the masks themselves are identical.
DEVICE_RTOL = 1e-5


# Every guarantee below runs on both front ends; on the NNX twin with the slow tests,
# as each is a training run and the loop's code is the same for both (the NNX state's
# own checkpoint and resume are in tests/training/test_nnx_state.py).
@pytest.fixture(
    scope="module",
    params=[EXAMPLES[0], *(pytest.param(name, marks=pytest.mark.slow) for name in EXAMPLES[1:])],
)
def example(request):
    return example_named(request.param)


@pytest.fixture(scope="module")
def reference(example, tmp_path_factory):
    """An uninterrupted 12-step run on one device."""
    return train(example, tiny_config(), tmp_path_factory.mktemp("ref"), devices=1, progress=False)


@pytest.mark.slow
def test_resume_gives_bit_identical_losses(example, reference, tmp_path):
    config = tiny_config()
    config.steps = 8
    first = train(example, config, tmp_path, devices=1, progress=False)
    config.steps = 12
    resumed = train(example, config, tmp_path, devices=1, progress=False, resume=True)
    assert resumed.start_step == 8
    assert first.losses + resumed.losses == reference.losses  # exact float equality
    assert resumed.final == reference.final
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in rows] == list(range(1, 13))
    ref_rows = [
        r for r in read_metrics(reference.workdir / "metrics.jsonl") if r["split"] == "train"
    ]
    assert rows == ref_rows


_KILLED_SAVE = textwrap.dedent(
    """
    import os, sys, time
    from orbax.checkpoint._src.path import atomicity
    from dropmask.examples.{name}.train import example
    from dropmask.training import train
    sys.path.insert(0, {tests!r})
    from digits_tiny import tiny_config

    finalize = atomicity.AtomicRenameTemporaryPath.finalize

    async def stall_at_step_8(self):
        if self.get_final().name == "8":
            print("SAVING", flush=True)  # step 8 is written to its temporary directory
            time.sleep(600)
        await finalize(self)

    atomicity.AtomicRenameTemporaryPath.finalize = stall_at_step_8
    train(example, tiny_config(), {workdir!r}, devices=1, progress=False)
    """
)


@pytest.mark.slow
def test_a_run_killed_during_a_save_resumes_from_the_previous_checkpoint(
    example, reference, tmp_path
):
    script = _KILLED_SAVE.format(
        name=example.name, tests=str(ROOT / "tests" / "training"), workdir=str(tmp_path)
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
    }
    child = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "SAVING"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "4" in names and "8" not in names
    assert any(name.startswith("8.orbax-checkpoint-tmp") for name in names)  # the partial save
    resumed = train(example, tiny_config(), tmp_path, devices=1, progress=False, resume=True)
    assert resumed.start_step == 4
    assert resumed.losses == reference.losses[4:]
    assert resumed.final == reference.final
    assert not any("tmp" in p.name for p in (tmp_path / "checkpoints").iterdir())


@pytest.mark.slow
def test_eight_devices_match_one(example, reference, tmp_path):
    sharded = train(example, tiny_config(), tmp_path, devices=8, progress=False)
    np.testing.assert_allclose(sharded.losses, reference.losses, rtol=DEVICE_RTOL, atol=0)
    for split, metrics in reference.final.items():
        for name, value in metrics.items():
            assert sharded.final[split][name] == pytest.approx(value, rel=DEVICE_RTOL), (
                split,
                name,
            )


@pytest.mark.slow
def test_workdir_holds_metrics_events_plot_summary_and_checkpoints(reference):
    workdir = reference.workdir
    rows = read_metrics(workdir / "metrics.jsonl")
    train_rows = [r for r in rows if r["split"] == "train"]
    assert len(train_rows) == 12 and all({"step", "loss", "accuracy"} <= set(r) for r in train_rows)
    assert [r["loss"] for r in train_rows] == reference.losses
    eval_steps = [r["step"] for r in rows if r["split"] == "eval"]
    assert eval_steps == [4, 8, 12]
    assert {r["split"] for r in rows} == {"train", "train_eval", "eval"}
    events = list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["metrics"] == reference.final["eval"]
    assert summary["steps"] == 12 and summary["wall_seconds"] > 0
    assert summary["config"]["hidden"] == [32]
    assert summary["gap"]["accuracy"] == pytest.approx(
        reference.final["train_eval"]["accuracy"] - reference.final["eval"]["accuracy"], abs=1e-12
    )
    png = (workdir / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    # Saved at 4, 8, 12; the latest two are kept, plus the best by eval accuracy.
    ckpt = Checkpointer(workdir / "checkpoints", best_metric="accuracy")
    best = ckpt.best_step()
    assert set(ckpt.steps()) == {8, 12} | {best}
    assert ckpt.record(12)["data_position"] == {
        "step": 12,
        "epoch": 3,
        "batch": 0,
        "steps_per_epoch": 4,
        "num_examples": 96,
    }
    ckpt.close()


@pytest.mark.slow
def test_refuses_to_overwrite_checkpoints_or_resume_without_them(example, reference, tmp_path):
    with pytest.raises(CheckpointError, match="already holds checkpoints.*--resume"):
        train(example, tiny_config(), reference.workdir, devices=1, progress=False)
    with pytest.raises(CheckpointError, match="--resume found no checkpoint"):
        train(example, tiny_config(), tmp_path, devices=1, progress=False, resume=True)


@pytest.mark.slow
def test_resume_with_another_config_names_the_entry(example, reference):
    config = tiny_config()
    config.hidden = (16,)
    with pytest.raises(CheckpointError, match=r"config\.hidden=\[32\].*config\.hidden=\[16\]"):
        train(example, config, reference.workdir, devices=1, progress=False, resume=True)
    config = tiny_config()
    config.train_size = 120
    with pytest.raises(CheckpointError, match="train_size"):
        train(example, config, reference.workdir, devices=1, progress=False, resume=True)


@pytest.mark.slow
def test_compare_rates_reports_the_spread_over_seeds(example, tmp_path):
    config = tiny_config()
    config.steps, config.checkpoint_every = 8, 0
    summary = compare_rates(
        example, config, tmp_path, [0.0, 0.5], [0, 1], devices=1, progress=False
    )
    assert list(summary["rates"]) == ["0", "0.5"]
    for entry in summary["rates"].values():
        finals = [run["final"]["eval"]["accuracy"] for run in entry["runs"]]
        stats = entry["eval"]["accuracy"]
        assert stats["mean"] == pytest.approx(np.mean(finals), abs=1e-12)
        assert stats["std"] == pytest.approx(np.std(finals, ddof=1), abs=1e-12)
        assert stats["min"] == min(finals) and stats["max"] == max(finals)
        assert entry["gap"]["accuracy"]["mean"] == pytest.approx(
            entry["train_eval"]["accuracy"]["mean"] - stats["mean"], abs=1e-12
        )
        assert finals[0] != finals[1]  # seeds differ in init, masks and order
    assert (tmp_path / "rate_0.5" / "seed_1" / "metrics.jsonl").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["rates"]["0"]["seeds"] == [0, 1]
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        compare_rates(example, config, tmp_path, [0.0, 0.5], [0, 1], devices=1, progress=False)


def test_comparison_curves_match_seeds_by_step():
    from dropmask.training._summary import seed_curves

    # Seed 0 also evaluated at 750; seed 1 evaluated 1000 twice (a resumed run).
    curves = [
        [(500, 0.6), (750, 0.7), (1000, 0.8), (1500, 0.9)],
        [(500, 0.5), (1000, 0.1), (1000, 0.7), (1500, 0.95)],
    ]
    steps, values = seed_curves(curves)
    assert steps == [500, 1000, 1500]
    np.testing.assert_array_equal(values, [[0.6, 0.8, 0.9], [0.5, 0.7, 0.95]])


def test_comparison_table_with_one_seed_prints_no_spread():
    from dropmask.training._summary import comparison_table

    def stats(mean, std):
        return {"mean": mean, "std": std, "min": mean - std, "max": mean + std}

    summary = {
        "best_metric": "accuracy",
        "rates": {
            "0": {"seeds": [0], "eval": {"accuracy": stats(0.8, 0.0)}},
            "0.5": {"seeds": [0, 1], "eval": {"accuracy": stats(0.85, 0.01)}},
        },
    }
    table = comparison_table(summary)
    assert "0.8000 ± 0.0000" not in table
    assert re.search(r"^0\s+1\s+0\.8000\s", table, re.M), table
    assert re.search(r"^0\.5\s+2\s+0\.8500 ± 0\.0100", table, re.M), table


def _with_train_step(example, change):
    """``example`` whose train step's outputs pass through ``change(state, new, metrics)``."""

    def train_step(state, batch):
        new, metrics = example.train_step(state, batch)
        return change(state, new, metrics)

    return dataclasses.replace(example, train_step=train_step)


def _nan_loss_at_step_6(state, new, metrics):
    return new, {**metrics, "loss": jnp.where(state.step == 5, jnp.nan, metrics["loss"])}


def test_resume_past_config_steps_says_so_and_changes_nothing(example, reference):
    before = {p: p.read_bytes() for p in reference.workdir.rglob("*") if p.is_file()}
    config = tiny_config()
    config.steps = 8
    with pytest.raises(
        CheckpointError, match=r"latest checkpoint .* is step 12, past config.steps=8; nothing"
    ):
        train(example, config, reference.workdir, devices=1, progress=False, resume=True)
    after = {p: p.read_bytes() for p in reference.workdir.rglob("*") if p.is_file()}
    assert after == before


def test_a_nonfinite_loss_stops_the_run_at_that_step(example, tmp_path):
    nan_example = _with_train_step(example, _nan_loss_at_step_6)
    with pytest.raises(
        NonFiniteLossError, match=r"loss is nan at step 6.*checkpoint is step 4"
    ) as e:
        train(nan_example, tiny_config(), tmp_path / "a", devices=1, progress=False)
    assert e.value.step == 6
    assert checkpoint_steps(tmp_path / "a") == [4]
    # Allowed (e.g. a step that skips non-finite updates): the run trains on.
    config = tiny_config()
    config.allow_nonfinite_loss = True
    result = train(nan_example, config, tmp_path / "b", devices=1, progress=False)
    assert np.isnan(result.losses[5]) and np.isfinite(result.losses[6:]).all()
    assert checkpoint_steps(tmp_path / "b")[-1] == 12


def test_a_nonfinite_state_is_never_saved(example, tmp_path):
    def nan_params_at_step_6(state, new, metrics):
        params = jax.tree.map(lambda p: jnp.where(state.step >= 5, jnp.nan, p), new.params)
        return new.replace(params=params), metrics

    config = tiny_config()
    config.allow_nonfinite_loss = True
    with pytest.raises(CheckpointError, match=r"step 8 was not saved.*NaN or inf"):
        train(
            _with_train_step(example, nan_params_at_step_6),
            config,
            tmp_path,
            devices=1,
            progress=False,
        )
    assert checkpoint_steps(tmp_path) == [4]


def test_a_damaged_latest_checkpoint_is_set_aside_and_the_previous_resumes(
    example, reference, tmp_path, capsys
):
    config = tiny_config()
    config.steps = 8
    train(example, config, tmp_path, devices=1, progress=False)
    for path in (tmp_path / "checkpoints" / "8" / "state" / "d").iterdir():
        path.write_bytes(path.read_bytes()[:10])
    capsys.readouterr()
    resumed = train(example, tiny_config(), tmp_path, devices=1, progress=False, resume=True)
    note = capsys.readouterr().err
    assert f"checkpoint 8 at {tmp_path / 'checkpoints' / '8'} is damaged" in note
    assert "resumed from checkpoint 4" in note and len(note.strip().splitlines()) == 1
    assert resumed.start_step == 4
    assert resumed.losses == reference.losses[4:]  # exact: the lost steps are re-run
    assert (tmp_path / "damaged_checkpoints" / "8" / "state").is_dir()
    assert checkpoint_steps(tmp_path)[-1] == 12


def test_a_workdir_that_is_a_file_or_not_writable_is_refused(example, tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    for workdir, match in [(afile, "is a file"), (afile / "run", f"{afile} is a file")]:
        with pytest.raises(
            DropmaskError, match=rf"workdir must be a directory.*{match}.*--workdir"
        ):
            train(example, tiny_config(), workdir, devices=1, progress=False)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(DropmaskError, match=rf"workdir must be writable.*{tmp_path}.*--workdir"):
        train(example, tiny_config(), tmp_path / "run", devices=1, progress=False)
    assert not (tmp_path / "run").exists()


def test_metrics_log_drops_a_partly_written_last_row_and_names_a_bad_line(tmp_path):
    from dropmask.training import DataError

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "split": "train"}\n{"step": 2, "spl')  # killed mid-write
    assert read_metrics(path) == [{"step": 1, "split": "train"}]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(DataError, match=rf"{path}:2: expected a JSON row.*'not json'.*Fix or"):
        read_metrics(path)


def test_checkpoints_are_evaluated_unless_the_config_says_not_to(example, tmp_path):
    config = tiny_config()
    config.eval_every, config.checkpoint_every = 12, 4
    evaluated = train(example, config, tmp_path / "a", devices=1, progress=False)
    rows = read_metrics(evaluated.workdir / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "eval"] == [4, 8, 12]

    config.evaluate_at_checkpoints = False
    result = train(example, config, tmp_path / "b", devices=1, progress=False)
    rows = read_metrics(result.workdir / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "eval"] == [12]
    assert result.losses == evaluated.losses and result.final == evaluated.final
    ckpt = Checkpointer(result.workdir / "checkpoints", best_metric="accuracy")
    # Step 8 is saved without metrics: no earlier evaluation ranks it.
    assert ckpt.steps() == [8, 12] and ckpt.best_step() == 12
    assert ckpt.record(8)["metrics"] is None
    assert ckpt.record(12)["metrics"] == result.final["eval"]
    ckpt.close()

    bad = ml_collections.ConfigDict({**config.to_dict(), "evaluate_at_checkpoints": "no"})
    with pytest.raises(DropmaskError, match=r"config.evaluate_at_checkpoints must be a bool"):
        train(example, bad, tmp_path / "c", devices=1, progress=False)


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_batch_the_devices_cannot_split_is_refused_before_the_workdir_is_written(name, tmp_path):
    config = tiny_config()  # batch_size 24: 5 devices cannot split it
    workdir = tmp_path / "run"
    with pytest.raises(DropmaskError, match="24 examples, which 5 devices cannot split"):
        train(example_named(name), config, workdir, devices=5, progress=False)
    assert not workdir.exists()


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_config_the_example_refuses_is_refused_before_any_checkpointer(
    name, tmp_path, monkeypatch
):
    from dropmask.training import _loop

    def no_checkpointer(*args, **kwargs):
        pytest.fail("a Checkpointer (and orbax's threads) was created before the refusal")

    monkeypatch.setattr(_loop, "Checkpointer", no_checkpointer)
    config = tiny_config()
    # digits refuses the model in load_data, digits_nnx in create_state.
    config.model = "transformer" if name == "digits" else "conv"
    workdir = tmp_path / "run"
    with pytest.raises(DropmaskError, match=r"config.model must be 'mlp'"):
        train(example_named(name), config, workdir, devices=1, progress=False)
    assert not workdir.exists()
