"""The translate example: grammar, files, packing, its steps, decoding, and a tiny run."""

import jax
import numpy as np
import pytest
from examples.translate import configs, corpus, decode, input_pipeline, train
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


_VERBS = set(
    "sieht sehen mag mögen findet finden besucht besuchen hilft helfen folgt folgen".split()
)
_VERBS |= {"dankt", "danken"}


def test_grammar_agrees_in_gender_case_and_order():
    assert [corpus.german_number(n) for n in (2, 17, 21, 30, 77, 99)] == [
        "zwei",
        "siebzehn",
        "einundzwanzig",
        "dreißig",
        "siebenundsiebzig",
        "neunundneunzig",
    ]
    assert corpus.english_number(40) == "forty" and corpus.english_number(41) == "forty-one"
    pairs = dict(corpus.generate_pairs(0, 3000))
    assert len(pairs) == 3000 and corpus.generate_pairs(0, 5) == corpus.generate_pairs(0, 5)
    assert corpus.generate_pairs(0, 5) != corpus.generate_pairs(1, 5)
    de = list(pairs.values())
    # Dative after helfen, dative plural -n, verb-final subordinate clauses, V2.
    assert any(" hilft dem " in d for d in de) and any("mit den" in d and "Hunden" in d for d in de)
    for en, d in pairs.items():
        if en.startswith("today "):  # verb second
            assert d.split()[0] == "heute" and d.split()[1] in _VERBS, (en, d)
        if ", weil " in d or ", dass " in d:  # verb final
            assert d.split()[-1] in _VERBS, (en, d)
        assert " a old " not in f" {en} " and " an big " not in f" {en} "
        assert "einsund" not in d


def test_held_out_never_in_training_and_tokenizer_round_trips(config, data):
    generated = dict(corpus.generate_pairs(config.data_seed, config.train_size + config.eval_size))
    assert data.eval.size == config.eval_size
    assert data.train_pairs == config.train_size
    # Every generated pair is either held out or packed, never both.
    assert set(data.eval.sources) <= set(generated)
    rows = data.train
    valid = rows["targets_segmentation"] > 0
    packed_targets = set()
    for r in range(rows["targets"].shape[0]):
        for s in np.unique(rows["targets_segmentation"][r][valid[r]]):
            packed_targets.add(
                data.tokenizer.decode(
                    rows["targets"][r][rows["targets_segmentation"][r] == s][None]
                )[0]
            )
    assert not packed_targets & {generated[s] for s in data.eval.sources}
    assert len(packed_targets) == len(
        {t for s, t in generated.items() if s not in data.eval.sources}
    )
    assert data.tokenizer.decode(data.eval.batch["targets"]) == list(data.eval.references)


def test_packed_rows_restart_positions_and_match_segments(config, data):
    rows = data.train
    assert rows["inputs"].shape[1] == config.max_len
    assert int(rows["inputs_segmentation"].max()) > 1  # several pairs share a row
    seg, pos = rows["targets_segmentation"], rows["targets_position"]
    for r in range(5):
        for s in range(1, int(seg[r].max()) + 1):
            in_s = seg[r] == s
            np.testing.assert_array_equal(pos[r][in_s], np.arange(in_s.sum()))
            assert rows["targets_in"][r][in_s][0] == input_pipeline.BOS
            assert rows["targets"][r][in_s][-1] == input_pipeline.EOS
            assert (rows["inputs_segmentation"][r] == s).sum() > 0
    assert np.all(rows["inputs"][rows["inputs_segmentation"] == 0] == input_pipeline.PAD)
    key = jax.random.key(1)
    first = input_pipeline.train_batch(config, data, key, 3)
    again = input_pipeline.train_batch(config, data, key, 3)
    for name in input_pipeline.BATCH_KEYS:
        np.testing.assert_array_equal(first[name], again[name])
    other = input_pipeline.train_batch(config, data, key, 4)
    assert not np.array_equal(first["inputs"], other["inputs"])


