"""The digits example: data, a pure batch schedule, its steps, and a tiny run that learns."""

import json

import jax
import numpy as np
import pytest

from dropmask.examples.digits import configs, input_pipeline, ood, train
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


def _batch(config, data, step=0):
    return input_pipeline.train_batch(config, data, jax.random.key(1), step)


def test_splits_are_stratified_and_scaled(data):
    assert data.train.image.shape == (96, 64) and data.train.image.dtype == np.float32
    assert len(data.test) == 1797 - 96
    assert 0.0 <= data.train.image.min() and data.train.image.max() <= 1.0
    counts = np.bincount(data.train.label, minlength=10)
    assert counts.min() >= 9 and counts.max() <= 10, counts


def test_batches_are_a_pure_function_of_key_and_step(config, data):
    key = jax.random.key(1)
    per_epoch = 4  # 96 // 24
    epoch = [input_pipeline.train_batch(config, data, key, s)["label"] for s in range(per_epoch)]
    assert all(b.shape == (24,) for b in epoch)
    # One epoch visits every image once, in a shuffled order.
    images = np.concatenate(
        [input_pipeline.train_batch(config, data, key, s)["image"] for s in range(4)]
    )
    assert len(np.unique(images, axis=0)) == len(np.unique(data.train.image, axis=0))
    assert not np.array_equal(images, data.train.image)
    # The same step gives the same batch in any order of calls; epochs differ.
    again = input_pipeline.train_batch(config, data, key, 2)
    np.testing.assert_array_equal(again["label"], epoch[2])
    next_epoch = input_pipeline.train_batch(config, data, key, 4)["image"]
    assert not np.array_equal(next_epoch, images[:24])
    assert input_pipeline.position(config, data, 9) == {
        "epoch": 2,
        "batch": 1,
        "steps_per_epoch": 4,
        "num_examples": 96,
    }


def test_label_noise_changes_only_train_labels(config):
    clean, noisy = config.copy_and_resolve_references(), config.copy_and_resolve_references()
    clean.train_size = noisy.train_size = 200
    noisy.label_noise = 0.5
    a, b = input_pipeline.load(clean), input_pipeline.load(noisy)
    np.testing.assert_array_equal(a.test.label, b.test.label)
    changed = np.mean(a.train.label != b.train.label)
    # Half are redrawn, and a redrawn label differs from the true one 9 times in 10.
    assert 0.3 < changed < 0.6, changed


