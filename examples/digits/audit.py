"""The digits example's hook for ``dropmask audit digits``: its model, step and batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dropmask.audit import AuditTarget
from examples.digits import configs
from examples.digits.train import example


def audit_target(steps: int = 3) -> AuditTarget:
    """The tiny config's MLP with dropout on, its train state and ``steps`` batches.

    Keys are split as the training loop splits them, so the audit sees the masks a
    real run draws.
    """
    config = configs.get_tiny_config()
    data = example.load_data(config)
    data_key, params_key, dropout_key = jax.random.split(jax.random.key(config.seed), 3)
    state = example.create_state(config, data, params_key, dropout_key)
    batches = [example.train_batch(config, data, data_key, step) for step in range(steps)]
    return AuditTarget(
        model=state.apply_fn.__self__,
        variables={"params": state.params},
        args=(jnp.asarray(batches[0]["image"]),),
        train_step=example.train_step,
        state=state,
        batches=batches,
    )