def test_held_out_rows_keep_every_source_token(data):
    # A source longer than its target must stay whole: encoder attention and decoding
    # read the source through inputs_segmentation.
    pairs = [("the old dog sees the happy children with the clever mice", "ja"), ("a", "")]
    split = input_pipeline.make_split(data.tokenizer, pairs, ["long", "short"], 64, 4)
    batch = split.batch
    kept = np.where(batch["inputs_segmentation"] > 0, batch["inputs"], input_pipeline.PAD)
    assert data.tokenizer.decode(kept[:2]) == [s for s, _ in pairs]
    for name in ("inputs", "targets"):
        valid = batch[name] != input_pipeline.PAD
        segments = batch[f"{name}_segmentation"]
        np.testing.assert_array_equal(segments, valid.astype(np.int32))
    assert not batch["inputs_segmentation"][2:].any()  # the empty filler rows


def test_parallel_file_errors_name_the_file_and_line(tmp_path, config):
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("the dog\nthe cat\na man\n", encoding="utf-8")
    tgt.write_text("der Hund\ndie Katze\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{src} has 3 lines but {tgt} has 2: {src}:3"):
        input_pipeline.read_parallel(src, tgt)
    tgt.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{tgt}: the file is empty"):
        input_pipeline.read_parallel(src, tgt)
    tgt.write_text("der Hund\n\nein Mann\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{tgt}:2: empty line"):
        input_pipeline.read_parallel(src, tgt)
    with pytest.raises(DataError, match="no such file"):
        input_pipeline.read_parallel(src, tmp_path / "missing.de")
    bad = config.copy_and_resolve_references()
    bad.src = str(src)
    with pytest.raises(DataError, match="give both"):
        input_pipeline.load(bad)


def test_loads_parallel_files_and_names_a_too_long_line(tmp_path, config):
    pairs = corpus.generate_pairs(5, 120)
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    files = config.copy_and_resolve_references()
    files.src, files.tgt = str(src), str(tgt)
    data = input_pipeline.load(files)
    assert data.eval.size == files.eval_size and data.train_pairs == 120 - files.eval_size
    files.max_len = 8
    with pytest.raises(DataError, match=rf"{src}:\d+: the pair has .*max_len=8"):
        input_pipeline.load(files)


@pytest.mark.slow
def test_train_step_changes_every_parameter_and_uses_the_dropout_key(config, data, state):
    batch = input_pipeline.train_batch(config, data, jax.random.key(1), 0)
    assert_step_changes_every_parameter_and_uses_the_key(train.train_step, state, batch)


