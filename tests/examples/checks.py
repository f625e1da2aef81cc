"""Checks every application's tiny-config test shares."""

import jax
import numpy as np


def assert_step_changes_every_parameter_and_uses_the_key(train_step, state, batch):
    """One jitted step is deterministic for a state, changes every parameter, and draws
    its dropout masks from ``state.key`` (another key gives another loss)."""
    (a, metrics_a), (b, metrics_b) = train_step(state, batch), train_step(state, batch)
    assert float(metrics_a["loss"]) == float(metrics_b["loss"])
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
    changed = jax.tree.map(
        lambda x, y: bool(np.any(np.asarray(x) != np.asarray(y))), a.params, state.params
    )
    assert all(jax.tree.leaves(changed)), changed
    _, other_key = train_step(state.replace(key=jax.random.key(7)), batch)
    assert float(other_key["loss"]) != float(metrics_a["loss"])
