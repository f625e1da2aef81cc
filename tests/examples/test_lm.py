"""The lm example: the split by topic, windows, its step, sampling and a tiny run that learns."""

import functools
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from examples.lm import configs, input_pipeline, models, sample, train
from flax import nnx
from tests.examples.checks import assert_step_changes_every_parameter_and_uses_the_key

from dropmask import DropmaskValueError, cli
from dropmask.audit import audit_target, target_from_example
from dropmask.training import DataError, run_keys
from dropmask.training import restore_run as restore_training_run
from dropmask.training import train as run_training


@pytest.fixture(scope="module")
def config():
    return configs.get_tiny_config()


@pytest.fixture(scope="module")
def data(config):
    return input_pipeline.load(config)


@pytest.fixture(scope="module")
def state(config, data):
    _, params_key, dropout_key = run_keys(0)
    return train.create_state(config, data, params_key, dropout_key)


def test_topics_are_held_out_whole_and_the_split_is_stable(config, data):
    from pydoc_data.topics import topics

    assert set(data.eval_topics).isdisjoint(data.train_topics)
    assert set(data.eval_topics) | set(data.train_topics) == set(topics)
    held = sum(len(topics[n]) for n in data.eval_topics) / sum(map(len, topics.values()))
    assert config.eval_fraction <= held < 0.5
    for name in data.eval_topics:
        # No training text continues a held-out passage: the topic's text is absent.
        assert topics[name][:200].encode() not in data.train.tobytes()
    assert input_pipeline.load(config).eval_topics == data.eval_topics
    assert 0.99 < data.eval_chars_per_byte <= 1.0


def test_batches_are_windows_of_the_training_text_and_a_function_of_the_step(config, data):
    key = jax.random.key(3)
    a = input_pipeline.train_batch(config, data, key, 5)["tokens"]
    assert a.shape == (config.batch_size, config.context + 1) and a.dtype == np.int32
    np.testing.assert_array_equal(a, input_pipeline.train_batch(config, data, key, 5)["tokens"])
    assert not np.array_equal(a, input_pipeline.train_batch(config, data, key, 6)["tokens"])
    text = data.train.tobytes()
    assert all(bytes(row.astype(np.uint8)) in text for row in a)


def test_windows_score_every_byte_but_the_first_exactly_once():
    text = np.frombuffer(b"abcdefghij", np.uint8)
    w = input_pipeline.windows(text, 4)
    labels = w[:, 1:][w[:, 1:] >= 0]
    np.testing.assert_array_equal(labels, text[1:])
    np.testing.assert_array_equal(w[1, :2], [ord("e"), ord("f")])  # overlaps by one byte
    assert len(input_pipeline.windows(text, 4, limit=2)) == 2


def test_config_errors_name_the_entry(config):
    bad = config.copy_and_resolve_references()
    bad.width = 33
    with pytest.raises(DataError, match="config.width must be a multiple of config.heads"):
        input_pipeline.load(bad)
    bad = config.copy_and_resolve_references()
    bad.context = 10**7
    with pytest.raises(DataError, match="fewer than one window"):
        input_pipeline.load(bad)


# The whole model's train step, slow as the other checkout examples' are; the check is
# the digits example's too (tests/examples/test_digits.py).
@pytest.mark.slow
def test_train_step_changes_every_parameter_and_uses_the_key(state, data, config):
    batch = input_pipeline.train_batch(config, data, jax.random.key(0), 0)
    assert_step_changes_every_parameter_and_uses_the_key(train.train_step, state, batch)


# Three whole models, slow as translate's dense-against-blockwise test is; the attention
# paths are compared on their own in tests/attention/.
@pytest.mark.slow
def test_flax_and_dropmask_attention_compute_the_same_model(config, data):
    tokens = jnp.asarray(input_pipeline.train_batch(config, data, jax.random.key(0), 0)["tokens"])
    outs = []
    for attention, algorithm in [
        ("flax", "dense"),
        ("dropmask", "dense"),
        ("dropmask", "blockwise"),
    ]:
        c = config.copy_and_resolve_references()
        c.attention, c.attention_algorithm = attention, algorithm
        model = models.LanguageModel(c, 256, rngs=nnx.Rngs(params=0, dropout=1))
        model.eval()
        outs.append(model(tokens[:, :-1]))
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], rtol=2e-5, atol=2e-5)


def test_evaluation_is_deterministic_and_in_bits_per_character(state, config, data):
    a = train.evaluate(state, config, data, "eval")
    assert a == train.evaluate(state, config, data, "eval")
    assert a["bpc"] == pytest.approx(a["loss"] / np.log(2) / data.eval_chars_per_byte, rel=1e-12)
    # An untrained model is close to uniform over 256 bytes: 8 bits per byte.
    assert 6.0 < a["bpc"] < 10.0