@pytest.mark.slow
def test_blockwise_attention_gives_the_dense_logits_with_dropout_on(config, data, state):
    # Segments and causality as structure on the blockwise path, with small tiles so
    # that rows span several, against the dense path: same function, same dropped
    # weights (the same dropout key), to float tolerance.
    batch = input_pipeline.train_batch(config, data, jax.random.key(1), 0)
    model = train.model_config(config, data)
    rngs = {"dropout": jax.random.key(2)}
    assert batch["inputs"].shape[1] > 32
    logits = {
        name: train.Transformer(model.replace(attention_algorithm=name, attention_block=32)).apply(
            {"params": state.params}, *train.model_inputs(batch), rngs=rngs
        )
        for name in ("dense", "blockwise")
    }
    np.testing.assert_allclose(logits["blockwise"], logits["dense"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_eval_is_deterministic_and_beam_1_is_greedy(config, data, state):
    a = train.evaluate(state, config, data, "eval")
    b = train.evaluate(state, config, data, "eval")
    assert a == b and set(a) == {"loss", "token_accuracy", "bleu", "exact_match"}
    batch = data.train_eval.batches(config.eval_batch_size)[0]
    model = train.model_config(config, data)
    args = (state.params, batch["inputs"], batch["inputs_segmentation"], model)
    greedy = np.asarray(decode.greedy(*args))
    np.testing.assert_array_equal(np.asarray(decode.beam_search(*args, 1)), greedy)
    assert greedy.shape == (batch["inputs"].shape[0], config.max_len)
    beams = np.asarray(decode.beam_search(*args, 3))
    assert beams.shape == greedy.shape
    out = train.translate(state, config, data, ["the dog sees a cat"])
    assert len(out) == 1 and isinstance(out[0], str)


@pytest.mark.slow
def test_cached_decoding_matches_the_full_decoder(config, data, state):
    """Teacher-forcing the greedy output gives the same argmax at every step."""
    batch = data.eval.batches(config.eval_batch_size)[0]
    model = train.model_config(config, data)
    tokens = np.asarray(
        decode.greedy(state.params, batch["inputs"], batch["inputs_segmentation"], model)
    )
    targets_in = np.concatenate(
        [np.full((tokens.shape[0], 1), input_pipeline.BOS), tokens[:, :-1]], axis=1
    )
    length = tokens.shape[1]
    logits = train.Transformer(model.replace(deterministic=True)).apply(
        {"params": state.params},
        batch["inputs"],
        targets_in,
        batch["inputs_segmentation"],
        np.ones_like(targets_in),
        np.broadcast_to(np.arange(batch["inputs"].shape[1]), batch["inputs"].shape),
        np.broadcast_to(np.arange(length), targets_in.shape),
    )
    full = np.asarray(np.argmax(logits, -1))
    # Up to and including the first <eos>, the cached and full decoders agree.
    for row, out in zip(full, tokens, strict=True):
        end = list(out).index(input_pipeline.EOS) + 1 if input_pipeline.EOS in out else length
        np.testing.assert_array_equal(row[:end], out[:end])


@pytest.mark.slow
def test_tiny_run_lowers_the_loss_and_resumes_exactly(config, tmp_path):
    longer = config.copy_and_resolve_references()
    longer.steps, longer.log_every = 24, 1
    full = run_training(train.example, longer, tmp_path / "full", devices=1, progress=False)
    first, last = np.mean(full.losses[:4]), np.mean(full.losses[-4:])
    assert last < 0.9 * first, (first, last)
    assert set(full.final["eval"]) == {"loss", "token_accuracy", "bleu", "exact_match"}
    half = longer.copy_and_resolve_references()
    half.steps = 12
    part = run_training(train.example, half, tmp_path / "part", devices=1, progress=False)
    rest = run_training(
        train.example, longer, tmp_path / "part", devices=1, progress=False, resume=True
    )
    assert part.losses + rest.losses == full.losses


@pytest.mark.slow
def test_the_blockwise_variant_trains_to_the_default_quality(config, tmp_path):
    # The default config's "auto" takes the dense path; the blockwise variant computes
    # the same function with the same dropped weights in 64 x 64 tiles (2 x 2 of them
    # at the tiny config's 96 tokens), so it should land within the spread over seeds.
    base = config.copy_and_resolve_references()
    base.steps, base.decay_steps, base.eval_every, base.checkpoint_every = 100, 100, 100, 0
    base.eval_size = 64
    runs = {}
    for algorithm, seed in (("auto", 0), ("auto", 1), ("blockwise", 0)):
        run = base.copy_and_resolve_references()
        run.attention_algorithm, run.seed = algorithm, seed
        workdir = tmp_path / f"{algorithm}_{seed}"
        runs[algorithm, seed] = run_training(train.example, run, workdir, devices=1, progress=False)
    default, other, blockwise = runs["auto", 0], runs["auto", 1], runs["blockwise", 0]
    held_out = {key: result.final["eval"] for key, result in runs.items()}
    # All learned: the held-out loss is well below a uniform guess's log(vocab).
    assert all(m["loss"] < 0.7 * np.log(200) for m in held_out.values()), held_out
    spread = {
        name: abs(default.final["eval"][name] - other.final["eval"][name])
        for name in ("loss", "token_accuracy")
    }
    for name, seeds_apart in spread.items():
        assert abs(blockwise.final["eval"][name] - default.final["eval"][name]) <= seeds_apart, (
            held_out
        )
    # Same masks, so the same losses step by step up to float round-off.
    np.testing.assert_allclose(blockwise.losses, default.losses, rtol=1e-3)


@pytest.mark.parametrize(
    ("entry", "value", "message"),
    [
        ("num_heads", 0, "config.num_heads must be a width >= 1, got 0"),
        ("beam_size", 0, "config.beam_size must be an int >= 1, got 0"),
        ("learning_rate", -1.0, "config.learning_rate must be > 0, got -1.0"),
    ],
)
def test_a_bad_entry_is_named_before_any_data(config, entry, value, message, monkeypatch):
    bad = config.copy_and_resolve_references()
    bad[entry] = value
    monkeypatch.setattr(input_pipeline, "_pairs", lambda _: pytest.fail("data was read"))
    with pytest.raises(DropmaskValueError, match=rf"{message}\. Set it with --config\.{entry}="):
        input_pipeline.load(bad)
