"""Runs of one config share each jitted step's compilation, and their results are unchanged."""

import dataclasses

import jax
import numpy as np
import pytest
from digits_tiny import digits_example, example_named, tiny_config

from dropmask import DropmaskValueError
from dropmask.examples.digits import input_pipeline
from dropmask.examples.digits import train as digits
from dropmask.training import compare_rates, run_keys, train


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


def _states(example, *configs):
    data = input_pipeline.load(configs[0])
    return [example.build_state(c, data, *run_keys(c.seed)[1:]) for c in configs]


def test_states_of_one_config_share_static_fields_and_one_compilation():
    example, traces = _counting_example()
    other_rate = _config(1)
    other_rate.rate = 0.25
    a, b, c = _states(example, _config(0), _config(1), other_rate)
    assert b.apply_fn is a.apply_fn and b.tx is a.tx
    assert c.apply_fn is not a.apply_fn and c.tx is not a.tx
    # Each keeps its own arrays: another seed, other parameters and key.
    assert not np.array_equal(a.params["Dense_0"]["kernel"], b.params["Dense_0"]["kernel"])
    assert not np.array_equal(jax.random.key_data(a.key), jax.random.key_data(b.key))
    batch = input_pipeline.train_batch(
        _config(), input_pipeline.load(_config()), jax.random.key(0), 0
    )
    for state in (a, b, c):
        example.train_step(state, batch)
    assert len(traces) == 2  # one per rate


def test_nnx_states_of_one_config_share_one_compilation():
    from dropmask.examples.digits_nnx import train as digits_nnx

    traces = []

    def create_state(*args):
        return digits_nnx.create_state(*args)

    @jax.jit
    def train_step(state, batch):
        traces.append(state.step)
        return digits_nnx.train_step.__wrapped__(state, batch)

    example = dataclasses.replace(
        example_named("digits_nnx"), create_state=create_state, train_step=train_step
    )
    a, b = _states(example, _config(0), _config(1))
    assert b.graphdef is a.graphdef and b.tx is a.tx
    assert not np.array_equal(jax.random.key_data(a.key), jax.random.key_data(b.key))
    batch = input_pipeline.train_batch(
        _config(), input_pipeline.load(_config()), jax.random.key(0), 0
    )
    for state in (a, b):
        example.train_step(state, batch)
    assert len(traces) == 1


def test_a_state_that_depends_on_the_seed_is_refused():
    example, _ = _counting_example()

    def create_state(config, data, params_key, dropout_key):
        wider = config.copy_and_resolve_references()
        wider.hidden = (8 + config.seed,)
        return digits.create_state(wider, data, params_key, dropout_key)

    example = dataclasses.replace(example, create_state=create_state)
    with pytest.raises(
        DropmaskValueError,
        match=r"'digits' built two different states for one config \(\.params\['Dense_0'\]"
        r"\['bias'\] is float32\[8\], then float32\[9\]\)\. create_state must build",
    ):
        _states(example, _config(0), _config(1))


@pytest.mark.slow
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


@pytest.mark.slow
def test_compare_rates_compiles_once_per_rate(tmp_path):
    example, traces = _counting_example()
    compare_rates(example, _config(), tmp_path, [0.0, 0.5], [0, 1], devices=1, progress=False)
    assert len(traces) == 2
