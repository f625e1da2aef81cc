"""The `dropmask` command: every flag of `dropmask train --help`, and one-line errors."""

import dataclasses
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import jax.numpy as jnp
import pytest

from dropmask import cli
from dropmask.examples.digits import configs


def _tiny_flags(**changes) -> list[str]:
    """digits' tiny config as --config overrides, with ``changes`` applied."""
    config = configs.get_tiny_config()
    for name, value in changes.items():
        config[name] = value
    return [
        f"--config.{k}={v!r}" if isinstance(v, tuple) else f"--config.{k}={v}"
        for k, v in config.items()
    ]


def _train(capsys, *args: str, tiny: bool = True, **changes) -> tuple[int, str, str]:
    argv = ["train", "digits", *(_tiny_flags(**changes) if tiny else []), *args]
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def _one_line_error(err: str, *words: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("dropmask"), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


def _summary(workdir) -> dict:
    return json.loads((workdir / "summary.json").read_text())


# Every flag `dropmask train --help` lists, and the test that exercises it.
FLAG_TESTS = {
    "--help": "test_help_lists_every_flag",
    "--list": "test_list_names_the_examples",
    "--workdir": "test_workdir_gets_every_output",
    "--steps": "test_steps_rate_seed",
    "--rate": "test_steps_rate_seed",
    "--seed": "test_steps_rate_seed",
    "--resume": "test_resume",
    "--devices": "test_devices",
    "--compare-rates": "test_compare_rates_with_num_seeds",
    "--num-seeds": "test_compare_rates_with_num_seeds",
    "--mc-samples": "test_mc_samples_with_compare_rates",
    "--no-progress": "test_progress_bar_and_no_progress",
    "--coordinator-address": "test_multi_process_flags_need_each_other",
    "--num-processes": "test_multi_process_flags_need_each_other",
    "--process-id": "test_multi_process_flags_need_each_other",
    "--config": "test_a_named_config_is_the_start_and_overrides_apply_on_top",
}


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text))
    assert flags == set(FLAG_TESTS), flags ^ set(FLAG_TESTS)
    for test in FLAG_TESTS.values():
        assert callable(globals()[test]), test
    # The two-process test runs the flags end to end (tests/training/test_multihost.py).


def test_list_names_the_examples(capsys):
    assert cli.main(["train", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("digits") and "sst2" in out and "package.module:attribute" in out
    assert cli.main(["train"]) == 2
    _one_line_error(capsys.readouterr().err, "give a TARGET", "--list")


def test_top_level_help_names_the_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "train" in out and "dropmask.training" not in out


@pytest.mark.slow
def test_workdir_gets_every_output(capsys, tmp_path):
    status, out, err = _train(capsys, "--no-progress", f"--workdir={tmp_path}")
    assert status == 0, err
    for name in ("metrics.jsonl", "summary.json", "curves.png"):
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    # Saved at 4, 8, 12: the latest two are kept, and the best if it is step 4.
    kept = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    assert {"8", "12"} <= kept <= {"4", "8", "12"}
    # The final table: one row per evaluated split and the gap.
    assert re.search(r"^eval\s+\d\.\d{4}\s+\d\.\d{4}$", out, re.M), out
    assert re.search(r"^gap\s+[+-]\d\.\d{4}", out, re.M), out


@pytest.mark.slow
def test_steps_rate_seed(capsys, tmp_path):
    args = ("--no-progress", f"--workdir={tmp_path}", "--steps=3", "--rate=0.25", "--seed=5")
    status, _, err = _train(capsys, *args)
    assert status == 0, err
    summary = _summary(tmp_path)
    assert summary["steps"] == 3
    assert summary["config"]["rate"] == 0.25 and summary["config"]["seed"] == 5
    train_rows = [
        json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(r["step"] for r in train_rows) == 3


@pytest.mark.slow
def test_resume(capsys, tmp_path):
    base = ("--no-progress", f"--workdir={tmp_path}")
    status, _, err = _train(capsys, *base, "--resume")
    assert status == 2
    _one_line_error(err, "--resume found no checkpoint", str(tmp_path))
    assert _train(capsys, *base, "--steps=4")[0] == 0
    status, _, err = _train(capsys, *base, "--steps=8")
    assert status == 2
    _one_line_error(err, "already holds checkpoints", "--resume")
    status, _, err = _train(capsys, *base, "--steps=8", "--resume")
    assert status == 0, err
    assert _summary(tmp_path)["start_step"] == 4 and _summary(tmp_path)["steps"] == 8
    status, _, err = _train(capsys, *base, "--resume", hidden=(8,))
    assert status == 2
    _one_line_error(err, "config.hidden=[32]", "config.hidden=[8]")


@pytest.mark.slow
def test_devices(capsys, tmp_path):
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path}", "--devices=4")
    assert status == 0, err
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path / 'b'}", "--devices=9")
    assert status == 2
    _one_line_error(err, "devices must be an int in [1, 8]")
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path / 'c'}", "--devices=5")
    assert status == 2
    _one_line_error(err, "batch_size that is a multiple of 5")


