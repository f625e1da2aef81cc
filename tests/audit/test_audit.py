"""dropmask.audit on Linen models and train steps: each seeded bug is caught by its code."""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tests.covering import covering

import dropmask
from dropmask import linen as dl
from dropmask.audit import CODES, AuditReport, _command, audit_model, audit_step
from dropmask.training import TrainState

X = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, (16, 8)), jnp.float32)


class FlaxMLP(nn.Module):
    layer: type = nn.Dropout

    @nn.compact
    def __call__(self, x, training: bool):
        x = self.layer(0.2, deterministic=not training)(x)
        x = nn.relu(nn.Dense(32)(x))
        x = self.layer(0.5, deterministic=not training)(x)
        return nn.Dense(4)(x)


class Zoo(nn.Module):
    """Every dropmask Linen layer, wired correctly."""

    @nn.compact
    def __call__(self, x, tokens, training: bool):
        det = not training
        tokens = dl.WordDropout(0.3, unk_id=1, deterministic=det)(tokens)
        h = nn.Dense(32)(x) + nn.Embed(50, 32)(tokens).mean(1)
        h = dl.DropPath(0.25, deterministic=det)(h)
        h = dl.GaussianDropout(0.3, deterministic=det)(h)
        h = dl.AlphaDropout(0.2, deterministic=det)(nn.selu(h))
        return dl.Dropout(0.1, impl="flax", deterministic=det)(h)


class KeepProbAsRate(nn.Module):
    """Custom layer that passes ``rate`` where the keep probability belongs."""

    rate: float
    deterministic: bool | None = None

    @nn.compact
    def __call__(self, x, deterministic=None):
        if nn.merge_param("deterministic", self.deterministic, deterministic):
            return x
        keep = jax.random.bernoulli(self.make_rng("dropout"), self.rate, x.shape)
        return jnp.where(keep, x / (1 - self.rate), 0)


class FixedKey(nn.Module):
    """Custom layer that ignores the stream: a constant key."""

    rate: float = 0.5

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic:
            return x
        return dropmask.dropout(x, self.rate, jax.random.key(0))


class CustomModel(nn.Module):
    bug: str

    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Dense(64)(x)
        if self.bug == "eval-on":
            return nn.Dropout(0.5, deterministic=False)(x)
        if self.bug == "wired-wrong":
            return nn.Dropout(0.5, deterministic=training)(x)
        if self.bug == "keep-prob":
            return KeepProbAsRate(0.1)(x, deterministic=not training)
        if self.bug == "fixed-key":
            return FixedKey()(x, deterministic=not training)
        if self.bug == "batch-broadcast":
            return nn.Dropout(0.5, broadcast_dims=(0,), deterministic=not training)(x)
        if self.bug == "shared-key":
            key = self.make_rng("dropout") if training else None
            x = dl.Dropout(0.5, deterministic=not training)(x, rng=key)
            return dl.Dropout(0.5, deterministic=not training)(jnp.tanh(x) + 2, rng=key)
        raise AssertionError(self.bug)


def _audit(model, *args, **kwargs) -> AuditReport:
    variables = model.init(jax.random.key(1), *args, training=False, **kwargs)
    return audit_model(model, variables, *args, **kwargs)


@pytest.mark.parametrize("layer", [nn.Dropout, dl.Dropout], ids=["flax", "dropmask"])
def test_correct_linen_models_have_no_finding(layer):
    report = _audit(FlaxMLP(layer), X)
    assert report.ok, str(report)
    assert [s.path for s in report.sites] == ["Dropout_0", "Dropout_1"]
    assert [s.rate for s in report.sites] == [0.2, 0.5]
    for site in report.sites:
        assert abs(site.drop_fraction - site.rate) < 4 * np.sqrt(0.25 / site.decisions) + 0.01


def test_every_dropmask_layer_audits_clean():
    tokens = jnp.asarray(np.random.default_rng(1).integers(2, 50, (16, 12)), jnp.int32)
    report = _audit(Zoo(), X, tokens)
    assert report.ok, str(report)
    kinds = {s.kind for s in report.sites}
    assert kinds == {"word", "drop_path", "gaussian", "alpha", "dropout"}


