"""Runs of one config share each jitted step's compilation, and their results are unchanged."""

import dataclasses

import jax
import pytest
from digits_tiny import digits_example, tiny_config

from dropmask import DropmaskValueError
from dropmask.examples.digits import train as digits
from dropmask.training import compare_rates, train


def _counting_example():
    """Digits with a create_state of its own (so a cache entry of its own) and a train
    step that records each trace: one trace per compilation."""
    example = digits_example()
    traces = []

    def create_state(*args):
        return digits.create_state(*args)

    @jax.jit
    def train_step(state, batch):
        traces.append(int(state.params["Dense_0"]["kernel"].shape[-1]))
        return digits.train_step.__wrapped__(state, batch)

    return dataclasses.replace(example, create_state=create_state, train_step=train_step), traces


def _config(seed=0):
    config = tiny_config()
    config.steps, config.eval_every, config.checkpoint_every, config.seed = 4, 4, 0, seed
    return config


def test_two_seeds_compile_the_train_step_once_and_match_runs_alone(tmp_path):
    example, traces = _counting_example()
    first = train(example, _config(0), tmp_path / "s0", devices=1, progress=False)
    second = train(example, _config(1), tmp_path / "s1", devices=1, progress=False)
    assert len(traces) == 1
    assert first.losses != second.losses  # the seeds differ in init, masks and order
    alone, alone_traces = _counting_example()
    solo = train(alone, _config(1), tmp_path / "solo", devices=1, progress=False)
    assert len(alone_traces) == 1
    assert solo.losses == second.losses  # exact float equality
    assert solo.final == second.final


def test_compare_rates_compiles_once_per_rate(tmp_path):
    example, traces = _counting_example()
    compare_rates(example, _config(), tmp_path, [0.0, 0.5], [0, 1], devices=1, progress=False)
    assert len(traces) == 2


def test_a_state_that_depends_on_the_seed_is_refused(tmp_path):
    example, _ = _counting_example()

    def create_state(config, data, params_key, dropout_key):
        wider = config.copy_and_resolve_references()
        wider.hidden = (8 + config.seed,)
        return digits.create_state(wider, data, params_key, dropout_key)

    example = dataclasses.replace(example, create_state=create_state)
    train(example, _config(0), tmp_path / "s0", devices=1, progress=False)
    with pytest.raises(
        DropmaskValueError,
        match=r"'digits' built two different states for one config \(\.params\['Dense_0'\]"
        r"\['bias'\] is float32\[8\], then float32\[9\]\)\. create_state must build",
    ):
        train(example, _config(1), tmp_path / "s1", devices=1, progress=False)
