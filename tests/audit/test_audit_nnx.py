"""dropmask.audit.audit_nnx_model: correct NNX models audit clean, seeded bugs are caught."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.covering import covering

import dropmask
import dropmask.audit
from dropmask import nnx as dnnx
from dropmask.audit import audit_nnx_model

X = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, (16, 8)), jnp.float32)


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, layer=nnx.Dropout, bug: str = ""):
        self.bug = bug
        self.linear = nnx.Linear(8, 64, rngs=rngs)
        bdims = (0,) if bug == "batch-broadcast" else ()
        self.dropout = layer(0.5, broadcast_dims=bdims, rngs=rngs)
        self.out = nnx.Linear(64, 4, rngs=rngs)

    def __call__(self, x):
        h = self.linear(x)
        if self.bug == "fixed-key":
            h = self.dropout(h, rngs=jax.random.key(0))
        else:
            h = self.dropout(h)
        return self.out(h)


class AlwaysOn(nnx.Module):
    """Custom layer that draws from its stream whatever the mode."""

    def __init__(self, rngs: nnx.Rngs):
        self.rate = 0.5
        self.deterministic = False
        self.rngs = rngs["dropout"].fork()

    def __call__(self, x):
        return dropmask.dropout(x, self.rate, self.rngs())


@pytest.mark.parametrize("layer", [nnx.Dropout, dnnx.Dropout], ids=["flax", "dropmask"])
def test_correct_nnx_models_have_no_finding(layer):
    model = MLP(nnx.Rngs(0, dropout=1), layer)
    report = audit_nnx_model(model, X)
    assert report.ok, str(report)
    (site,) = report.sites
    assert site.path == "dropout" and site.rate == 0.5
    assert abs(site.drop_fraction - 0.5) < 0.05


def test_audit_leaves_the_model_and_its_streams_alone():
    model = MLP(nnx.Rngs(0, dropout=1))
    count = int(model.dropout.rngs.count[...])
    kernel = np.asarray(model.linear.kernel[...])
    audit_nnx_model(model, X)
    assert int(model.dropout.rngs.count[...]) == count
    assert type(model.dropout) is nnx.Dropout
    np.testing.assert_array_equal(np.asarray(model.linear.kernel[...]), kernel)
    assert model.dropout.deterministic is False


@pytest.mark.parametrize(
    "bug, code",
    [("fixed-key", "same-mask-across-steps"), ("batch-broadcast", "broadcast-batch-axis")],
)
def test_seeded_nnx_bugs_are_caught(bug, code):
    report = audit_nnx_model(MLP(nnx.Rngs(0, dropout=1), dnnx.Dropout, bug), X)
    assert code in report.codes, str(report)
    assert next(f for f in report.findings if f.code == code).path == "dropout"


def test_layer_that_ignores_eval_mode_is_caught():
    report = audit_nnx_model(AlwaysOn(nnx.Rngs(dropout=0)), X)
    assert report.codes == {"eval-not-deterministic"}, str(report)


def test_audit_nnx_model_rejects_linen_modules():
    import flax.linen as nn

    with pytest.raises(dropmask.DropmaskTypeError, match="audit_model"):
        audit_nnx_model(nn.Dense(3), X)


def test_audit_nnx_is_the_deprecated_alias_of_audit_nnx_model():
    assert dropmask.audit.audit_nnx is audit_nnx_model
    assert {"audit_nnx", "audit_nnx_model"} <= set(dropmask.audit.__all__)


LAYERS = 3


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(8, 8, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        # Positive inputs: every element is valid, so whole masks are compared.
        return self.dropout(jnp.tanh(self.linear(x)) + 2)


class Stack(nnx.Module):
    """``LAYERS`` blocks built with ``nnx.vmap`` and applied in turn with ``nnx.scan``.

    ``split_dropout=False`` is the bug: only the 'params' stream is split over the
    layers, so each layer's dropout forks the one broadcast 'dropout' stream and all
    layers hold the same key.
    """

    def __init__(self, rngs: nnx.Rngs, split_dropout: bool = True):
        only = ... if split_dropout else "params"
        axes = 0 if split_dropout else nnx.StateAxes({"params": 0, ...: None})

        @nnx.split_rngs(splits=LAYERS, only=only)
        @nnx.vmap(in_axes=(axes,), out_axes=0)
        def create(rngs: nnx.Rngs) -> Block:
            return Block(rngs)

        self.blocks = create(rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(x, block):
            return block(x)

        return forward(x, self.blocks)


@pytest.mark.parametrize(
    ("split_dropout", "codes"), [(True, set()), (False, {"same-mask-across-iterations"})]
)
def test_nnx_scan_over_layers_with_one_dropout_key_is_caught(split_dropout, codes):
    model = Stack(nnx.Rngs(params=0, dropout=1), split_dropout)
    keys = jax.random.key_data(model.blocks.dropout.rngs.key[...])
    assert (len(np.unique(np.asarray(keys), axis=0)) == LAYERS) is split_dropout
    report = audit_nnx_model(model, X)
    assert report.codes == codes, str(report)
    assert all(f.path == "blocks/dropout" for f in report.findings)
    (site,) = report.sites
    assert site.path == "blocks/dropout" and site.kind == "dropout"
    # 4 sigma over the fewest independent draws: 2 calls x 128 elements when shared.
    assert abs(site.drop_fraction - 0.5) < 0.125


def _digits_nnx_step_target():
    from dropmask.audit import target_from_example
    from dropmask.examples.digits_nnx.train import example

    return target_from_example(example)


def test_an_nnx_train_step_is_audited_and_a_frozen_step_key_is_caught():
    import optax

    from dropmask.audit import audit_nnx_step

    target = _digits_nnx_step_target()
    assert audit_nnx_step(target.train_step, target.state, target.batches).ok

    @jax.jit
    def frozen(state, batch):
        # The bug: the model is rebuilt at step 0 every step, so its masks never change.
        def loss_fn(params):
            model = state.replace(step=jnp.zeros_like(state.step)).model(params)
            logits = model(batch["image"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

        return state.apply_gradients(grads=jax.grad(loss_fn)(state.params))

    report = audit_nnx_step(frozen, target.state, target.batches)
    assert "same-mask-across-steps" in report.codes, str(report)
    # The fix is NNX's: no Linen rngs={'dropout': ...} argument.
    steps = [f for f in report.findings if f.code == "same-mask-across-steps"]
    assert all("NnxTrainState.model(params)" in f.message for f in steps), str(report)
    assert not any("rngs={'dropout'" in f.message for f in steps), str(report)
    with pytest.raises(dropmask.DropmaskTypeError, match="audit_nnx_step: state must be"):
        audit_nnx_step(frozen, {"params": {}}, target.batches)
    with pytest.raises(dropmask.DropmaskValueError, match="at least 2 batches"):
        audit_nnx_step(frozen, target.state, target.batches[:1])


@pytest.mark.parametrize("algorithm", ["dense", "blockwise"])
def test_dropmask_attention_weights_are_a_site_of_their_own(algorithm):
    import functools

    class SelfAttention(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.attention = nnx.MultiHeadAttention(
                2,
                8,
                dropout_rate=0.25,
                broadcast_dropout=False,
                deterministic=False,
                decode=False,
                attention_fn=functools.partial(dropmask.dot_product_attention, algorithm=algorithm),
                rngs=rngs,
            )

        def __call__(self, x):
            return self.attention(x, is_causal=True)

    report = audit_nnx_model(SelfAttention(nnx.Rngs(0, dropout=1)), X.reshape(2, 8, 8))
    assert report.ok, str(report)
    (site,) = report.sites
    assert site.kind == "attention" and site.input_shape == (2, 2, 8, 8)
    # 4 sigma over the 2 calls x 2 x 2 x 36 causal weights of the training phase.
    assert abs(site.drop_fraction - 0.25) < 4 * (0.25 * 0.75 / 288) ** 0.5


# --- the randomness pitfalls of NNX transforms -------------------------------------------


class Example(nnx.Module):
    """One example at a time: ``x: [8]``."""

    def __init__(self, rngs: nnx.Rngs, layer=nnx.Dropout):
        self.linear = nnx.Linear(8, 64, rngs=rngs)
        self.dropout = layer(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(jnp.tanh(self.linear(x)) + 2)


class PerExample(nnx.Module):
    """``Example`` mapped over the batch with ``nnx.vmap``.

    ``split=False`` is flax#4195: the module, its stream included, is broadcast
    (``in_axes=None``), so every member draws the same key and counter.
    """

    def __init__(self, rngs: nnx.Rngs, split: bool, layer=nnx.Dropout):
        self.example = Example(rngs, layer)
        self.split = split

    def __call__(self, x):
        if not self.split:
            return nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(self.example, x)

        @nnx.split_rngs(splits=x.shape[0], only="dropout")
        @nnx.vmap(in_axes=(nnx.StateAxes({"dropout": 0, ...: None}), 0))
        def forward(example, x):
            return example(x)

        return forward(self.example, x)


# Fast: each layer's broadcast stream caught, and dropmask's split stream clean; Flax's
# split stream (slow) is the same control.
@pytest.mark.parametrize(
    ("split", "codes", "layer"),
    covering(
        [
            (split, codes, layer)
            for split, codes in [(False, {"same-mask-across-vmap"}), (True, set())]
            for layer in (nnx.Dropout, dnnx.Dropout)
        ],
        [
            (False, {"same-mask-across-vmap"}, nnx.Dropout),
            (False, {"same-mask-across-vmap"}, dnnx.Dropout),
            (True, set(), dnnx.Dropout),
        ],
        unpack=True,
    ),
    ids=[
        f"{split}-codes{i}-{name}"
        for i, split in enumerate((False, True))
        for name in ("flax", "dropmask")
    ],
)
def test_a_stream_broadcast_into_nnx_vmap_is_caught(layer, split, codes):
    model = PerExample(nnx.Rngs(0, dropout=1), split, layer)
    out = np.asarray(model(X))
    assert bool(((out[0] == 0) == (out[1] == 0)).all()) == (not split)
    report = audit_nnx_model(model, X)
    assert report.codes == codes, str(report)
    if not split:
        (finding,) = report.findings
        assert finding.path == "example/dropout" and "nnx.split_rngs" in finding.message


STEPS = 4


class Cell(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(8, 8, rngs=rngs)
        self.dropout = dnnx.Dropout(0.5, rngs=rngs)

    def __call__(self, h, rngs=None):
        return self.dropout(jnp.tanh(self.linear(h)) + 2, rngs=rngs)


class Recurrent(nnx.Module):
    """``Cell`` applied ``STEPS`` times with ``nnx.scan``, its stream passed four ways.

    ``'broadcast'``: the cell broadcast into the scan (``in_axes=None``): one key and
    counter in every iteration, and the counter's advance is dropped. ``'carried_key'``:
    one key drawn before the scan and carried through it unsplit. ``'carry'``: the cell
    as ``nnx.Carry`` (its stream advances per iteration). ``'split_keys'``: one key per
    iteration, scanned over.
    """

    def __init__(self, rngs: nnx.Rngs, how: str):
        self.cell = Cell(rngs)
        self.rngs = rngs["dropout"].fork()
        self.how = how

    def __call__(self, x):
        steps = jnp.arange(STEPS)
        if self.how == "broadcast":
            step = nnx.scan(lambda c, h, _: (c(h),) * 2, in_axes=(None, nnx.Carry, 0))
            return step(self.cell, x, steps)[0]
        if self.how == "carried_key":

            def carry_key(cell, carry, _):
                h, key = carry
                h = cell(h, rngs=key)
                return (h, key), h

            step = nnx.scan(carry_key, in_axes=(None, nnx.Carry, 0))
            return step(self.cell, (x, self.rngs()), steps)[0][0]
        if self.how == "carry":

            def carry_cell(carry, _):
                cell, h = carry
                h = cell(h)
                return (cell, h), h

            return nnx.scan(carry_cell, in_axes=(nnx.Carry, 0))((self.cell, x), steps)[0][1]
        keys = jax.random.split(self.rngs(), STEPS)
        step = nnx.scan(lambda c, h, k: (c(h, rngs=k),) * 2, in_axes=(None, nnx.Carry, 0))
        return step(self.cell, x, keys)[0]


@pytest.mark.parametrize(
    ("how", "codes", "says"),
    [
        ("broadcast", {"same-mask-across-iterations", "same-mask-across-steps"}, "nnx.Carry"),
        ("carried_key", {"same-mask-across-iterations"}, "carried through the scan unsplit"),
        ("carry", set(), ""),
        ("split_keys", set(), ""),
    ],
)
def test_unsplit_streams_under_nnx_scan_are_caught_with_their_fix(how, codes, says):
    report = audit_nnx_model(Recurrent(nnx.Rngs(0, dropout=1), how), X)
    assert report.codes == codes, str(report)
    iteration = [f for f in report.findings if f.code == "same-mask-across-iterations"]
    assert all(says in f.message and f.path == "cell/dropout" for f in iteration)
    steps = [f for f in report.findings if f.code == "same-mask-across-steps"]
    assert all("broadcast into an nnx.scan or nnx.vmap" in f.message for f in steps)
