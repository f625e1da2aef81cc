"""Training-loop helpers: a ``TrainState`` that carries the dropout key, per-step keys.

The pattern from the Flax dropout guide, packaged::

    main_key, params_key, dropout_key = jax.random.split(jax.random.key(0), 3)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx, key=dropout_key)
    # inside a jitted train_step:
    logits = state.apply_fn({"params": params}, x, training=True,
                            rngs={"dropout": state.step_key()})  # fold_in(key, step)
"""

from ._keys import step_key as step_key
from ._keys import step_rngs as step_rngs
from ._keys import stream_id as stream_id
from ._state import TrainState as TrainState

__all__ = ["TrainState", "step_key", "step_rngs", "stream_id"]
