"""The translate example's hook for ``dropmask audit translate``: its model, step and batches.

The Transformer selects its mode by a frozen config field, as Flax's WMT example
does, so the audit gets the evaluation module itself
(``config.replace(deterministic=True)``) instead of call arguments.
"""

from __future__ import annotations

import jax

from dropmask.audit import AuditTarget
from examples.translate import configs
from examples.translate.models import Transformer
from examples.translate.train import example, model_inputs


def audit_target(steps: int = 3) -> AuditTarget:
    """The tiny config's Transformer with dropout on, its train state and ``steps`` batches.

    Keys are split as the training loop splits them, so the audit sees the masks a
    real run draws.
    """
    config = configs.get_tiny_config()
    data = example.load_data(config)
    data_key, params_key, dropout_key = jax.random.split(jax.random.key(config.seed), 3)
    state = example.create_state(config, data, params_key, dropout_key)
    batches = [example.train_batch(config, data, data_key, step) for step in range(steps)]
    model = state.apply_fn.__self__
    return AuditTarget(
        model=model,
        eval_model=Transformer(model.config.replace(deterministic=True)),
        variables={"params": state.params},
        args=model_inputs(batches[0]),
        train_step=example.train_step,
        state=state,
        batches=batches,
    )
