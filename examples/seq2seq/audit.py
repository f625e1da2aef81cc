"""The seq2seq example's hook for ``dropmask audit seq2seq``: its model, step and batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dropmask.audit import AuditTarget
from examples.seq2seq import configs
from examples.seq2seq.train import example


def audit_target(steps: int = 3) -> AuditTarget:
    """The tiny config's encoder-decoder with dropout on, its train state and ``steps`` batches.

    Keys are split as the training loop splits them, so the audit sees the masks a
    real run draws.
    """
    config = configs.get_tiny_config()
    data = example.load_data(config)
    data_key, params_key, dropout_key = jax.random.split(jax.random.key(config.seed), 3)
    state = example.create_state(config, data, params_key, dropout_key)
    batches = [example.train_batch(config, data, data_key, step) for step in range(steps)]
    first = batches[0]
    return AuditTarget(
        model=state.apply_fn.__self__,
        variables={"params": state.params},
        args=tuple(
            jnp.asarray(first[k]) for k in ("query", "query_length", "answer", "answer_length")
        ),
        train_kwargs={"training": True},
        eval_kwargs={"training": False},
        train_step=example.train_step,
        state=state,
        batches=batches,
    )