@pytest.mark.slow
def test_compare_rates_with_num_seeds(capsys, tmp_path):
    args = ("--no-progress", f"--workdir={tmp_path}", "--compare-rates=0,0.5", "--num-seeds=2")
    status, out, err = _train(capsys, *args, steps=4, checkpoint_every=0)
    assert status == 0, err
    assert re.search(r"^0\.5\s+2\s+\d\.\d{4} ± \d\.\d{4}", out, re.M), out
    summary = _summary(tmp_path)
    assert list(summary["rates"]) == ["0", "0.5"]
    assert summary["rates"]["0.5"]["seeds"] == [0, 1]
    assert (tmp_path / "rate_0" / "seed_1" / "summary.json").is_file()
    status, _, err = _train(capsys, "--compare-rates=0,x", f"--workdir={tmp_path / 'b'}")
    assert status == 2
    _one_line_error(err, "--compare-rates takes comma-separated rates")
    status, _, err = _train(capsys, "--compare-rates=0,1.5", f"--workdir={tmp_path / 'c'}")
    assert status == 2
    _one_line_error(err, "--compare-rates takes dropout rates in [0, 1)")
    assert not (tmp_path / "c").exists()
    status, _, err = _train(capsys, "--rate=1.5", f"--workdir={tmp_path / 'd'}")
    assert status == 2
    _one_line_error(err, "--rate takes dropout rates in [0, 1)")
    assert not (tmp_path / "d").exists()
    status, _, err = _train(capsys, "--compare-rates=0", "--rate=0.1")
    assert status == 2
    _one_line_error(err, "not both")
    status, _, err = _train(capsys, "--num-seeds=3")
    assert status == 2
    _one_line_error(err, "--num-seeds applies to --compare-rates")


# A training run per rate: the loop's sampled evaluation is in
# tests/training/test_uncertainty_eval.py, and --mc-samples's refusal in
# test_bad_flag_and_config_values_are_one_line.
@pytest.mark.slow
def test_mc_samples_with_compare_rates(capsys, tmp_path):
    args = ("--no-progress", f"--workdir={tmp_path}", "--compare-rates=0.5", "--mc-samples=3")
    status, out, err = _train(capsys, *args, steps=4, checkpoint_every=0)
    assert status == 0, err
    header = out.splitlines()[0]
    for column in ("eval accuracy", "eval loss", "nll", "ece", "mc accuracy", "mc nll", "mc ece"):
        assert column in header, header
    run = _summary(tmp_path / "rate_0.5" / "seed_0")
    assert run["config"]["mc_samples"] == 3
    for name in ("nll", "ece", "mc_accuracy", "mc_nll", "mc_ece"):
        assert 0.0 <= run["metrics"][name] < 10.0, name
    assert "mc_accuracy" not in run["splits"]["train_eval"]
    lines = (tmp_path / "rate_0.5" / "seed_0" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert all("mc_ece" in r for r in rows if r["split"] == "eval")
    status, _, err = _train(capsys, "--mc-samples=-1", f"--workdir={tmp_path / 'b'}")
    assert status == 2
    _one_line_error(err, "--mc-samples must be >= 0")
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # two training runs
def test_progress_bar_and_no_progress(capsys, tmp_path):
    # Four steps: an evaluation and a checkpoint each, as in a longer run.
    status, _, err = _train(capsys, f"--workdir={tmp_path / 'a'}", steps=4)
    assert status == 0
    assert "loss=" in err and "ex_per_s=" in err and "4/4" in err
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path / 'b'}", steps=4)
    assert status == 0 and err == ""