@pytest.mark.parametrize(
    "bug, code",
    [
        ("eval-on", "eval-not-deterministic"),
        ("wired-wrong", "train-never-drops"),
        ("keep-prob", "rate-mismatch"),
        ("fixed-key", "mask-ignores-key"),
        ("batch-broadcast", "broadcast-batch-axis"),
        ("shared-key", "same-mask-across-sites"),
    ],
)
def test_each_seeded_model_bug_is_caught_by_its_code(bug, code):
    report = _audit(CustomModel(bug), X)
    assert code in report.codes, str(report)
    assert code in CODES
    finding = next(f for f in report.findings if f.code == code)
    assert finding.path and len(finding.message) > 40


def test_rate_mismatch_names_the_keep_probability_confusion():
    report = _audit(CustomModel("keep-prob"), X)
    (finding,) = [f for f in report.findings if f.code == "rate-mismatch"]
    assert finding.path == "KeepProbAsRate_0"
    assert "keep probability" in finding.message
    (site,) = report.sites
    assert site.kind == "custom" and site.rate == 0.1
    assert abs(site.drop_fraction - 0.9) < 0.05


def test_model_without_dropout_is_reported():
    report = _audit(nn.Dense(3), X) if False else None
    model = nn.Dense(3)
    variables = model.init(jax.random.key(0), X)
    report = audit_model(model, variables, X, train_kwargs={}, eval_kwargs={})
    assert report.codes == {"no-dropout-sites"}


def test_audit_does_not_change_variables():
    model = FlaxMLP()
    variables = model.init(jax.random.key(1), X, training=False)
    before = jax.tree.map(np.asarray, variables)
    audit_model(model, variables, X)
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, variables))


class ModeByField(nn.Module):
    """Selects its mode by a field, as Flax's WMT Transformer does with its config."""

    deterministic: bool

    @nn.compact
    def __call__(self, x):
        return nn.Dropout(0.5, deterministic=self.deterministic)(nn.Dense(16)(x))


@pytest.mark.parametrize(
    ("eval_model", "codes"), [(True, set()), (False, {"eval-not-deterministic"})]
)
def test_eval_model_audits_a_mode_chosen_by_a_field(eval_model, codes):
    variables = ModeByField(True).init(jax.random.key(0), X)
    report = audit_model(
        ModeByField(False),
        variables,
        X,
        train_kwargs={},
        eval_kwargs={},
        eval_model=ModeByField(deterministic=eval_model),
    )
    assert report.codes == codes
    for finding in report.findings:
        assert "deterministic=self.deterministic" in finding.message
        assert "with deterministic=True" in finding.message
        assert "training" not in finding.message
    assert [s.path for s in report.sites] == ["Dropout_0"]


class PaddedAttention(nn.Module):
    """Flax attention with weight dropout over padded rows (zeros where padding is)."""

    eval_drops: bool = False
    broadcast_dropout: bool = False
    attention_fn: Any = nn.dot_product_attention

    @nn.compact
    def __call__(self, x, training: bool):
        valid = jnp.arange(x.shape[1])[None] < jnp.asarray([[4], [3], [2], [1]])
        attention = nn.MultiHeadDotProductAttention(
            num_heads=2,
            dropout_rate=0.3,
            broadcast_dropout=self.broadcast_dropout,
            deterministic=not (training or self.eval_drops),
            attention_fn=self.attention_fn,
        )
        return attention(x, mask=nn.make_attention_mask(valid, valid)) * valid[..., None]


@pytest.mark.parametrize(
    ("eval_drops", "codes"), [(False, set()), (True, {"eval-not-deterministic"})]
)
def test_attention_weight_dropout_is_judged_by_outputs(eval_drops, codes):
    # Its output is not a masked copy of its input: padding zeros must not read as drops.
    x = X.reshape(4, 4, 8)
    model = PaddedAttention(eval_drops)
    report = audit_model(model, model.init(jax.random.key(0), x, training=False), x)
    assert report.codes == codes
    (site,) = report.sites
    assert (site.path, site.kind, site.rate) == ("MultiHeadDotProductAttention_0", "attention", 0.3)
    # Weights [batch, heads, q, kv]. Masked weights are zero and not counted: a valid
    # query row of an example of length n has n nonzero weights, a padded row attends
    # evenly to all 4 keys; over two heads and two training calls.
    assert site.input_shape == (4, 2, 4, 4)
    assert site.decisions == 2 * 2 * sum(n * n + (4 - n) * 4 for n in (4, 3, 2, 1))
    bound = 4 * np.sqrt(0.3 * 0.7 / site.decisions) + 0.01
    assert abs(site.drop_fraction - 0.3) < bound