def test_predict_scores_every_held_out_byte_with_keyed_samples(state, config, data):
    logits, labels = train.predict(state, config, data, "eval", None, 0)
    windows = input_pipeline.split_windows(config, data, "eval")
    assert logits.shape == (int((windows[:, 1:] >= 0).sum()), 256) == (len(labels), 256)
    key = jax.random.key(1)
    samples, _ = train.predict(state, config, data, "eval", key, 2)
    again, _ = train.predict(state, config, data, "eval", key, 2)
    assert samples.shape == (2, *logits.shape)
    np.testing.assert_array_equal(samples, again)
    assert not np.array_equal(samples[0], samples[1])


@pytest.mark.slow  # a program per sampling setting
def test_greedy_temperature_and_top_k_sampling_are_keyed(state):
    greedy = sample.generate(state, "The ", 12)
    assert greedy.startswith("The ") and greedy == sample.generate(state, "The ", 12)
    hot = functools.partial(sample.generate, state, "The ", 12, temperature=1.0)
    assert hot(key=jax.random.key(0)) == hot(key=jax.random.key(0))
    assert hot(key=jax.random.key(0)) != hot(key=jax.random.key(1))
    # Among the one most likely byte, sampling at any temperature is greedy decoding.
    for seed in range(3):
        assert hot(key=jax.random.key(seed), top_k=1) == greedy
    # top_k >= 256 keeps every byte: the same draws as no top-k.
    assert hot(key=jax.random.key(2), top_k=256) == hot(key=jax.random.key(2))
    # A small k never draws a byte outside the k most likely ones.
    few = {hot(key=jax.random.key(s), top_k=3)[4] for s in range(12)}
    window = jnp.asarray(np.frombuffer(b"The ", np.uint8).astype(np.int32))
    logits = state.model(training=False)(window[None])[0, -1]
    assert few <= {chr(int(b)) for b in np.argsort(np.asarray(logits))[-3:]}


def test_a_temperature_at_either_end_of_float32_still_samples(state):
    greedy = sample.generate(state, "The ", 12)
    hot = functools.partial(sample.generate, state, "The ", 12)
    # logits / 3e38 underflows to 0 (and -inf / 1e39 was NaN): the one kept byte was
    # lost, and every byte came out NUL. 1e39 is past float32's largest value.
    for temperature in (3e38, 1e39, 1e300):
        assert hot(temperature=temperature, top_k=1, key=jax.random.key(0)) == greedy
    # So small that logits / T overflows: the most likely byte, as at T = 0.
    for temperature in (1e-40, 1e-300):
        assert hot(temperature=temperature, key=jax.random.key(0)) == greedy
    # So large that logits / T underflows: the k most likely bytes are equally likely.
    window = jnp.asarray(np.frombuffer(b"The ", np.uint8).astype(np.int32))
    logits = state.model(training=False)(window[None])[0, -1]
    top3 = {chr(int(b)) for b in np.argsort(np.asarray(logits))[-3:]}
    drawn = {hot(temperature=3e38, top_k=3, key=jax.random.key(s))[4] for s in range(12)}
    assert drawn == top3  # each of the three, in 12 draws (chance of missing one: 2.3%)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompt": ""}, "prompt must be at least one character"),
        ({"prompt": "caf\udce9"}, "prompt must be UTF-8 text"),
        ({"length": 0}, "length must be >= 1"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan"), "key": jax.random.key(0)}, "a finite number >= 0"),
        ({"temperature": float("inf"), "key": jax.random.key(0)}, "a finite number >= 0"),
        ({"temperature": 0.5}, "needs key="),
        ({"temperature": 0.5, "top_k": -1, "key": jax.random.key(0)}, "top_k must be an int >= 0"),
    ],
)
def test_generate_refuses_what_it_cannot_serve(state, kwargs, match):
    args = {"prompt": "x", "length": 1, **kwargs}
    with pytest.raises(DropmaskValueError, match=match):
        sample.generate(state, args.pop("prompt"), args.pop("length"), **args)