def test_multi_process_flags_need_each_other(capsys):
    status, _, err = _train(capsys, "--coordinator-address=127.0.0.1:1", "--process-id=0")
    assert status == 2
    _one_line_error(err, "--num-processes", "--process-id")
    args = ("--coordinator-address=127.0.0.1:1", "--num-processes=2", "--process-id=2")
    status, _, err = _train(capsys, *args)
    assert status == 2
    _one_line_error(err, "process_id must be in [0, num_processes)")


@pytest.mark.slow
def test_config_overrides(capsys, tmp_path):
    status, _, err = _train(
        capsys, "--no-progress", f"--workdir={tmp_path}", "--config.hidden", "(16, 8)"
    )
    assert status == 0, err
    assert _summary(tmp_path)["config"]["hidden"] == [16, 8]
    status, _, err = _train(capsys, "--config.nope=1")
    assert status == 2
    _one_line_error(err, "--config.nope: no such config entry", "hidden")
    status, _, err = _train(capsys, "--config.learning_rate=fast")
    assert status == 2
    _one_line_error(err, "not a valid float")


def test_a_named_config_is_the_start_and_overrides_apply_on_top(capsys, tmp_path, monkeypatch):
    from dropmask.examples.digits import train as digits_train

    def get_wide_config():
        config = configs.get_tiny_config()
        config.hidden = (24,)
        return config

    def get_broken_config():
        config = get_wide_config()
        with config.unlocked():
            config.extra = 1
        return config

    named = {"wide": get_wide_config, "broken": get_broken_config}
    monkeypatch.setattr(
        digits_train, "example", dataclasses.replace(digits_train.example, configs=named)
    )
    flags = ["--no-progress", f"--workdir={tmp_path}", "--config.learning_rate=0.02"]
    status, _, err = _train(capsys, "--config", "wide", *flags, tiny=False)
    assert status == 0, err
    saved = _summary(tmp_path)["config"]
    assert saved["hidden"] == [24] and saved["learning_rate"] == 0.02
    assert saved["steps"] == configs.get_tiny_config().steps
    status, _, err = _train(capsys, "--config=narrow", tiny=False)
    assert status == 2
    _one_line_error(err, "--config must name one of digits's configs (broken, wide)", "'narrow'")
    status, _, err = _train(capsys, "--config=broken", tiny=False)
    assert status == 2
    _one_line_error(err, "config 'broken' must have the default's entries", "['extra']")
    monkeypatch.undo()
    status, _, err = _train(capsys, "--config=wide", tiny=False)
    assert status == 2
    _one_line_error(err, "digits's configs (none besides the default)")


@pytest.mark.slow  # two training runs
def test_resuming_a_named_config_run_without_it_says_to_pass_it_again(
    capsys, tmp_path, monkeypatch
):
    from dropmask.examples.digits import train as digits_train

    def get_wide_config():
        config = configs.get_tiny_config()
        config.hidden = (24,)
        return config

    named = {"wide": get_wide_config}
    monkeypatch.setattr(
        digits_train, "example", dataclasses.replace(digits_train.example, configs=named)
    )
    flags = ["--no-progress", f"--workdir={tmp_path}"]
    assert _train(capsys, "--config=wide", "--steps=4", *flags, tiny=False)[0] == 0
    status, _, err = _train(capsys, "--resume", "--steps=8", *flags, tiny=False)
    assert status == 2
    _one_line_error(
        err,
        f"checkpoint 4 in {tmp_path / 'checkpoints'} was made with --config wide",
        "this run starts from the default config",
        "Resume with --config wide (pass it again)",
    )
    assert _train(capsys, "--config=wide", "--resume", "--steps=8", *flags, tiny=False)[0] == 0
    # A run of the default config, resumed with --config wide.
    flags = ["--no-progress", f"--workdir={tmp_path / 'b'}"]
    assert _train(capsys, "--steps=4", *flags, tiny=False)[0] == 0
    status, _, err = _train(capsys, "--config=wide", "--resume", "--steps=8", *flags, tiny=False)
    assert status == 2
    _one_line_error(err, "was made with the default config", "Resume without --config")


