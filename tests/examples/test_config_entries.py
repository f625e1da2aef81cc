"""Every config entry an example accepts is read by it: set to another value, it changes
the run (the train losses of a few steps, or where they are equal the evaluation after
them), or the example refuses it with one :class:`dropmask.DropmaskError`.

The loop's own entries (``dropmask.training.base_config``: logging, evaluation and
checkpoint intervals, ...) are the loop's tests' concern; ``rate`` is the example's.
Each table below must name every other entry of the example's config, so that an entry
added later is added here too. The Linen and NNX twins are checked alike.
"""

from __future__ import annotations

import math

import pytest

import dropmask
from dropmask.examples.digits import train as digits
from dropmask.examples.digits_nnx import train as digits_nnx
from dropmask.training import RateSchedule, base_config, run_keys

REFUSED = object()
STEPS = 3
LOOP_ENTRIES = set(base_config()) - {"rate"}


def _losses(example, config):
    """The losses of ``STEPS`` steps as the loop runs them, and the state after them."""
    data = example.load_data(config)
    data_key, params_key, dropout_key = run_keys(config.seed)
    state = example.create_state(config, data, params_key, dropout_key)
    rates = RateSchedule.from_config(config)
    losses = []
    for step in range(STEPS):
        batch = dict(example.train_batch(config, data, data_key, step))
        if rates is not None:
            batch["rate"] = rates(step)
        state, metrics = example.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, (state, data)


def _evaluation(example, config, after):
    state, data = after
    return {k: float(v) for k, v in example.evaluate(state, config, data, "eval").items()}


def _close(x, y):
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7)


# entry: (the other value, the other entries it is tried with, what it must do)
DIGITS = {
    "rate": (0.1, {}, "changes"),
    "data_path": ("no/such/digits.npz", {}, REFUSED),
    "data_seed": (1, {}, "changes"),
    "train_size": (120, {}, "changes"),
    "label_noise": (0.5, {}, "changes"),
    "model": ("conv", {}, "changes"),
    "hidden": ((16,), {}, "changes"),
    "block_size": (2, {"model": "conv"}, "changes"),
    "input_rate": (0.3, {}, "changes"),
    "rate_schedule": ("early:1", {}, "changes"),
    "learning_rate": (0.05, {}, "changes"),
    "batch_size": (12, {}, "changes"),
}
# The MLP reads no block size; the conv net no input rate.
DIGITS_REFUSALS = {
    "block_size": (2, {"model": "mlp"}, REFUSED),
    "input_rate": (0.3, {"model": "conv"}, REFUSED),
}
DIGITS_NNX = {
    **DIGITS,
    "model": ("conv", {}, REFUSED),
    "block_size": (2, {}, REFUSED),
}

# The examples in the checkout: whole models, so each case compiles one; marked slow.
SEQ2SEQ = {
    "rate": (0.3, {}, "changes"),
    "max_digits": (3, {}, "changes"),
    "data_seed": (1, {}, "changes"),
    "eval_size": (32, {}, "changes"),
    "embed_dim": (4, {}, "changes"),
    "hidden": (8, {}, "changes"),
    "zoneout_cell": (0.3, {}, "changes"),
    "zoneout_hidden": (0.3, {}, "changes"),
    "weight_dropout": (0.3, {}, "changes"),
    "learning_rate": (0.01, {}, "changes"),
    "warmup_steps": (2, {}, "changes"),
    "decay_steps": (4, {}, "changes"),
    "batch_size": (8, {}, "changes"),
}
SST2 = {
    "rate": (0.1, {}, "changes"),
    "data_dir": ("no/such/glue", {}, REFUSED),
    "data_seed": (1, {}, "changes"),
    "train_size": (96, {}, "changes"),
    "dev_size": (32, {}, "changes"),
    "embed_dim": (4, {}, "changes"),
    "hidden": (4, {}, "changes"),
    "word_rate": (0.5, {}, "changes"),
    "r_drop": (1.0, {}, "changes"),
    "learning_rate": (0.01, {}, "changes"),
    "batch_size": (8, {}, "changes"),
}
# Entries that by design leave the result as it is (an algorithm, a tile size, a
# batching of evaluation) are shown read by refusing a value they cannot take.
LM = {
    "rate": (0.3, {}, "changes"),
    "eval_fraction": (0.2, {}, "changes"),
    "context": (32, {}, "changes"),
    "batch_size": (4, {}, "changes"),
    "width": (16, {}, "changes"),
    "heads": (4, {}, "changes"),
    "depth": (3, {}, "changes"),
    "mlp_ratio": (2, {}, "changes"),
    "attention": ("flax", {}, "changes"),
    "attention_algorithm": ("bogus", {}, REFUSED),
    "attention_block": (-1, {}, REFUSED),
    "token_drop": (0.5, {"depth": 3}, "changes"),
    "token_drop_ends": (0, {"depth": 3, "token_drop": 0.5}, "changes"),
    "learning_rate": (0.02, {}, "changes"),
    "warmup_steps": (0, {}, "changes"),
    "weight_decay": (0.5, {}, "changes"),
    "eval_windows": (4, {}, "changes"),
}
TRANSLATE = {
    "rate": (0.3, {}, "changes"),
    "src": ("no/such.txt", {}, REFUSED),
    "tgt": ("no/such.txt", {}, REFUSED),
    "data_seed": (1, {}, "changes"),
    "train_size": (200, {}, "changes"),
    "eval_size": (4, {}, "changes"),
    "vocab_size": (150, {}, "changes"),
    "max_len": (64, {}, "changes"),
    "batch_size": (2, {}, "changes"),
    "emb_dim": (8, {}, "changes"),
    "num_heads": (4, {}, "changes"),
    "num_layers": (2, {}, "changes"),
    "qkv_dim": (8, {}, "changes"),
    "mlp_dim": (16, {}, "changes"),
    "layer_drop": (0.5, {}, "changes"),
    "pruned_encoder": ((1,), {"num_layers": 2}, "changes"),
    "pruned_decoder": ((1,), {"num_layers": 2}, "changes"),
    "attention_algorithm": ("bogus", {}, REFUSED),
    "learning_rate": (0.01, {}, "changes"),
    "warmup_steps": (2, {}, "changes"),
    "decay_steps": (4, {}, "changes"),
    "beam_size": (0, {}, REFUSED),
    "beam_alpha": (float("nan"), {}, REFUSED),
    "eval_batch_size": (0, {}, REFUSED),
}