def test_attention_dropout_shared_across_batch_and_heads_has_its_own_code():
    # Flax's default broadcast_dropout=True: one [q, kv] mask for all examples and heads.
    x = X.reshape(4, 4, 8)
    model = PaddedAttention(broadcast_dropout=True)
    report = audit_model(model, model.init(jax.random.key(0), x, training=False), x)
    assert report.codes == {"attention-dropout-shared"}, str(report)
    (finding,) = report.findings
    assert "every example and every head" in finding.message
    assert "broadcast_dropout=False" in finding.message
    assert report.sites[0].broadcast_dims == (0, 1)


_ATTENTION_FNS = [
    dropmask.dot_product_attention,
    functools.partial(dropmask.dot_product_attention, algorithm="blockwise", block_k=2),
]


# Fast: the dense path. The blockwise path, a functools.partial of the function, is read
# by the same weights function; test_audit_nnx.py's
# test_dropmask_attention_weights_are_a_site_of_their_own runs it fast.
@pytest.mark.parametrize(
    "attention_fn",
    covering(_ATTENTION_FNS, _ATTENTION_FNS[:1]),
    ids=["dense", "blockwise_partial"],
)
def test_dropmask_attention_as_attention_fn_is_an_attention_site(attention_fn):
    x = X.reshape(4, 4, 8)
    model = PaddedAttention(attention_fn=attention_fn)
    report = audit_model(model, model.init(jax.random.key(0), x, training=False), x)
    assert report.codes == set(), str(report)
    (site,) = report.sites
    assert (site.path, site.kind, site.rate) == ("MultiHeadDotProductAttention_0", "attention", 0.3)
    assert site.input_shape == (4, 2, 4, 4)
    # A padded query sees no key: its weights are zeros, not drops (unlike Flax's, which
    # attends evenly); a valid row of an example of length n has n weights.
    assert site.decisions == 2 * 2 * sum(n * n for n in (4, 3, 2, 1))
    bound = 4 * np.sqrt(0.3 * 0.7 / site.decisions) + 0.01
    assert abs(site.drop_fraction - 0.3) < bound
    shared = PaddedAttention(broadcast_dropout=True, attention_fn=attention_fn)
    report = audit_model(shared, shared.init(jax.random.key(0), x, training=False), x)
    assert report.codes == {"attention-dropout-shared"}, str(report)


@pytest.mark.parametrize("broadcast", [False, True])
def test_dropmask_attention_in_nnx_attention_is_an_attention_site(broadcast):
    from flax import nnx

    from dropmask.audit import audit_nnx_model

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.attn = nnx.MultiHeadAttention(
                num_heads=2,
                in_features=8,
                dropout_rate=0.3,
                broadcast_dropout=broadcast,
                decode=False,
                attention_fn=dropmask.dot_product_attention,
                rngs=rngs,
            )

        def __call__(self, x):
            return self.attn(x)

    report = audit_nnx_model(Model(nnx.Rngs(0)), X.reshape(4, 4, 8))
    (site,) = report.sites
    assert (site.kind, site.input_shape) == ("attention", (4, 2, 4, 4))
    assert report.codes == ({"attention-dropout-shared"} if broadcast else set()), str(report)


def test_a_stream_without_a_key_is_named_in_dropmasks_words():
    class Noisy(nn.Module):
        @nn.compact
        def __call__(self, x, training: bool):
            x = nn.Dense(4)(x)
            if training:
                x = x + jax.random.normal(self.make_rng("noise"), x.shape)
            return nn.Dropout(0.5, deterministic=not training)(x)

    variables = Noisy().init(jax.random.key(0), X, training=False)
    with pytest.raises(dropmask.MissingKeyError) as info:
        audit_model(Noisy(), variables, X)
    message = str(info.value)
    assert message.startswith("audit_model: the model draws from the PRNG stream 'noise'")
    assert "rngs={'dropout': jax.random.key(0), 'noise': jax.random.key(1)}" in message
    assert "\n" not in message and "flax" not in message.lower()
    report = audit_model(
        Noisy(), variables, X, rngs={"dropout": jax.random.key(0), "noise": jax.random.key(1)}
    )
    assert [s.path for s in report.sites if s.kind == "dropout"] == ["Dropout_0"]