def test_data_path_missing_or_unreadable(capsys, tmp_path):
    missing = tmp_path / "nope.npz"
    status, _, err = _train(capsys, f"--workdir={tmp_path / 'a'}", data_path=str(missing))
    assert status == 2
    _one_line_error(err, str(missing), "does not exist")
    garbage = tmp_path / "digits.npz"
    garbage.write_bytes(b"not a zip")
    status, _, err = _train(capsys, f"--workdir={tmp_path / 'b'}", data_path=str(garbage))
    assert status == 2
    _one_line_error(err, str(garbage), "not readable")
    assert not (tmp_path / "a" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["train", "digits", "--bogus"], ["unrecognized argument '--bogus'"]),
        (["train", "digits", "--steps=many"], ["--steps", "invalid int value"]),
        (["train", "digits", "--steps=0"], ["--steps must be >= 1"]),
        (["train"], ["give a TARGET to train, or --list"]),
        (["train", "nonesuch"], ["no example 'nonesuch'", "bundled example (digits"]),
        ([], ["choose a command: train"]),
        (["fly"], ["invalid choice: 'fly'"]),
    ],
)
def test_usage_errors_are_one_line_with_status_2(capsys, argv, words):
    try:
        status = cli.main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    _one_line_error(capsys.readouterr().err, *words)


def _with_train_step(monkeypatch, change):
    """Makes `dropmask train digits` use a train step whose outputs pass through ``change``."""
    from dropmask.examples.digits import train as digits_train

    example = digits_train.example

    def train_step(state, batch):
        return change(state, *example.train_step(state, batch))

    monkeypatch.setattr(
        digits_train, "example", dataclasses.replace(example, train_step=train_step)
    )


def _train_interrupted(capsys, *args: str, **changes) -> tuple[int, str, str]:
    try:
        return _train(capsys, *args, **changes)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left dropmask train as a KeyboardInterrupt traceback")


def test_ctrl_c_names_the_last_checkpoint_and_the_resume_command(capsys, tmp_path, monkeypatch):
    def interrupt_at_step_6(state, new, metrics):
        if int(state.step) == 5:
            raise KeyboardInterrupt
        return new, metrics

    _with_train_step(monkeypatch, interrupt_at_step_6)
    status, _, err = _train_interrupted(capsys, "--no-progress", f"--workdir={tmp_path}")
    assert status == 130
    _one_line_error(err, "interrupted", f"step 4 in {tmp_path}", "Resume with: dropmask train")
    monkeypatch.undo()
    command = shlex.split(err.split("Resume with: ")[1])
    assert command[:2] == ["dropmask", "train"] and command[-1] == "--resume"
    assert cli.main(command[1:]) == 0
    assert _summary(tmp_path)["start_step"] == 4 and _summary(tmp_path)["steps"] == 12


def test_ctrl_c_before_any_checkpoint_says_there_is_nothing_to_resume(
    capsys, tmp_path, monkeypatch
):
    def interrupt(state, new, metrics):
        raise KeyboardInterrupt

    _with_train_step(monkeypatch, interrupt)
    status, _, err = _train_interrupted(capsys, "--no-progress", f"--workdir={tmp_path}")
    assert status == 130
    _one_line_error(err, "interrupted", "No checkpoint was saved", "run the same command again")


