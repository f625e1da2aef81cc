"""The ``evaluate`` and ``predict`` hooks of a classifier, from its model call alone.

A classifier example evaluates the same way whatever its model: the whole split in
one batch, the model with dropout off, mean cross-entropy and accuracy; and for the
Monte Carlo evaluation (``config.mc_samples``), logits with dropout off or ``K``
samples with dropout on. :class:`ClassifierEval` does both from what is specific to
the example: which batch a split is, and how the model is called on a batch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from .. import uncertainty
from .._checks import check_int, check_key
from ._nnx_state import NnxTrainState

__all__ = ["ClassifierEval"]

Batch = Mapping[str, Any]


# Monte Carlo samples drawn at once: all K samples in one vmap hold K copies of every
# activation (memory grows with K); a few at a time in a loop keep the working set of a
# few forward passes, whatever K is, at the same samples.
DEFAULT_CHUNK_SIZE = 4


class _Call(NamedTuple):
    """How the model is called: a static jit argument (hashable, compared by value)."""

    model_inputs: Callable[[Batch], tuple[Any, ...]]
    label: str
    train_kwargs: tuple[tuple[str, Any], ...]
    eval_kwargs: tuple[tuple[str, Any], ...]
    stream: str
    chunk_size: int = DEFAULT_CHUNK_SIZE


def _apply(
    state: Any, inputs: tuple[Any, ...], key: jax.Array | None, num_samples: int, call: _Call
) -> jax.Array:
    if isinstance(state, NnxTrainState):
        return _apply_nnx(state, inputs, key, num_samples, call)
    variables = {"params": state.params}
    if num_samples == 0:
        return state.apply_fn(variables, *inputs, **dict(call.eval_kwargs))

    def one(x: tuple[Any, ...], k: jax.Array) -> jax.Array:
        return state.apply_fn(variables, *x, **dict(call.train_kwargs), rngs={call.stream: k})

    chunk = min(call.chunk_size, num_samples)
    return uncertainty.sample(one, inputs, cast(jax.Array, key), num_samples, chunk_size=chunk)


def _apply_nnx(
    state: NnxTrainState,
    inputs: tuple[Any, ...],
    key: jax.Array | None,
    num_samples: int,
    call: _Call,
) -> jax.Array:
    """An NNX model's logits: ``.eval()``, or samples with only its dropout layers on."""
    if num_samples == 0:
        return state.model(training=False)(*inputs, **dict(call.eval_kwargs))
    return uncertainty.sample_nnx(
        state.model(training=None),
        *inputs,
        key=cast(jax.Array, key),
        num_samples=num_samples,
        **dict(call.train_kwargs),
    )


_logits = jax.jit(_apply, static_argnames=("num_samples", "call"))


# A split's batch goes into the jitted functions whole: ``model_inputs`` then runs on
# tracers, and the host arrays are transferred without a conversion compiled per shape.
@functools.partial(jax.jit, static_argnames=("num_samples", "call"))
def _batch_logits(
    state: Any, batch: Batch, key: jax.Array | None, num_samples: int, call: _Call
) -> jax.Array:
    return _apply(state, tuple(call.model_inputs(batch)), key, num_samples, call)


@functools.partial(jax.jit, static_argnames=("call",))
def _scores(state: Any, batch: Batch, call: _Call) -> dict[str, jax.Array]:
    logits = _apply(state, tuple(call.model_inputs(batch)), None, 0, call)
    labels = batch[call.label]
    return {
        "loss": optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
        "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels),
    }