def test_report_prints_as_table_and_json():
    report = _audit(CustomModel("batch-broadcast"), X)
    text = str(report)
    assert "Dropout_0" in text and "[broadcast-batch-axis]" in text
    data = json.loads(report.to_json())
    assert data["ok"] is False
    assert data["findings"][0]["code"] == "broadcast-batch-axis"
    assert data["sites"][0]["input_shape"] == [16, 64]


def test_bad_arguments_raise_dropmask_errors():
    with pytest.raises(dropmask.DropmaskTypeError, match="audit_nnx_model"):
        audit_model(object(), {}, X)
    with pytest.raises(dropmask.DropmaskTypeError, match="rngs"):
        audit_model(FlaxMLP(), {}, X, rngs=[jax.random.key(0)])
    with pytest.raises(dropmask.DropmaskTypeError, match="eval_model must be a flax.linen"):
        audit_model(FlaxMLP(), {}, X, eval_model=object())
    with pytest.raises(dropmask.DropmaskValueError, match="at least 2 batches"):
        audit_step(lambda s, b: s, None, [X])


# --- audit_step --------------------------------------------------------------------------


def _state(model=None):
    model = model or FlaxMLP()
    params = model.init(jax.random.key(1), X, training=False)["params"]
    return TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(0.1), key=jax.random.key(2)
    )


def _step(fold: bool, jit: bool, tuple_out: bool):
    def train_step(state, batch):
        key = jax.random.fold_in(state.key, state.step) if fold else state.key

        def loss_fn(params):
            y = state.apply_fn({"params": params}, batch, training=True, rngs={"dropout": key})
            return jnp.mean(y**2)

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        state = state.apply_gradients(grads=grads)
        return (state, loss) if tuple_out else state

    return jax.jit(train_step) if jit else train_step


# Whether the step is jitted decides how the audit reaches its modules, and what it
# returns how the audit finds the new state: two concerns apart, each value of each once.
@pytest.mark.parametrize(
    ("jit", "tuple_out"), [(True, True), (False, False)], ids=["jit-tuple", "plain-state"]
)
def test_correct_train_step_has_no_finding(jit, tuple_out):
    report = audit_step(_step(True, jit, tuple_out), _state(), [X, X, X])
    assert report.ok, str(report)
    assert len(report.sites) == 2


# Fast: the jitted step, whose trace the audit opens; a plain step (slow) is audited
# in test_correct_train_step_has_no_finding's plain-state case.
@pytest.mark.parametrize("jit", covering([True, False], [True]), ids=["jit", "plain"])
def test_step_without_fold_in_is_caught(jit):
    report = audit_step(_step(False, jit, True), _state(), [X, X, X])
    assert report.codes == {"same-mask-across-steps"}, str(report)
    assert {f.path for f in report.findings} == {"Dropout_0", "Dropout_1"}
    assert all("fold_in(state.key, state.step)" in f.message for f in report.findings)


def test_step_audit_reuses_no_compiled_trace_and_keeps_state():
    step = _step(False, True, False)
    state = _state()
    step(state, X)  # compiled before the audit: the audit must still see the sites
    before = jax.tree.map(np.asarray, state.params)
    report = audit_step(step, state, [X, X])
    assert "same-mask-across-steps" in report.codes
    assert int(state.step) == 0
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, state.params))


@jax.jit
def _loss_and_grads(state, batch, key):
    def loss_fn(params):
        y = state.apply_fn({"params": params}, batch, training=True, rngs={"dropout": key})
        return jnp.mean(y**2)

    return jax.value_and_grad(loss_fn)(state.params)


# Fast: a plain step calling the jitted loss; a jitted step around it (slow) is opened as
# in test_step_without_fold_in_is_caught's jit case.
@pytest.mark.parametrize("jit", covering([True, False], [False]), ids=["jit", "plain"])
def test_a_step_calling_a_jitted_loss_is_audited_in_full_every_time(jit):
    # JAX caches the jitted loss's trace by function: a cached trace hides its modules.
    def train_step(state, batch):
        _, grads = _loss_and_grads(state, batch, jax.random.fold_in(state.key, state.step))
        return state.apply_gradients(grads=grads)

    step = jax.jit(train_step) if jit else train_step
    state = _state()
    step(state, X)  # training compiles the step and the loss before any audit
    for _ in range(2):
        report = audit_step(step, state, [X, X])
        assert report.ok, str(report)
        assert [s.path for s in report.sites] == ["Dropout_0", "Dropout_1"]