def test_workdir_that_is_a_file(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for workdir in (afile, afile / "run"):
        status, _, err = _train(capsys, "--no-progress", f"--workdir={workdir}")
        assert status == 2
        _one_line_error(err, "workdir must be a directory", f"{afile} is a file", "--workdir")


# A training run: the loop refuses alike and changes nothing in
# tests/training/test_loop.py, and a refusal's one line is
# test_every_kind_of_user_mistake_exits_2_in_one_line's.
@pytest.mark.slow
def test_resume_with_steps_below_the_checkpoint_changes_nothing(capsys, tmp_path):
    base = ("--no-progress", f"--workdir={tmp_path}")
    assert _train(capsys, *base, "--steps=8")[0] == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    status, _, err = _train(capsys, *base, "--steps=4", "--resume")
    assert status == 2
    _one_line_error(err, "step 8, past config.steps=4", "nothing was changed", "--steps above 8")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# Training runs: the loop stops alike in tests/training/test_loop.py, and an error
# after the run started exits 1 in one line in
# test_a_save_that_fails_once_the_run_started_exits_1.
@pytest.mark.slow
def test_a_nonfinite_loss_stops_the_run(capsys, tmp_path, monkeypatch):
    def nan_loss_at_step_6(state, new, metrics):
        return new, {**metrics, "loss": jnp.where(state.step == 5, jnp.nan, metrics["loss"])}

    _with_train_step(monkeypatch, nan_loss_at_step_6)
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path}")
    assert status == 1
    _one_line_error(
        err, "loss is nan at step 6", "checkpoint is step 4", "--config.allow_nonfinite_loss=True"
    )
    status, _, err = _train(
        capsys, "--no-progress", f"--workdir={tmp_path / 'b'}", allow_nonfinite_loss=True
    )
    assert status == 0, err


# Training runs: the loop sets the damaged checkpoint aside alike and notes it in one
# line in tests/training/test_loop.py.
@pytest.mark.slow
def test_a_damaged_checkpoint_is_noted_and_resume_uses_the_previous(capsys, tmp_path):
    base = ("--no-progress", f"--workdir={tmp_path}")
    assert _train(capsys, *base, "--steps=8")[0] == 0
    (tmp_path / "checkpoints" / "8" / "record" / "metadata").write_text("{")
    status, _, err = _train(capsys, *base, "--resume")
    assert status == 0
    _one_line_error(
        err, f"checkpoint 8 at {tmp_path / 'checkpoints' / '8'} is damaged", "from checkpoint 4"
    )
    assert _summary(tmp_path)["start_step"] == 4


# A resume in a fresh process: what orbax's reads print at exit shows only there. With
# FORCED, a read that succeeds stays in flight 0.2 s, so that the damaged file's read fails
# while the others are pending (without it, 1 resume in 6 met that race).
_RESUME = """
import asyncio, gc, sys
from orbax.checkpoint._src.serialization import serialization
from dropmask import cli

if {forced}:
    read_shard = serialization._read_shard

    async def failures_first(t, **kwargs):
        value = await read_shard(t, **kwargs)
        await asyncio.sleep(0.2)
        return value

    serialization._read_shard = failures_first
status = cli.main({argv!r})
gc.collect()  # finalizes now what reads were left in flight, not whenever the collector runs
sys.exit(status)
"""


