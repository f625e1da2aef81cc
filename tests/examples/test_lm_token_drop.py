"""The lm example with random layerwise token dropping (Random-LTD)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from examples.lm import configs, input_pipeline, models, token_speed, train
from flax import nnx
from tests.examples.checks import assert_step_changes_every_parameter_and_uses_the_key

import dropmask
from dropmask import DropmaskValueError
from dropmask.training import run_keys
from dropmask.training import train as run_training


def _config(token_drop: float, depth: int = 3):
    config = configs.get_tiny_config()
    config.depth, config.token_drop = depth, token_drop
    return config


@pytest.fixture(scope="module")
def data():
    return input_pipeline.load(_config(0.5))


@pytest.fixture(scope="module")
def tokens(data):
    batch = input_pipeline.train_batch(_config(0.5), data, jax.random.key(0), 0)
    return jnp.asarray(batch["tokens"][:, :-1])


def _state(config, data):
    _, params_key, dropout_key = run_keys(0)
    return train.create_state(config, data, params_key, dropout_key)


def _forward_without_token_drop(model, tokens):
    """``LanguageModel.__call__`` as it is without token dropping: every block, every token."""
    x = model.embed(tokens) + model.positions(jnp.arange(tokens.shape[-1]))[None]
    x = model.embed_dropout(x)
    for block in model.blocks:
        x = block(x)
    return model.embed.attend(model.norm(x))


def _spy_on_blocks(monkeypatch):
    """Records the input shape of every ``Block`` call and the query shape and
    ``is_causal`` of every attention call, as they are traced."""
    calls = {"blocks": [], "attention": []}
    block_call = models.Block.__call__

    def block(self, x):
        calls["blocks"].append(x.shape)
        return block_call(self, x)

    real_attention_fn = models.attention_fn

    def attention_fn(config):
        fn = real_attention_fn(config)

        def attention(query, *args, **kwargs):
            calls["attention"].append((query.shape, kwargs.get("is_causal"), kwargs.get("mask")))
            return fn(query, *args, **kwargs)

        return attention

    monkeypatch.setattr(models.Block, "__call__", block)
    monkeypatch.setattr(models, "attention_fn", attention_fn)
    return calls


def test_without_token_drop_the_training_forward_pass_is_unchanged(data, tokens):
    state = _state(_config(0.0), data)
    assert all(type(block) is models.Block for block in state.model().blocks)

    @jax.jit
    def both(params):
        with_code = state.model(params)(tokens)
        without = _forward_without_token_drop(state.model(params), tokens)
        return with_code, without

    with_code, without = both(state.params)
    np.testing.assert_array_equal(with_code, without)  # bit for bit, dropout on


def test_the_middle_block_sees_the_kept_tokens_and_the_ends_see_all(data, tokens, monkeypatch):
    calls = _spy_on_blocks(monkeypatch)
    config = _config(0.5)
    config.attention_block = 8  # several tiles per row at 64 and 32 tokens
    state = _state(config, data)
    batch = {"tokens": jnp.zeros((config.batch_size, config.context + 1), jnp.int32)}
    jax.jit(train.train_step).lower(state, batch)
    b, t, w = config.batch_size, config.context, config.width
    kept = t // 2
    assert calls["blocks"] == [(b, t, w), (b, kept, w), (b, t, w)]
    h, d = config.heads, w // config.heads
    assert [shape for shape, _, _ in calls["attention"]] == [
        (b, t, h, d),
        (b, kept, h, d),
        (b, t, h, d),
    ]
    # Causal by structure, no [q, k] mask: the blockwise path skips the tiles above
    # the diagonal of the shorter sequence as it does of the whole window.
    assert all(causal is True and mask is None for _, causal, mask in calls["attention"])


def test_dropped_tokens_skip_the_block_and_kept_ones_go_through_it_in_order():
    config = _config(0.5)
    config.rate = 0.0
    block = models.Block(config, rngs=nnx.Rngs(params=0, dropout=0))
    ltd = models.RandomLTD(block, 0.5, rngs=nnx.Rngs(dropout=1))
    call = nnx.jit(lambda module, x: module(x))
    x = jax.random.normal(jax.random.key(2), (4, 16, config.width))
    out = call(ltd, x)
    changed = np.asarray(jnp.any(out != x, axis=-1))
    assert changed.sum(axis=1).tolist() == [8, 8, 8, 8]
    # The changed positions, in order, are the block's output on those tokens alone.
    positions = np.stack([np.flatnonzero(row) for row in changed])
    gathered = np.take_along_axis(np.asarray(x), positions[..., None], axis=1)
    np.testing.assert_allclose(
        np.take_along_axis(np.asarray(out), positions[..., None], axis=1),
        call(block, gathered),
        rtol=1e-6,
        atol=1e-6,
    )
    ltd.eval()
    np.testing.assert_array_equal(call(ltd, x), call(block, x))


def test_each_block_and_step_draws_its_own_subset(data, tokens, monkeypatch):
    drawn = []
    real = dropmask.drop_tokens

    def drop_tokens(*args, **kwargs):
        subset = real(*args, **kwargs)
        drawn.append(subset.positions)
        return subset

    monkeypatch.setattr(dropmask, "drop_tokens", drop_tokens)

    @jax.jit
    def subsets(state):
        drawn.clear()
        state.model()(tokens)
        state.replace(step=state.step + 1).model()(tokens)
        return list(drawn)

    drawn = subsets(_state(_config(0.5, depth=4), data))
    assert len(drawn) == 4  # blocks 1 and 2, two steps
    for positions in drawn:
        assert positions.shape == (tokens.shape[0], tokens.shape[1] // 2)
        assert (np.diff(positions, axis=1) > 0).all()  # original order, no repeats
    for i in range(4):
        for j in range(i):
            assert not np.array_equal(drawn[i], drawn[j])


def test_causality_holds_on_the_subset(data, tokens):
    state = _state(_config(0.5), data)
    later = 40
    changed = tokens.at[:, later].set((tokens[:, later] + 1) % 256)
    logits = jax.jit(lambda t: state.model()(t))
    a, b = logits(tokens), logits(changed)
    assert a.shape == (*tokens.shape, 256)  # the loss covers every position
    # The same key draws the same subset and masks: logits before the changed byte
    # are bit for bit the same; the changed byte's own logits differ.
    np.testing.assert_array_equal(a[:, :later], b[:, :later])
    assert np.all(np.any(a[:, later] != b[:, later], axis=-1))


# The whole model's train step, slow as the lm example's is; what token drop changes in
# the forward pass is checked above.
@pytest.mark.slow
def test_the_jitted_train_step_trains_every_parameter(data):
    config = _config(0.5)
    batch = input_pipeline.train_batch(config, data, jax.random.key(0), 0)
    assert_step_changes_every_parameter_and_uses_the_key(
        train.train_step, _state(config, data), batch
    )


def test_evaluation_sees_every_token(data, tokens):
    config = _config(0.5)
    dropping, plain = _state(config, data), _state(_config(0.0), data)
    # One params stream: both models start from the same weights.
    jax.tree.map(
        np.testing.assert_array_equal, *(jax.tree.leaves(s.params) for s in (dropping, plain))
    )
    np.testing.assert_array_equal(
        dropping.model(training=False)(tokens), plain.model(training=False)(tokens)
    )
    assert train.evaluate(dropping, config, data, "eval") == train.evaluate(
        plain, config, data, "eval"
    )


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"token_drop": 1.0}, r"config.token_drop must be in \[0, 1\)"),
        ({"token_drop": -0.1}, r"config.token_drop must be in \[0, 1\)"),
        ({"token_drop": float("nan")}, "config.token_drop must be in"),
        ({"token_drop_ends": -1}, "config.token_drop_ends must be an int >= 0"),
        ({"token_drop": 0.5, "depth": 2}, "config.token_drop_ends must leave a block"),
        ({"token_drop": 0.5, "depth": 5, "token_drop_ends": 3}, "token_drop_ends=3"),
    ],
)
def test_bad_token_drop_entries_are_named(changes, match):
    config = configs.get_tiny_config()
    config.update(changes)
    with pytest.raises(DropmaskValueError, match=match) as error:
        input_pipeline.load(config)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_tiny_run_with_token_drop_lowers_the_loss_on_one_device_or_two(tmp_path):
    config = _config(0.5)
    one = run_training(train.example, config, tmp_path / "one", devices=1, progress=False)
    assert one.losses[-1] < one.losses[0]
    # The subsets are drawn from the key alone: a batch split over two devices drops
    # the same tokens.
    two = run_training(train.example, config, tmp_path / "two", devices=2, progress=False)
    np.testing.assert_allclose(two.losses, one.losses, rtol=1e-5)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--depth", "2"], "--depth must be >= 3"),
        (["--token-drop", "0"], r"--token-drop must be in \(0, 1\), got 0.0"),
        (["--context", "1"], "--context must be >= 2"),
        (["--steps", "0"], "--repeats and --steps must be >= 1"),
    ],
)
def test_token_speed_answers_bad_flags_in_one_line(flags, match, capsys):
    assert token_speed.main(flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("token_speed: ")
    assert re.search(match, err), err


@pytest.mark.slow
def test_token_speed_times_both_arms(capsys):
    flags = ["--depth", "3", "--context", "64", "--repeats", "2", "--steps", "1"]
    assert token_speed.main(flags) == 0
    out = capsys.readouterr().out
    assert "blocks dropping tokens 1" in out
    assert re.search(r"token_drop 0: \d+\.\d+ s per step", out), out
    assert re.search(r"token_drop 0.5: \d+\.\d+ s per step", out), out
    assert re.search(r"ratio token_drop 0.5 / token_drop 0: \d+\.\d+ \(median of 2", out), out
