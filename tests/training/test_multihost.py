"""Two processes on 127.0.0.1 with gloo CPU collectives train like one process."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from digits_tiny import EXAMPLES, ROOT, example_named, tiny_config

from dropmask.training import train
from dropmask.training._logging import read_metrics

# Two processes of one device each against one process of one device: the same
# global batch and masks, summed in another order (measured: at most 1.1e-7 relative).
RTOL = 1e-5
STEPS, EVERY = 6, 3


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    return example_named(request.param)


def _config():
    config = tiny_config()
    config.steps, config.eval_every, config.checkpoint_every = STEPS, EVERY, EVERY
    return config


def _flags() -> list[str]:
    """The command-line form of :func:`_config`: every entry as an override."""
    return ["--no-progress"] + [
        f"--config.{k}={v!r}" if isinstance(v, tuple) else f"--config.{k}={v}"
        for k, v in _config().items()
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one(example, tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
    }
    # Process 1 finds its id in the environment, process 0 in the flags: both ways work.
    procs = []
    for pid in range(2):
        args = [sys.executable, "-m", "dropmask.cli", "train", example.name, *_flags()]
        args += [f"--workdir={tmp_path / 'two'}", f"--coordinator-address={address}"]
        env_p = dict(env)
        if pid == 0:
            args += ["--num-processes=2", "--process-id=0"]
        else:
            env_p |= {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
        procs.append(
            subprocess.Popen(
                args,
                cwd=ROOT,
                env=env_p,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=180)
            outputs.append(out)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    assert "eval" in outputs[0] and "eval" not in outputs[1]  # only process 0 reports

    one = train(example, _config(), tmp_path / "one", devices=1, progress=False)
    rows = read_metrics(tmp_path / "two" / "metrics.jsonl")
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert len(losses) == 6
    np.testing.assert_allclose(losses, one.losses, rtol=RTOL, atol=0)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    for name, value in one.final["eval"].items():
        np.testing.assert_allclose(summary["metrics"][name], value, rtol=RTOL)
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["3", "6"]