@pytest.mark.slow
@pytest.mark.parametrize("forced", [False, True])
def test_a_truncated_checkpoint_is_one_line_in_a_fresh_process(capsys, tmp_path, forced):
    base = ("--no-progress", f"--workdir={tmp_path}", "--devices=1")
    assert _train(capsys, *base, "--steps=8")[0] == 0
    # The damage a user reported: the largest file cut to half (one device, as on their
    # CPU: then it holds the arrays, and the leaves in its first half still read).
    largest = max(
        (p for p in (tmp_path / "checkpoints" / "8" / "state").rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    argv = ["train", "digits", *_tiny_flags(), *base, "--resume"]
    done = subprocess.run(
        [sys.executable, "-c", _RESUME.format(forced=forced, argv=argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    _one_line_error(
        done.stderr,
        f"checkpoint 8 at {tmp_path / 'checkpoints' / '8'} is damaged",
        "from checkpoint 4",
    )
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert _summary(tmp_path)["start_step"] == 4


def test_a_bug_shows_its_traceback_and_asks_for_a_report(capsys, tmp_path, monkeypatch):
    def bug(state, new, metrics):
        raise ZeroDivisionError("a bug")

    _with_train_step(monkeypatch, bug)
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path}")
    assert status == 1
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err
    assert err.strip().splitlines()[-1].startswith("dropmask train: internal error")
    assert "report it" in err.strip().splitlines()[-1]


def test_a_path_the_run_cannot_write_is_one_line(capsys, tmp_path, monkeypatch):
    from dropmask.training import _summary

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "summary.json"))

    monkeypatch.setattr(_summary, "write_run", denied)
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path}")
    assert status == 1
    _one_line_error(err, f"cannot use {tmp_path / 'summary.json'}: Permission denied")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("--config.learning_rate=nan", ["--config.learning_rate must be a finite float, got nan"]),
        ("--config.learning_rate=inf", ["--config.learning_rate must be a finite float, got inf"]),
        ("--config.hidden=('a',)", ["--config.hidden=('a',)", "tuple of int"]),
        ("--config.allow_nonfinite_loss=maybe", ["allow_nonfinite_loss=maybe", "bool"]),
    ],
)
def test_config_values_of_the_wrong_kind(capsys, override, words):
    status, _, err = _train(capsys, override)
    assert status == 2
    _one_line_error(err, *words)


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        (["--workdir="], 2, ["--workdir must be a directory path, got ''", "runs/EXAMPLE"]),
        (
            ["--coordinator-address=nonsense", "--num-processes=2", "--process-id=0"],
            2,
            ["coordinator_address must be HOST:PORT", "'nonsense'", "--coordinator-address="],
        ),
        (["--config.hidden=(0,)"], 2, ["config.hidden must be widths >= 1", "--config.hidden="]),
        (["--config.learning_rate=-1"], 2, ["config.learning_rate must be > 0", "-1.0"]),
        (["--config.label_noise=2"], 2, ["config.label_noise must be in [0, 1]", "got 2.0"]),
        (["--config.data_seed=-3"], 2, ["config.data_seed must be an int >= 0", "got -3"]),
        (["--mc-samples=-1"], 2, ["--mc-samples must be >= 0"]),
    ],
)
def test_bad_flag_and_config_values_are_one_line(capsys, tmp_path, args, status, words):
    code, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path / 'w'}", *args)
    assert code == status
    _one_line_error(err, *words)
    assert not (tmp_path / "w").exists()


@pytest.mark.slow  # runs at two rates; a run's Ctrl-C stays in the fast suite
def test_ctrl_c_during_compare_rates_names_each_saved_run(capsys, tmp_path, monkeypatch):
    calls = []

    def interrupt_at_the_sixth_step(state, new, metrics):
        calls.append(1)
        if len(calls) == 6:  # step 2 of the second run
            raise KeyboardInterrupt
        return new, metrics

    _with_train_step(monkeypatch, interrupt_at_the_sixth_step)
    args = ("--no-progress", f"--workdir={tmp_path}", "--compare-rates=0,0.5")
    status, _, err = _train_interrupted(capsys, *args, steps=4, checkpoint_every=4)
    assert status == 130
    _one_line_error(err, "interrupted", "rate_0/seed_0: step 4", "--compare-rates=0,0.5")
    assert "rate_0.5" not in err.split("Resume with")[0]
    monkeypatch.undo()
    command = shlex.split(err.split("Resume with: ")[1])
    assert cli.main(command[1:]) == 0
    assert list(_summary(tmp_path)["rates"]) == ["0", "0.5"]