@dataclasses.dataclass(frozen=True)
class ClassifierEval:
    """``evaluate`` and ``predict`` for an :class:`Example` whose model gives class logits.

    The model is called as ``state.apply_fn({'params': state.params}, *inputs,
    **kwargs)``, with ``inputs = model_inputs(batch)`` and the mode arguments of
    evaluation or training, as ``dropmask audit`` calls it: pass the same
    ``model_inputs``, ``train_kwargs`` and ``eval_kwargs`` to the ``Example``. For an
    :class:`NnxTrainState` the model is ``state.model(training=False)(*inputs,
    **eval_kwargs)`` and its samples are :func:`dropmask.uncertainty.sample_nnx`'s
    (only the dropout layers on); NNX models usually take no mode keywords, so pass
    ``train_kwargs={}`` and ``eval_kwargs={}``.

    Attributes:
      split_batch: ``(config, data, split) -> {name: array[n, ...]}``, the whole
        split (``'eval'`` or ``'train_eval'``) as one host-side batch.
      model_inputs: ``batch -> tuple``, the model's positional inputs.
      label: the batch entry holding the labels, ``int[n]``.
      train_kwargs: keyword arguments of a model call with dropout on.
      eval_kwargs: keyword arguments of a model call with dropout off.
      stream: the PRNG stream the model's dropout draws from.
      chunk_size: Monte Carlo samples computed at once (``uncertainty.sample``'s
        ``chunk_size``): ``K`` samples run as ``ceil(K / chunk_size)`` steps of a loop,
        so memory does not grow with ``K`` (``--mc-samples``); the samples are the
        same whatever it is. Default 4.

    Example:
      >>> import flax.linen as nn, jax, jax.numpy as jnp, numpy as np, optax
      >>> from dropmask import linen as dl
      >>> from dropmask.training import ClassifierEval, TrainState
      >>> class Model(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x, training: bool):  # x: [batch, 4]
      ...         return nn.Dense(3)(dl.Dropout(0.5, deterministic=not training)(x))
      >>> data = {"x": np.ones((6, 4), np.float32), "y": np.arange(6) % 3}
      >>> hooks = ClassifierEval(
      ...     split_batch=lambda config, data, split: data,
      ...     model_inputs=lambda batch: (batch["x"],), label="y")
      >>> model = Model()
      >>> params = model.init(jax.random.key(0), data["x"], training=False)["params"]
      >>> state = TrainState.create(
      ...     apply_fn=model.apply, params=params, tx=optax.sgd(0.1), key=jax.random.key(1))
      >>> sorted(hooks.evaluate(state, None, data, "eval"))
      ['accuracy', 'loss']
      >>> samples, labels = hooks.predict(state, None, data, "eval", jax.random.key(2), 4)
      >>> samples.shape, labels.shape
      ((4, 6, 3), (6,))
    """

    split_batch: Callable[[ml_collections.ConfigDict, Any, str], Batch]
    model_inputs: Callable[[Batch], tuple[Any, ...]]
    label: str = "label"
    train_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"training": True})
    eval_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"training": False})
    stream: str = "dropout"
    chunk_size: int = DEFAULT_CHUNK_SIZE

    def __post_init__(self) -> None:
        check_int(
            self.chunk_size, name="chunk_size", caller="ClassifierEval", minimum=1, shape=True
        )

    def logits(
        self, state: Any, inputs: tuple[Any, ...], key: jax.Array | None, num_samples: int
    ) -> jax.Array:
        """Logits of the model on ``inputs``, jitted.

        Args:
          state: a :class:`TrainState` of the model.
          inputs: the model's positional inputs (e.g. ``model_inputs(batch)``).
          key: the samples' key; ``None`` when ``num_samples`` is 0.
          num_samples: 0 for the logits with dropout off, ``float[n, classes]``;
            else ``K`` draws with dropout on, ``float[K, n, classes]``, draw ``i``
            keyed by ``fold_in(key, i)``.

        Raises:
          DropmaskTypeError: ``num_samples`` is not an int, or ``key`` is not one
            PRNG key when ``num_samples > 0``.
          DropmaskValueError: ``num_samples < 0``, or no key for ``num_samples > 0``.
        """
        _check_samples(key, num_samples, "ClassifierEval.logits")
        return _logits(state, tuple(inputs), key, num_samples, self._call)

    def evaluate(
        self, state: Any, config: ml_collections.ConfigDict, data: Any, split: str
    ) -> dict[str, float]:
        """``{'loss', 'accuracy'}`` on the whole split, dropout off: the ``evaluate`` hook.

        ``loss`` is the mean cross-entropy of the integer labels.
        """
        scores = _scores(state, self.split_batch(config, data, split), self._call)
        return {name: float(value) for name, value in scores.items()}

    def predict(
        self,
        state: Any,
        config: ml_collections.ConfigDict,
        data: Any,
        split: str,
        key: jax.Array | None,
        num_samples: int,
    ) -> tuple[jax.Array, np.ndarray]:
        """``(logits, labels)`` of the whole split (see :meth:`logits`): the ``predict`` hook."""
        _check_samples(key, num_samples, "ClassifierEval.predict")
        batch = self.split_batch(config, data, split)
        logits = _batch_logits(state, batch, key, num_samples, self._call)
        return logits, np.asarray(batch[self.label])

    @property
    def _call(self) -> _Call:
        return _Call(
            self.model_inputs,
            self.label,
            tuple(self.train_kwargs.items()),
            tuple(self.eval_kwargs.items()),
            self.stream,
            self.chunk_size,
        )


def _check_samples(key: jax.Array | None, num_samples: int, caller: str) -> None:
    check_int(num_samples, name="num_samples", caller=caller, minimum=0, shape=True)
    if num_samples:
        check_key(key, caller=caller)
