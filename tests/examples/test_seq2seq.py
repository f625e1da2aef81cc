"""The seq2seq example: problems, held-out set, its steps, and a tiny run that learns."""

import jax
import numpy as np
import pytest
from examples.seq2seq import configs, input_pipeline, train
from tests.examples.checks import assert_step_changes_every_parameter_and_uses_the_key

from dropmask import DropmaskValueError
from dropmask.training import DataError
from dropmask.training import train as run_training


@pytest.fixture(scope="module")
def config():
    return configs.get_tiny_config()


@pytest.fixture(scope="module")
def data(config):
    return input_pipeline.load(config)


@pytest.fixture(scope="module")
def state(config, data):
    _, params_key, dropout_key = jax.random.split(jax.random.key(0), 3)
    return train.create_state(config, data, params_key, dropout_key)


def _problems(batch):
    """``{(a, b)}`` of a batch, read back from the encoded queries."""
    out = set()
    for row in batch["query"]:
        a, b = input_pipeline.decode(row).split("+")
        out.add((int(a), int(b)))
    return out


def test_encoding_round_trips_and_pads_right():
    p = input_pipeline.encode(np.array([123, 0]), np.array([45, 7]), 3)
    assert input_pipeline.decode(p.query[0]) == "123+45"
    assert input_pipeline.decode(p.answer[0]) == "168"
    assert p.query_length.tolist() == [6, 3] and p.answer_length.tolist() == [4, 2]
    assert p.query.shape == (2, 7) and p.answer.shape == (2, 5)
    assert p.query[1, 3:].tolist() == [input_pipeline.PAD] * 4
    assert p.answer[1].tolist()[:3] == [input_pipeline.VOCAB.index("7"), input_pipeline.EOS, 0]


def test_batches_are_pure_and_never_hold_out_problems(config, data):
    key = jax.random.key(1)
    first = input_pipeline.train_batch(config, data, key, 3)
    again = input_pipeline.train_batch(config, data, key, 3)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(
        first["query"], input_pipeline.train_batch(config, data, key, 4)["query"]
    )
    held_out = _problems(data.eval.as_batch())
    assert len(held_out) == config.eval_size
    seen = set()
    for step in range(200):
        seen |= _problems(input_pipeline.train_batch(config, data, key, step))
    assert not seen & held_out
    # 3200 draws from the 10^4 problems (short operands as likely as long ones).
    assert len(seen) > 1500, len(seen)
    lengths = {int(n) for n in input_pipeline.train_batch(config, data, key, 0)["query_length"]}
    assert len(lengths) > 1  # variable-length inputs


def test_config_errors_name_the_entry(config):
    bad = config.copy_and_resolve_references()
    bad.max_digits = 9
    with pytest.raises(DropmaskValueError, match=r"config\.max_digits must be in \[1, 6\], got 9"):
        input_pipeline.load(bad)
    bad = config.copy_and_resolve_references()
    bad.eval_size = 10**6
    with pytest.raises(DataError, match="eval_size"):
        input_pipeline.load(bad)


@pytest.mark.slow
def test_train_step_changes_every_parameter_and_uses_the_dropout_key(config, data, state):
    batch = input_pipeline.train_batch(config, data, jax.random.key(1), 0)
    assert_step_changes_every_parameter_and_uses_the_key(train.train_step, state, batch)


@pytest.mark.slow
def test_eval_is_deterministic_and_sampling_uses_the_lstm_stream(config, data, state):
    a = train.evaluate(state, config, data, "eval")
    b = train.evaluate(state, config, data, "eval")
    assert a == b and set(a) == {"loss", "exact_match", "sample_exact_match"}
    batch = data.eval.as_batch()
    args = (batch["query"], batch["query_length"], batch["answer"].shape[1])
    variables = {"params": state.params}
    sample = lambda key: state.apply_fn(  # noqa: E731
        variables, *args, True, method=train.Seq2seq.generate, rngs={"lstm": key}
    )
    np.testing.assert_array_equal(sample(jax.random.key(0)), sample(jax.random.key(0)))
    assert not np.array_equal(sample(jax.random.key(0)), sample(jax.random.key(1)))
    greedy = state.apply_fn(variables, *args, method=train.Seq2seq.generate)
    assert greedy.shape == batch["answer"].shape
    answers = train.predict(state, data, ["12+3", "99+99"])
    assert len(answers) == 2 and all(set(a) <= set("0123456789+") for a in answers)
    with pytest.raises(Exception, match="lstm"):
        state.apply_fn(variables, *args, True, method=train.Seq2seq.generate)


@pytest.mark.slow
def test_tiny_run_lowers_the_loss_and_resumes_exactly(config, tmp_path):
    longer = config.copy_and_resolve_references()
    longer.steps, longer.log_every = 24, 1
    full = run_training(train.example, longer, tmp_path / "full", devices=1, progress=False)
    first, last = np.mean(full.losses[:4]), np.mean(full.losses[-4:])
    assert last < 0.8 * first, (first, last)
    assert set(full.final["eval"]) == {"loss", "exact_match", "sample_exact_match"}
    half = longer.copy_and_resolve_references()
    half.steps = 12
    part = run_training(train.example, half, tmp_path / "part", devices=1, progress=False)
    rest = run_training(
        train.example, longer, tmp_path / "part", devices=1, progress=False, resume=True
    )
    assert part.losses + rest.losses == full.losses


@pytest.mark.slow
@pytest.mark.parametrize(
    "entries",
    [{"zoneout_cell": 0.5, "zoneout_hidden": 0.05}, {"weight_dropout": 0.3}],
    ids=["zoneout", "weight_dropout"],
)
def test_tiny_run_trains_with_each_recurrent_regularizer(config, data, tmp_path, entries):
    regularized = config.copy_and_resolve_references()
    regularized.update(entries)
    regularized.steps, regularized.log_every = 24, 1
    batch = input_pipeline.train_batch(regularized, data, jax.random.key(1), 0)
    _, params_key, dropout_key = jax.random.split(jax.random.key(0), 3)
    state = train.create_state(regularized, data, params_key, dropout_key)
    assert_step_changes_every_parameter_and_uses_the_key(train.train_step, state, batch)
    run = run_training(train.example, regularized, tmp_path, devices=1, progress=False)
    first, last = np.mean(run.losses[:4]), np.mean(run.losses[-4:])
    assert last < 0.8 * first, (first, last)


@pytest.mark.parametrize("name", ["embed_dim", "hidden"])
def test_a_width_below_one_is_named_before_any_model(config, name):
    bad = config.copy_and_resolve_references()
    bad[name] = 0
    with pytest.raises(
        DropmaskValueError, match=rf"config\.{name} must be a width >= 1.*--config\.{name}"
    ):
        input_pipeline.load(bad)
