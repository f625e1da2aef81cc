"""The loop's Monte Carlo evaluation: metrics beside the deterministic ones, re-evaluation
of a finished run, and a refusal for an example without a predict hook."""

import dataclasses
import json

import pytest
from digits_tiny import EXAMPLES, example_named, tiny_config
from tests.covering import covering

from dropmask import DropmaskValueError
from dropmask.training import train

MC = ("nll", "ece", "mc_accuracy", "mc_nll", "mc_ece")


@pytest.mark.parametrize("name", covering(EXAMPLES, ["digits_nnx"]))  # two runs each
def test_resumed_run_is_reevaluated_with_samples(name, tmp_path):
    example = example_named(name)
    config = tiny_config()
    config.steps, config.eval_every = 4, 4
    plain = train(example, config, tmp_path, devices=1, progress=False)
    assert not set(MC) & set(plain.final["eval"])
    config.mc_samples = 4
    again = train(example, config, tmp_path, devices=1, progress=False, resume=True)
    held_out = again.final["eval"]
    # The deterministic metrics are unchanged; the loss is the NLL of the same logits.
    assert held_out["accuracy"] == plain.final["eval"]["accuracy"]
    assert held_out["nll"] == pytest.approx(held_out["loss"], rel=1e-5)
    for name in ("ece", "mc_accuracy", "mc_ece"):
        assert 0.0 <= held_out[name] <= 1.0, name
    assert held_out["mc_nll"] > 0.0
    # The same evaluation twice gives the same samples.
    third = train(example, config, tmp_path, devices=1, progress=False, resume=True)
    assert third.final["eval"] == held_out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metrics"] == held_out


@pytest.mark.parametrize("name", EXAMPLES)
def test_samples_without_a_predict_hook_are_refused_before_any_work(name, tmp_path):
    example = dataclasses.replace(example_named(name), predict=None)
    config = tiny_config()
    config.mc_samples = 2
    with pytest.raises(DropmaskValueError, match="no predict hook"):
        train(example, config, tmp_path / "run", devices=1, progress=False)
    assert not (tmp_path / "run").exists()
    config.mc_samples = -1
    with pytest.raises(DropmaskValueError, match="mc_samples must be an int >= 0"):
        train(example_named(name), config, tmp_path / "run", devices=1, progress=False)
