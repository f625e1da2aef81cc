"""The digits example's hook for ``dropmask audit digits``: its model, step and batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dropmask.audit import AuditTarget
from examples.digits import configs, input_pipeline
from examples.digits.models import MLP
from examples.digits.train import create_train_state, train_step


def audit_target(steps: int = 3) -> AuditTarget:
    """The tiny config's MLP with dropout on, its train state and ``steps`` batches."""
    config = configs.tiny()
    train, _ = input_pipeline.load(config.train_size, seed=config.seed)
    main_key, params_key, dropout_key = jax.random.split(jax.random.key(config.seed), 3)
    model = MLP(hidden=config.hidden, rate=config.rate, input_rate=config.input_rate)
    images = jnp.asarray(train.image[: config.batch_size])
    state = create_train_state(model, params_key, dropout_key, images[:1], config.learning_rate)
    batches = list(input_pipeline.batches(train, config.batch_size, main_key))[:steps]
    return AuditTarget(
        model=model,
        variables={"params": state.params},
        args=(images,),
        train_step=train_step,
        state=state,
        batches=batches,
    )