def test_step_with_shared_key_across_layers_is_caught():
    model = CustomModel("shared-key")
    params = model.init(jax.random.key(1), X, training=False)["params"]
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(0.1), key=jax.random.key(2)
    )
    report = audit_step(_step(True, True, False), state, [X, X])
    assert report.codes == {"same-mask-across-sites"}, str(report)


def test_step_that_never_trains_dropout_is_caught():
    def train_step(state, batch):
        def loss_fn(params):
            return jnp.mean(state.apply_fn({"params": params}, batch, training=False) ** 2)

        return state.apply_gradients(grads=jax.grad(loss_fn)(state.params))

    report = audit_step(jax.jit(train_step), _state(), [X, X])
    assert report.codes == {"train-never-drops"}


# --- the command -----------------------------------------------------------------------


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    _command.add_arguments(parser)
    return _command.run(parser.parse_args(list(argv)))


def test_command_audits_the_digits_example_clean(capsys, monkeypatch):
    # Without orbax: an audit writes no checkpoint (in a fresh process, with what the
    # command imports, in test_command_audits_without_orbax).
    monkeypatch.setitem(sys.modules, "orbax", None)
    assert _run("digits") == 0
    out = capsys.readouterr().out
    assert "OK: no finding." in out and "Dropout_1" in out


# A fresh process, for what the command imports: test_command_audits_the_digits_example_clean
# audits the same example without orbax in this one.
@pytest.mark.slow
def test_command_audits_without_orbax():
    # Checkpoints are the training loop's business: an audit writes none, so a user
    # without a working orbax can still audit, and the command loads less.
    script = (
        "import sys; sys.modules['orbax'] = None\n"
        "from dropmask import cli\n"
        "sys.exit(cli.main(['audit', 'digits']))\n"
    )
    env = {**os.environ, "XLA_FLAGS": ""}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "OK: no finding." in done.stdout, done.stdout


def test_command_audits_the_nnx_digits_example_through_the_nnx_audit(capsys):
    assert _run("digits_nnx") == 0
    out = capsys.readouterr().out
    assert "OK: no finding." in out and "dropout/0" in out


@pytest.mark.parametrize(
    ("example", "site"),
    [
        pytest.param(name, site, marks=pytest.mark.slow)
        for name, site in [
            ("seq2seq", "dropout#2"),
            ("sst2", "WordDropout_0"),
            ("translate", "MlpBlock_0"),
        ]
    ],
)
def test_command_audits_the_examples_clean(example, site, capsys):
    # The MaskedRNNs of seq2seq and sst2 take per-step keys in evaluation too and use
    # none of them; translate's Transformer is put in evaluation by its config.
    assert _run(example) == 0
    out = capsys.readouterr().out
    assert "OK: no finding." in out and site in out


