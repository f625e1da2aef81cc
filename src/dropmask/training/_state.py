"""A Flax ``TrainState`` that carries the PRNG key for dropout and other streams."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax.training import train_state

from .._checks import check_grads, check_key, check_optimizer
from .._errors import DropmaskTypeError, user_error
from ._keys import step_key, step_rngs

__all__ = ["TrainState"]


class TrainState(train_state.TrainState):
    """``flax.training.train_state.TrainState`` plus the PRNG ``key`` for random layers.

    The key is a pytree leaf, so it passes through ``jax.jit`` and is kept unchanged
    by ``apply_gradients``; only ``step`` advances. :meth:`rngs` (and :meth:`step_key`
    for one stream) derive this step's key of each named stream by one rule,
    ``fold_in(fold_in(key, stream_id(name)), step)``, so adding a stream never changes
    another stream's masks.

    Saving: ``flax.serialization.to_bytes(state)`` fails on the typed key ("JAX array
    with PRNGKey dtype cannot be converted to a NumPy array"). Use
    ``dropmask.training.to_bytes`` / ``from_bytes`` instead (the key is written as key
    data and restored to the same impl), or :class:`dropmask.training.Checkpointer`
    for whole runs.

    Attributes:
      key: a scalar PRNG key, typically the ``dropout_key`` split from the root key.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> import flax.linen as nn
      >>> from dropmask import linen as dl
      >>> from dropmask.training import TrainState
      >>> class MLP(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x, training: bool):  # x: [batch, 4]
      ...         x = nn.Dense(3)(x)
      ...         return dl.Dropout(0.5, deterministic=not training)(x)
      >>> params_key, dropout_key = jax.random.split(jax.random.key(0))
      >>> model = MLP()
      >>> params = model.init(params_key, jnp.ones((2, 4)), training=False)["params"]
      >>> state = TrainState.create(
      ...     apply_fn=model.apply, params=params, tx=optax.sgd(0.1), key=dropout_key)
      >>> @jax.jit
      ... def train_step(state, x):
      ...     def loss_fn(params):
      ...         y = state.apply_fn({"params": params}, x, training=True,
      ...                            rngs=state.rngs("dropout"))
      ...         return jnp.mean(y**2)
      ...     return state.apply_gradients(grads=jax.grad(loss_fn)(state.params))
      >>> state = train_step(state, jnp.ones((2, 4)))
      >>> int(state.step), state.key is not None
      (1, True)
    """

    key: jax.Array

    @classmethod
    def create(cls, *, apply_fn: Any, params: Any, tx: Any, **kwargs: Any) -> TrainState:
        """Like ``flax.training.train_state.TrainState.create``, plus a required ``key``.

        ``step`` starts as an ``int32`` scalar array rather than Flax's Python ``0``:
        a Python int and the array that ``apply_gradients`` returns are different
        ``jit`` signatures, so with Flax's default a jitted ``train_step`` compiles
        twice (steps 0 and 1); here it compiles once.

        Raises:
          TypeError: ``key`` is missing or is not one PRNG key (e.g. an int seed), or
            ``tx`` is not an optax transformation.
        """
        if "key" not in kwargs:
            raise user_error(
                DropmaskTypeError,
                "TrainState.create needs key=..., the PRNG key for dropout, e.g. "
                "TrainState.create(apply_fn=..., params=..., tx=..., key=dropout_key)",
                caller=None,
            )
        check_key(kwargs["key"], caller="TrainState.create")
        check_optimizer(tx, caller="TrainState.create")
        state = super().create(apply_fn=apply_fn, params=params, tx=tx, **kwargs)
        return state.replace(step=jnp.zeros((), jnp.int32))

    def apply_gradients(self, *, grads: Any, **kwargs: Any) -> TrainState:
        """Flax's ``apply_gradients`` (one optimizer update; ``step`` advances by 1), once
        ``grads`` is checked against ``params``.

        Raises:
          DropmaskValueError: ``grads`` is not a tree of ``params``' structure, or a
            leaf's shape or dtype is not its parameter's (a stack of gradients with a
            leading axis would otherwise broadcast into the parameters).
        """
        check_grads(grads, self.params, caller="TrainState.apply_gradients")
        return super().apply_gradients(grads=grads, **kwargs)

    def step_key(self, stream: str = "dropout") -> jax.Array:
        """This step's key for one stream, the same key as ``self.rngs(stream)[stream]``.

        Args:
          stream: the stream name; ``'dropout'`` by default.

        Returns:
          A scalar PRNG key; pass it as ``rngs={'dropout': state.step_key()}``.
        """
        return step_key(self, stream)

    def rngs(self, *names: str) -> dict[str, jax.Array]:
        """Independent keys for this step, one per named stream (see :func:`step_rngs`).

        Args:
          *names: stream names, e.g. ``'dropout'``, ``'lstm'``.

        Returns:
          ``{name: key}``, for ``apply_fn(variables, x, rngs=state.rngs('dropout'))``.
        """
        return step_rngs(self, *names)