# A fresh process; in this one, the same refusal is one line in
# test_every_kind_of_user_mistake_exits_2_in_one_line, and comes before any checkpointer
# (whose threads printed at exit) in tests/training/test_loop.py.
@pytest.mark.slow
def test_a_config_refused_by_the_example_is_one_line_in_a_fresh_process(tmp_path):
    # In-process tests cannot see what threads print at interpreter exit: orbax's
    # cleanup thread once added a 30-line traceback after the refusal.
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    argv = ["train", "digits_nnx", "--config.model=conv", f"--workdir={tmp_path / 'run'}"]
    done = subprocess.run(
        [sys.executable, "-m", "dropmask.cli", *argv, "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "dropmask train: error: digits_nnx: config.model must be 'mlp' (the NNX example "
        "trains the MLP only), got 'conv'. Use dropmask train digits --config.model=conv for "
        "the convolutional net."
    ], done.stderr
    assert not (tmp_path / "run").exists()


def _run_saved_at_step_4(workdir: pathlib.Path) -> pathlib.Path:
    from dropmask.training import Checkpointer

    checkpointer = Checkpointer(workdir / "checkpoints")
    checkpointer.save(4, {"w": jnp.ones(2)}, config={}, data_position={})
    checkpointer.close()
    return workdir


def _a_file(path: pathlib.Path) -> pathlib.Path:
    path.write_text("")
    return path


# Each kind of user mistake: the command line (given a fresh directory) and its one line.
MISTAKES = {
    "unknown example": (lambda d: ["train", "nonesuch"], "no example 'nonesuch'"),
    "unknown example to sample": (
        lambda d: ["sample", "nonesuch", "--prompt", "x"],
        "no example 'nonesuch'",
    ),
    "unknown example to audit": (lambda d: ["audit", "nonesuch"], "no example 'nonesuch'"),
    "unknown --config name": (
        lambda d: ["train", "digits", "--config=narrow"],
        "--config must name one of digits's configs",
    ),
    "unknown --config entry": (
        lambda d: ["train", "digits", "--config.nope=1"],
        "--config.nope: no such config entry",
    ),
    "bad --config value for the loop": (
        lambda d: ["train", "digits", "--config.keep_checkpoints=0", f"--workdir={d / 'w'}"],
        "config.keep_checkpoints must be an int >= 1",
    ),
    "bad --config value for the data": (
        lambda d: ["train", "digits", "--config.learning_rate=-1", f"--workdir={d / 'w'}"],
        "config.learning_rate must be > 0",
    ),
    "bad --config value for the model": (
        lambda d: ["train", "digits_nnx", "--config.model=conv", f"--workdir={d / 'w'}"],
        "config.model must be 'mlp'",
    ),
    "workdir that is a file": (
        lambda d: ["train", "digits", f"--workdir={_a_file(d / 'f')}"],
        "workdir must be a directory",
    ),
    "--resume without checkpoints": (
        lambda d: ["train", "digits", "--resume", f"--workdir={d / 'w'}"],
        "--resume found no checkpoint",
    ),
    "more --devices than there are": (
        lambda d: ["train", "digits", "--devices=9", f"--workdir={d / 'w'}"],
        "devices must be an int in [1, 8]",
    ),
    "sample an example without a sampler": (
        lambda d: ["sample", "digits", "--prompt", "x", f"--workdir={_run_saved_at_step_4(d)}"],
        "the example 'digits' does not generate text",
    ),
    "sample a --step never saved": (
        lambda d: [
            "sample",
            "lm",
            "--prompt",
            "x",
            "--step=9",
            f"--workdir={_run_saved_at_step_4(d)}",
        ],
        "no checkpoint for step 9",
    ),
}


@pytest.mark.parametrize("kind", MISTAKES)
def test_every_kind_of_user_mistake_exits_2_in_one_line(capsys, tmp_path, kind):
    command, words = MISTAKES[kind]
    try:
        status = cli.main(command(tmp_path))
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    _one_line_error(capsys.readouterr().err, words)


def test_a_save_that_fails_once_the_run_started_exits_1(capsys, tmp_path, monkeypatch):
    from dropmask.training import SaveError, _checkpoint

    def full_disk(self, step, *args, **kwargs):
        raise SaveError(f"Checkpointer.save: step {step} was not saved: the disk is full.")

    monkeypatch.setattr(_checkpoint.Checkpointer, "_write", full_disk)
    status, _, err = _train(capsys, "--no-progress", f"--workdir={tmp_path}")
    assert status == 1
    _one_line_error(err, "step 4 was not saved: the disk is full")
