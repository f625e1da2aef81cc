"""The digits demo: a tiny config trains, is reproducible, and writes its reports."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from examples.digits import configs, input_pipeline, train
from examples.digits.models import MLP


@pytest.fixture(scope="module")
def data() -> tuple[input_pipeline.Split, input_pipeline.Split]:
    config = configs.tiny()
    return input_pipeline.load(config.train_size, seed=config.seed)


def _state(dropout: bool) -> train.TrainState:
    """A fresh state for the tiny config's model, with or without dropout."""
    config = configs.tiny()
    _, params_key, dropout_key = jax.random.split(jax.random.key(config.seed), 3)
    rates = (config.rate, config.input_rate) if dropout else (0.0, 0.0)
    model = MLP(hidden=config.hidden, rate=rates[0], input_rate=rates[1])
    return train.create_train_state(
        model, params_key, dropout_key, jnp.zeros((1, 64)), config.learning_rate
    )


# One state per model for the module: train_step's jit cache is keyed on the model
# instance (``apply_fn`` is static), so fresh models would recompile in every test.
@pytest.fixture(scope="module")
def dropout_state() -> train.TrainState:
    return _state(dropout=True)


@pytest.fixture(scope="module")
def baseline_state() -> train.TrainState:
    return _state(dropout=False)


def _batch(split: input_pipeline.Split, n: int = 25) -> dict[str, np.ndarray]:
    return {"image": split.image[:n], "label": split.label[:n]}


def test_splits_are_stratified_and_scaled(data):
    train_split, test_split = data
    assert train_split.image.shape == (100, 64) and train_split.image.dtype == np.float32
    assert len(test_split) == configs.NUM_EXAMPLES - 100
    assert 0.0 <= train_split.image.min() and train_split.image.max() <= 1.0
    np.testing.assert_array_equal(np.bincount(train_split.label), np.full(10, 10))


def test_batches_cover_an_epoch_once_with_static_shapes():
    ids = np.arange(100)
    split = input_pipeline.Split(image=ids[:, None].astype(np.float32), label=ids)
    got = list(input_pipeline.batches(split, 30, jax.random.key(0)))
    assert [b["image"].shape for b in got] == [(30, 1)] * 3  # 100 // 30, remainder dropped
    seen = np.concatenate([b["label"] for b in got])
    assert len(np.unique(seen)) == 90
    assert not np.array_equal(seen, ids[:90])  # shuffled
    again = np.concatenate(
        [b["label"] for b in input_pipeline.batches(split, 30, jax.random.key(0))]
    )
    np.testing.assert_array_equal(seen, again)


def test_label_noise_changes_only_train_labels():
    clean_train, clean_test = input_pipeline.load(200, seed=0)
    noisy_train, noisy_test = input_pipeline.load(200, seed=0, label_noise=0.5)
    np.testing.assert_array_equal(clean_test.label, noisy_test.label)
    changed = np.mean(clean_train.label != noisy_train.label)
    # Half are redrawn, and a redrawn label differs from the true one 9 times in 10.
    assert 0.3 < changed < 0.6, changed


def test_loss_drops_over_a_few_steps(data, dropout_state):
    train_split, _ = data
    state = dropout_state
    before = train.eval_step(state, train_split.image, train_split.label)["loss"]
    for epoch in range(5):
        for batch in input_pipeline.batches(train_split, 25, jax.random.key(epoch)):
            state, loss = train.train_step(state, batch)
    after = train.eval_step(state, train_split.image, train_split.label)["loss"]
    assert int(state.step) == 20
    assert np.isfinite(float(loss))
    assert float(after) < 0.85 * float(before), (float(before), float(after))


def test_train_step_is_deterministic_for_a_key(data, dropout_state):
    state, batch = dropout_state, _batch(data[0])
    (a, loss_a), (b, loss_b) = train.train_step(state, batch), train.train_step(state, batch)
    assert float(loss_a) == float(loss_b)
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
    # Another key, or the same key at another step, draws other masks.
    _, loss_key = train.train_step(state.replace(key=jax.random.key(7)), batch)
    _, loss_step = train.train_step(state.replace(step=state.step + 1), batch)
    assert float(loss_key) != float(loss_a)
    assert float(loss_step) != float(loss_a)


def test_baseline_ignores_the_dropout_key(data, baseline_state):
    state, batch = baseline_state, _batch(data[0])
    _, loss_a = train.train_step(state, batch)
    _, loss_b = train.train_step(state.replace(key=jax.random.key(7)), batch)
    assert float(loss_a) == float(loss_b)


def test_eval_is_deterministic_and_needs_no_key(data, dropout_state):
    _, test_split = data
    state = dropout_state
    a = train.eval_step(state, test_split.image, test_split.label)
    b = train.eval_step(state.replace(key=jax.random.key(9)), test_split.image, test_split.label)
    assert float(a["loss"]) == float(b["loss"]) and float(a["accuracy"]) == float(b["accuracy"])


def test_main_writes_metrics_and_plot(tmp_path, capsys):
    out = tmp_path / "digits"
    histories = train.main(["--tiny", "--no-progress", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "no dropout" in printed and "dropout 0.5" in printed and "acc gap" in printed

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"] == dataclasses.asdict(configs.tiny()) | {"hidden": [32]}
    assert [r["name"] for r in metrics["runs"]] == ["no dropout", "dropout 0.5"]
    assert [r["rate"] for r in metrics["runs"]] == [0.0, 0.5]
    for run, history in zip(metrics["runs"], histories, strict=True):
        assert run["epoch"] == [0, 1, 2, 3]
        final = run["final"]
        assert 0.0 <= final["test_accuracy"] <= 1.0
        assert final["accuracy_gap"] == pytest.approx(
            final["train_accuracy"] - final["test_accuracy"], abs=1e-12
        )
        assert final["train_loss"] == history.train_loss[-1]
        # Training helped: the first evaluation is at initialisation.
        assert run["test_accuracy"][-1] > run["test_accuracy"][0]

    png = (out / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_config_validation():
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
        configs.Config(rate=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        configs.Config(train_size=20, batch_size=50)
    with pytest.raises(ValueError, match="train_size"):
        configs.Config(train_size=1797)