@pytest.mark.parametrize(
    "argv, status, says",
    [
        (["--prompt", ""], 2, "--prompt must be at least one character"),
        (["--prompt", "caf\udce9"], 2, "--prompt must be UTF-8 text, got the byte(s) b'\\xe9'"),
        (["--prompt", "x", "--temperature", "-0.5"], 2, "--temperature must be a finite number"),
        (["--prompt", "x", "--temperature", "nan"], 2, "--temperature must be a finite number"),
        (["--prompt", "x", "--length", "0"], 2, "--length must be >= 1"),
        (["--prompt", "x", "--top-k", "-1", "--temperature", "1"], 2, "--top-k must be >= 0"),
        (["--prompt", "x", "--top-k", "5"], 2, "--top-k 5 needs --temperature > 0"),
        (["--prompt", "x", "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["--prompt", "x"], 2, "holds no checkpoints/: no run was trained there"),
    ],
)
def test_the_sample_command_answers_a_mistake_in_one_line(tmp_path, capsys, argv, status, says):
    assert cli.main(["sample", "lm", "--workdir", str(tmp_path / "none"), *argv]) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dropmask sample: error: "), captured.err
    assert says in lines[0]


def test_the_sample_command_reads_runs_name_by_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = str(pathlib.Path(train.__file__).parent)  # a path target, not the name
    assert cli.main(["sample", target, "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"dropmask sample: error: {pathlib.Path('runs', 'lm')} holds no checkpoints/"
    )


def test_the_sample_command_names_an_example_that_does_not_generate(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    assert cli.main(["sample", "digits", "--workdir", str(tmp_path), "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "dropmask sample: error: the example 'digits' does not generate text: its Example "
        "sets no sample=. Sample an example that does (e.g. lm), or add a sample hook."
    ]


# An audit of the whole model; the command audits the digits examples in
# tests/audit/test_audit.py, and attention weights as sites of their own there.
@pytest.mark.slow
def test_the_tiny_config_audits_clean_with_attention_weights_seen():
    report = audit_target(target_from_example(train.example))
    assert report.ok, str(report)
    kinds = {site.path: site.kind for site in report.sites}
    assert kinds["blocks/0/attention"] == "attention"
    assert {"embed_dropout", "blocks/1/mlp_dropout"} <= set(kinds)


@pytest.mark.slow
def test_tiny_run_lowers_the_loss_resumes_exactly_and_samples(config, tmp_path, capsys):
    whole = run_training(train.example, config, tmp_path, devices=1, progress=False)
    assert whole.losses[-1] < whole.losses[0]
    # The last checkpoint lost: resuming from step 4 replays steps 5-8 exactly.
    shutil.rmtree(tmp_path / "checkpoints" / "8")
    resumed = run_training(train.example, config, tmp_path, devices=1, progress=False, resume=True)
    assert resumed.start_step == 4
    assert resumed.losses == whole.losses[4:]  # exact float equality
    assert resumed.final == whole.final
    capsys.readouterr()
    command = ["sample", "lm", "--workdir", str(tmp_path), "--prompt", "def ", "--length", "8"]
    assert cli.main(command) == 0
    greedy = capsys.readouterr().out
    assert greedy.startswith("def ") and len(greedy.encode()) >= len("def ") + 1
    # Among the one most likely byte, any temperature is greedy, float32's largest too
    # (the target is this checkout's lm, whichever checkout dropmask is installed from).
    here = [*command[:1], str(pathlib.Path(train.__file__).parent), *command[2:]]
    assert cli.main([*here, "--temperature", "3e38", "--top-k", "1"]) == 0
    assert capsys.readouterr().out == greedy
    # One seed, one text; the checkpoint of step 4 is another model.
    hot = [*command, "--temperature", "1", "--top-k", "50"]
    texts = []
    for extra in (["--seed", "3"], ["--seed", "3"], ["--seed", "4"], ["--step", "4"]):
        assert cli.main([*hot, *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] != texts[2]
    # --step restores that checkpoint: the text of generate() on it, seed 0.
    early, _, _ = restore_training_run(tmp_path, train.example, step=4)
    key = jax.random.key(0)
    expected = sample.generate(early, "def ", 8, temperature=1.0, top_k=50, key=key)
    assert texts[3] == expected + "\n"


def test_the_named_configs_change_only_values():
    default = configs.get_config()
    for name, get in configs.CONFIGS.items():
        assert set(get()) == set(default), name
    long = configs.get_long_config()
    assert long.context >= 1024 and long.attention_algorithm == "blockwise" and long.rate > 0
    small = configs.get_small_data_config()
    assert small.eval_fraction > 0.5 and small.eval_windows > 0


@pytest.mark.slow
def test_the_long_config_trains_from_the_command_on_the_blockwise_path(tmp_path, capsys):
    tiny = ["--config.width=32", "--config.heads=2", "--config.depth=1", "--config.batch_size=2"]
    tiny += ["--config.eval_windows=2", "--config.eval_every=2", "--config.checkpoint_every=2"]
    argv = ["train", "lm", "--config", "long", "--steps", "2", "--devices", "1", "--no-progress"]
    assert cli.main([*argv, f"--workdir={tmp_path}", *tiny]) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    saved = summary["config"]
    assert saved["context"] == 1024 and saved["attention_algorithm"] == "blockwise"
    assert saved["rate"] == configs.get_config().rate > 0 and saved["width"] == 32