def test_command_exits_nonzero_on_findings(tmp_path, capsys):
    hook = tmp_path / "hook.py"
    hook.write_text(
        "import jax, jax.numpy as jnp\n"
        "from dropmask.audit import AuditTarget\n"
        "from tests.audit.test_audit import CustomModel, X\n"
        "def audit_target():\n"
        "    model = CustomModel('eval-on')\n"
        "    v = model.init(jax.random.key(0), X, training=False)\n"
        "    return AuditTarget(model=model, variables=v, args=(X,))\n"
    )
    assert _run(str(hook), "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in data["findings"]] == ["eval-not-deterministic"]


def test_command_names_a_missing_example_in_one_line(capsys):
    assert _run("no_such_example") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no example 'no_such_example'" in err, err


class ResidualBlock(nn.Module):
    """A block that carries a dropout rate for its child: the child is the site."""

    dropout_rate: float = 0.3

    @nn.compact
    def __call__(self, x, training: bool):
        h = nn.Dense(x.shape[-1])(x)
        return x + dl.Dropout(self.dropout_rate, deterministic=not training)(h)


def test_blocks_carrying_a_rate_are_not_sites():
    report = _audit(ResidualBlock(), X)
    assert report.ok, str(report)
    assert [s.path for s in report.sites] == ["Dropout_0"]


def test_broadcast_over_time_is_not_the_batch_axis():
    seq = jnp.asarray(np.random.default_rng(3).uniform(0.5, 1.5, (8, 6, 16)), jnp.float32)

    class Recurrent(nn.Module):
        @nn.compact
        def __call__(self, x, training: bool):
            return nn.Dropout(0.5, broadcast_dims=(1,), deterministic=not training)(x)

    report = _audit(Recurrent(), seq)
    assert report.ok, str(report)
    assert report.sites[0].broadcast_dims == (1,) and report.sites[0].decisions == 2 * 8 * 16


class ByTraining(nn.Module):
    bug: bool = False  # the bug: deterministic=training

    @nn.compact
    def __call__(self, x, training: bool):
        det = training if self.bug else not training
        return nn.Dropout(0.5, deterministic=det)(nn.Dense(32)(x))


class ByTrain(nn.Module):
    bug: bool = False  # the bug: deterministic=train

    @nn.compact
    def __call__(self, x, train: bool):
        det = train if self.bug else not train
        return nn.Dropout(0.5, deterministic=det)(nn.Dense(32)(x))


class ByDeterministic(nn.Module):
    bug: bool = False  # the bug: deterministic=not deterministic

    @nn.compact
    def __call__(self, x, deterministic: bool):
        det = not deterministic if self.bug else deterministic
        return nn.Dropout(0.5, deterministic=det)(nn.Dense(32)(x))


@pytest.mark.parametrize(
    ("cls", "keyword", "wiring", "bug"),
    [
        (ByTraining, "training", "deterministic=not training", "deterministic=training"),
        (ByTrain, "train", "deterministic=not train", "deterministic=train"),
        (ByDeterministic, "deterministic", "deterministic=deterministic", "=not deterministic"),
    ],
)
def test_mode_keyword_is_read_from_the_signature_and_named_in_every_fix(cls, keyword, wiring, bug):
    evaluating = keyword == "deterministic"
    variables = cls().init(jax.random.key(1), X, **{keyword: evaluating})
    assert audit_model(cls(), variables, X).ok
    report = audit_model(cls(bug=True), variables, X)
    assert report.codes == {"eval-not-deterministic", "train-never-drops"}, str(report)
    others = {"training", "train"} - {keyword}
    for finding in report.findings:
        assert wiring in finding.message, finding.message
        assert bug not in finding.message.replace(wiring, ""), finding.message
        assert not any(f"{o}=" in finding.message for o in others), finding.message
    (evaluation,) = [f for f in report.findings if f.code == "eval-not-deterministic"]
    assert f"called with {keyword}={evaluating!r}" in evaluation.message
    (training,) = [f for f in report.findings if f.code == "train-never-drops"]
    assert f"with {keyword}={not evaluating!r}" in training.message


def test_a_model_without_a_mode_keyword_needs_explicit_arguments():
    model = ModeByField(False)
    variables = model.init(jax.random.key(0), X)
    with pytest.raises(dropmask.DropmaskValueError, match="train_kwargs=.*eval_model="):
        audit_model(model, variables, X)


class Looped(nn.Module):
    """One dropout layer applied three times; ``fixed`` hands it one key for all three."""

    fixed: bool

    @nn.compact
    def __call__(self, x, training: bool):
        drop = dl.Dropout(0.5, deterministic=not training)
        key = self.make_rng("dropout") if training and self.fixed else None
        for _ in range(3):
            x = drop(jnp.tanh(x) + 2, rng=key)
        return x


@pytest.mark.parametrize(
    ("fixed", "codes"), [(False, set()), (True, {"same-mask-across-iterations"})]
)
def test_a_loop_over_one_layer_with_one_key_is_caught(fixed, codes):
    report = _audit(Looped(fixed), X)
    assert report.codes == codes, str(report)
    drops = [s.path for s in report.sites if s.kind == "dropout"]
    assert drops == ["Dropout_0", "Dropout_0#1", "Dropout_0#2"]


def test_target_from_example_names_its_caller_and_still_takes_the_deprecated_fn():
    with pytest.raises(dropmask.DropmaskTypeError, match=r"^dropmask audit: example must be"):
        dropmask.audit.target_from_example(object(), caller="dropmask audit")
    with pytest.warns(DeprecationWarning, match="caller="):
        with pytest.raises(dropmask.DropmaskTypeError, match=r"^old: example must be"):
            dropmask.audit.target_from_example(object(), fn="old")
