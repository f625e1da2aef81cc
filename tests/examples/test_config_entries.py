"""Every config entry an example accepts is read by it: set to another value, it changes
the run (the train losses of a few steps and the evaluation after them), or the example
refuses it with one :class:`dropmask.DropmaskError`.

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


def _run(example, config):
    """The losses of ``STEPS`` steps and the eval metrics after them, as the loop runs them."""
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
    evaluation = example.evaluate(state, config, data, "eval")
    return losses, {k: float(v) for k, v in evaluation.items()}


def _differs(a, b):
    (losses_a, eval_a), (losses_b, eval_b) = a, b
    pairs = list(zip(losses_a, losses_b, strict=True))
    pairs += [(eval_a[k], eval_b[k]) for k in eval_a]
    return any(not math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) for x, y in pairs)


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

CASES = [
    *[(digits.example, name, *spec) for name, spec in DIGITS.items()],
    *[(digits.example, name, *spec) for name, spec in DIGITS_REFUSALS.items()],
    *[(digits_nnx.example, name, *spec) for name, spec in DIGITS_NNX.items()],
]


@pytest.mark.parametrize(
    ("example", "tables"), [(digits.example, [DIGITS]), (digits_nnx.example, [DIGITS_NNX])]
)
def test_every_entry_has_a_case(example, tables):
    config = example.get_tiny_config()
    covered = set().union(*tables)
    assert set(config) - LOOP_ENTRIES == covered, set(config) - LOOP_ENTRIES ^ covered


@pytest.mark.parametrize(
    ("example", "name", "value", "context", "expected"),
    CASES,
    ids=[f"{c[0].name}-{c[1]}-{'refused' if c[4] is REFUSED else 'read'}" for c in CASES],
)
def test_entry_changes_the_run_or_is_refused(example, name, value, context, expected):
    base = example.get_tiny_config()
    base.update(context)
    other = base.copy_and_resolve_references()
    other[name] = value
    if expected is REFUSED:
        with pytest.raises(dropmask.DropmaskError, match=name):
            _run(example, other)
        return
    assert _differs(_run(example, base), _run(example, other)), f"{name}={value!r} unread"