def _checkout_example(name):
    import importlib

    return importlib.import_module(f"examples.{name}.train").example


CHECKOUT = {"seq2seq": SEQ2SEQ, "sst2": SST2, "lm": LM, "translate": TRANSLATE}

# The entries digits_nnx reads through digits' own data pipeline (its load_data and
# train_batch are digits', which test_nnx_twin_shares_the_data_pipeline checks): run
# once, for digits.
SHARED_DATA_ENTRIES = {"data_path", "data_seed", "train_size", "label_noise", "batch_size"}

CASES = [
    *[(digits.example, name, *spec) for name, spec in DIGITS.items()],
    *[(digits.example, name, *spec) for name, spec in DIGITS_REFUSALS.items()],
    *[
        (digits_nnx.example, name, *spec)
        for name, spec in DIGITS_NNX.items()
        if name not in SHARED_DATA_ENTRIES
    ],
]
SLOW_CASES = [
    (example, name, *spec) for example, table in CHECKOUT.items() for name, spec in table.items()
]


@pytest.mark.parametrize(
    ("example", "tables"),
    [
        (digits.example, [DIGITS]),
        (digits_nnx.example, [DIGITS_NNX]),
        *[(name, [table]) for name, table in CHECKOUT.items()],
    ],
    ids=["digits", "digits_nnx", *CHECKOUT],
)
def test_every_entry_has_a_case(example, tables):
    if isinstance(example, str):
        example = _checkout_example(example)
    config = example.get_tiny_config()
    covered = set().union(*tables)
    assert set(config) - LOOP_ENTRIES == covered, set(config) - LOOP_ENTRIES ^ covered


def test_nnx_twin_shares_the_data_pipeline():
    for field in ("load_data", "train_batch"):
        assert getattr(digits_nnx.example, field) is getattr(digits.example, field), field
    assert SHARED_DATA_ENTRIES <= set(DIGITS_NNX)


_BASE_RUNS: dict = {}


def _check_entry(example, name, value, context, expected):
    """Refused, or the run differs: its losses, or where they are equal (an entry only
    evaluation reads), the evaluation after them (compiled only then)."""
    base = example.get_tiny_config()
    base.update(context)
    other = base.copy_and_resolve_references()
    other[name] = value
    if expected is REFUSED:
        with pytest.raises(dropmask.DropmaskError, match=name):
            _evaluation(example, other, _losses(example, other)[1])
        return
    key = (example.name, tuple(sorted(context.items())))
    if key not in _BASE_RUNS:  # one reference run per context, shared by its cases
        losses, after = _losses(example, base)
        _BASE_RUNS[key] = (losses, _evaluation(example, base, after))
    base_losses, base_eval = _BASE_RUNS[key]
    losses, after = _losses(example, other)
    if not all(_close(x, y) for x, y in zip(losses, base_losses, strict=True)):
        return
    evaluation = _evaluation(example, other, after)
    assert any(not _close(evaluation[k], base_eval[k]) for k in base_eval), (
        f"{name}={value!r} unread"
    )


def _ids(cases):
    names = [c[0] if isinstance(c[0], str) else c[0].name for c in cases]
    return [
        f"{n}-{c[1]}-{'refused' if c[4] is REFUSED else 'read'}"
        for n, c in zip(names, cases, strict=True)
    ]


@pytest.mark.parametrize(
    ("example", "name", "value", "context", "expected"), CASES, ids=_ids(CASES)
)
def test_entry_changes_the_run_or_is_refused(example, name, value, context, expected):
    _check_entry(example, name, value, context, expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "name", "value", "context", "expected"), SLOW_CASES, ids=_ids(SLOW_CASES)
)
def test_checkout_example_entry_changes_the_run_or_is_refused(
    example, name, value, context, expected
):
    _check_entry(_checkout_example(example), name, value, context, expected)