def test_data_path_npz_and_errors(config, tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    path = tmp_path / "digits.npz"
    np.savez(path, data=digits.data, target=digits.target)
    from_file = config.copy_and_resolve_references()
    from_file.data_path = str(path)
    np.testing.assert_array_equal(
        input_pipeline.load(from_file).train.image, input_pipeline.load(config).train.image
    )
    np.savez(path, data=digits.data[:, :10], target=digits.target)
    with pytest.raises(DataError, match=r"holds data \(1797, 10\)"):
        input_pipeline.load(from_file)
    bad = config.copy_and_resolve_references()
    bad.batch_size = 500
    with pytest.raises(DataError, match="batch_size must be in"):
        input_pipeline.load(bad)
    bad = config.copy_and_resolve_references()
    bad.train_size = 1797
    with pytest.raises(DataError, match="train_size"):
        input_pipeline.load(bad)


def test_train_step_changes_every_parameter_and_is_reproducible(config, data, state):
    batch = _batch(config, data)
    (a, metrics_a), (b, metrics_b) = train.train_step(state, batch), train.train_step(state, batch)
    assert float(metrics_a["loss"]) == float(metrics_b["loss"])
    assert 0.0 <= float(metrics_a["accuracy"]) <= 1.0
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
    changed = jax.tree.map(
        lambda x, y: bool(np.any(np.asarray(x) != np.asarray(y))), a.params, state.params
    )
    assert all(jax.tree.leaves(changed)), changed
    # Another key, or the same key at another step, draws other masks.
    _, other_key = train.train_step(state.replace(key=jax.random.key(7)), batch)
    _, other_step = train.train_step(state.replace(step=state.step + 1), batch)
    assert float(other_key["loss"]) != float(metrics_a["loss"])
    assert float(other_step["loss"]) != float(metrics_a["loss"])


def test_rate_zero_ignores_the_dropout_key(config, data):
    no_dropout = config.copy_and_resolve_references()
    no_dropout.rate = 0.0
    _, params_key, dropout_key = jax.random.split(jax.random.key(0), 3)
    state = train.create_state(no_dropout, data, params_key, dropout_key)
    batch = _batch(config, data)
    _, a = train.train_step(state, batch)
    _, b = train.train_step(state.replace(key=jax.random.key(7)), batch)
    assert float(a["loss"]) == float(b["loss"])


def test_eval_is_deterministic_and_needs_no_key(config, data, state):
    a = train.example.evaluate(state, config, data, "eval")
    b = train.example.evaluate(state.replace(key=jax.random.key(9)), config, data, "eval")
    assert a == b and set(a) == {"loss", "accuracy"}
    assert train.example.evaluate(state, config, data, "train_eval") != a


def test_tiny_run_lowers_the_loss_and_resumes_exactly(config, tmp_path):
    longer = config.copy_and_resolve_references()
    longer.steps, longer.log_every = 24, 1
    full = run_training(train.example, longer, tmp_path / "full", devices=1, progress=False)
    first, last = np.mean(full.losses[:4]), np.mean(full.losses[-4:])
    assert last < 0.8 * first, (first, last)
    assert full.final["eval"]["accuracy"] > 0.5
    half = longer.copy_and_resolve_references()
    half.steps = 12
    part = run_training(train.example, half, tmp_path / "part", devices=1, progress=False)
    rest = run_training(
        train.example, longer, tmp_path / "part", devices=1, progress=False, resume=True
    )
    assert part.losses + rest.losses == full.losses


def test_predict_gives_deterministic_logits_and_keyed_samples(config, data, state):
    logits, labels = train.classifier.predict(state, config, data, "eval", None, 0)
    assert logits.shape == (len(data.test), 10) and labels.shape == (len(data.test),)
    loss = train.example.evaluate(state, config, data, "eval")["loss"]
    nll = float(-jax.nn.log_softmax(logits)[np.arange(len(labels)), labels].mean())
    assert nll == pytest.approx(loss, rel=1e-5)
    key = jax.random.key(1)
    three, _ = train.classifier.predict(state, config, data, "eval", key, 3)
    five, _ = train.classifier.predict(state, config, data, "eval", key, 5)
    assert three.shape == (3, len(data.test), 10)
    np.testing.assert_allclose(five[:3], three, rtol=1e-6, atol=1e-6)
    assert not np.allclose(three[0], three[1])


def test_outside_sets_are_images_in_range(data):
    sets = ood.outside_sets(data.test.image)
    for name, images in sets.items():
        assert images.shape == data.test.image.shape and images.dtype == np.float32, name
        assert 0.0 <= images.min() and images.max() <= 1.0, name
    square = sets["shifted"].reshape(-1, 8, 8)
    np.testing.assert_array_equal(square[:, :, : ood.SHIFT], 0.0)
    np.testing.assert_array_equal(
        square[:, :, ood.SHIFT :], data.test.image.reshape(-1, 8, 8)[:, :, : -ood.SHIFT]
    )
    np.testing.assert_allclose(sets["inverted"], 1.0 - data.test.image, rtol=0, atol=0)


@pytest.mark.slow
def test_ood_command_scores_a_finished_run(config, tmp_path, capsys):
    run_training(train.example, config, tmp_path / "seed_0", devices=1, progress=False)
    out = tmp_path / "auroc.json"
    assert ood.main(["--workdir", str(tmp_path), "--samples", "3", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    assert set(result["auroc"]) == {"shifted", "inverted", "noise"}
    for by_score in result["auroc"].values():
        assert len(by_score) == 4 and all(0.0 <= v <= 1.0 for v in by_score.values())
    assert "| noise |" in capsys.readouterr().out
    assert ood.main(["--workdir", str(tmp_path / "none")]) == 2
