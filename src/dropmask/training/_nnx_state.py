"""A train state for Flax NNX models whose masks follow the stream rule of ``TrainState``.

An NNX model keeps its PRNG streams inside itself: every ``RngStream`` holds a key and a
counter, and each draw folds the counter in and advances it. A run's masks then depend
on how many draws came before: a resumed run whose counters were not restored, one extra
call in training mode (a debugging forward pass, an audit, a train-mode evaluation) or a
model rebuilt with a different number of layers before a stream all shift every later
mask. :class:`NnxTrainState` stores the model split (``nnx.split``) into a graph
definition and its variables, and every time it rebuilds the model it re-keys each
stream the model holds by one rule::

    fold_in(stream_key(key, step, tag), crc32(path))

where ``stream_key(key, step, tag) = fold_in(fold_in(key, crc32(tag)), step)`` is the
rule of the Linen :class:`~dropmask.training.TrainState`, ``tag`` is the stream's name
(``'dropout'``) and ``path`` is where the stream sits in the model
(``'blocks/dropout/rngs'``). Counters start at 0 in every step. A step's masks are
then a function of the stored key, the step, the stream and the layer alone, whatever
ran before, and however many devices run it.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from .._checks import check_grads, check_instance, check_key, check_optimizer
from ._keys import stream_key

__all__ = ["NnxTrainState", "rekeyed_streams"]


def _path_id(path: tuple[Any, ...]) -> int:
    """A stable 32-bit id of a stream's place in the model (CRC-32 of its path)."""
    return zlib.crc32("/".join(str(part) for part in path).encode("utf-8"))


def _keys_like(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``key`` for a scalar stream; one key per member of a stacked (``nnx.vmap``) stream."""
    if not shape:
        return key
    index = jnp.arange(math.prod(shape), dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, index).reshape(shape)


def rekeyed_streams(rng_state: nnx.State, key: jax.Array, step: Any) -> nnx.State:
    """``rng_state`` (an ``nnx.RngState`` split) with every stream keyed by the stream rule.

    A stream with tag ``tag`` at path ``p`` gets ``fold_in(stream_key(key, step, tag),
    crc32(p))`` and a zero counter; a stream stacked by ``nnx.vmap`` (key shape ``S``)
    gets that key folded with each member's flat index.

    Args:
      rng_state: the ``RngKey`` and ``RngCount`` variables of a model.
      key: the root key of the run's streams (``NnxTrainState.key``).
      step: the step, an int or int32 scalar (possibly traced).

    Returns:
      A state of the same structure.
    """
    out = []
    for path, variable in nnx.to_flat_state(rng_state):
        if isinstance(variable, nnx.RngKey):
            root = jax.random.fold_in(stream_key(key, step, variable.tag), _path_id(path[:-1]))
            out.append((path, variable.replace(_keys_like(root, tuple(variable.shape)))))
        elif isinstance(variable, nnx.RngCount):
            out.append((path, variable.replace(jnp.zeros(variable.shape, jnp.uint32))))
        else:
            out.append((path, variable))
    return nnx.from_flat_state(out)


class NnxTrainState(struct.PyTreeNode):
    """An NNX model, its optimizer state and the PRNG ``key``, as one pytree.

    The model is kept split (``nnx.split``): ``graphdef`` (static) plus ``params`` (the
    ``nnx.Param`` variables, which the optimizer updates), ``rng_state`` (the model's
    ``RngKey``/``RngCount`` variables, re-keyed on every rebuild) and ``other`` (every
    other variable, e.g. BatchNorm statistics). Being a plain pytree it passes through
    ``jax.jit``, ``nnx.jit``, :class:`~dropmask.training.Checkpointer` and
    :func:`~dropmask.training.replicate` as a Linen
    :class:`~dropmask.training.TrainState` does.

    :meth:`model` rebuilds the model for this step with every stream it holds keyed by
    ``fold_in(stream_key(key, step, tag), crc32(path))`` and its counter at 0 (see the
    module docstring); :meth:`rngs` gives an ``nnx.Rngs`` of this step's keys for a
    model that takes ``rngs`` at call time. Either way a step's masks depend only on
    the key, the step, the stream and the layer.

    Attributes:
      step: the number of updates applied, an ``int32`` scalar.
      graphdef: the model's structure and static attributes (its mode included).
      params: the trainable variables.
      rng_state: the model's PRNG streams as built (never advanced).
      other: the model's remaining variables.
      opt_state: the optimizer's state.
      tx: the optax transformation.
      key: the scalar root key of every stream.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> from flax import nnx
      >>> from dropmask import nnx as dnnx
      >>> from dropmask.training import NnxTrainState
      >>> class MLP(nnx.Module):
      ...     def __init__(self, rngs: nnx.Rngs):
      ...         self.linear = nnx.Linear(4, 3, rngs=rngs)
      ...         self.dropout = dnnx.Dropout(0.5, rngs=rngs)
      ...     def __call__(self, x):  # x: [batch, 4]
      ...         return self.dropout(self.linear(x))
      >>> params_key, dropout_key = jax.random.split(jax.random.key(0))
      >>> model = MLP(nnx.Rngs(params=params_key, dropout=0))
      >>> state = NnxTrainState.create(model=model, tx=optax.sgd(0.1), key=dropout_key)
      >>> @jax.jit
      ... def train_step(state, x):
      ...     def loss_fn(params):
      ...         return jnp.mean(state.model(params)(x) ** 2)  # this step's masks
      ...     return state.apply_gradients(grads=jax.grad(loss_fn)(state.params))
      >>> state = train_step(state, jnp.ones((2, 4)))
      >>> int(state.step)
      1
    """

    step: jax.Array
    graphdef: nnx.GraphDef[Any] = struct.field(pytree_node=False)
    params: nnx.State
    rng_state: nnx.State
    other: nnx.State
    opt_state: optax.OptState
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    key: jax.Array

    @classmethod
    def create(
        cls, *, model: nnx.Module, tx: optax.GradientTransformation, key: jax.Array
    ) -> NnxTrainState:
        """Splits ``model`` and initialises ``tx`` on its ``nnx.Param`` variables.

        ``model`` is left as it is (its arrays are shared, not copied). ``step``
        starts as an ``int32`` scalar, as in :meth:`TrainState.create`.

        Args:
          model: an ``nnx.Module``; the mode it is in (``.train()`` by default)
            is the mode :meth:`model` starts from.
          tx: an optax transformation.
          key: a scalar PRNG key, typically the run's ``dropout_key``.

        Raises:
          DropmaskTypeError: ``model`` is not an ``nnx.Module`` (a Linen module
            belongs in ``TrainState``), ``tx`` is not an optax transformation, or
            ``key`` is not one PRNG key.
        """
        check_instance(
            model,
            nnx.Module,
            caller="NnxTrainState.create",
            name="model",
            what="an nnx.Module",
            fix="For a Linen module use dropmask.training.TrainState.create("
            "apply_fn=model.apply, params=..., tx=..., key=...).",
        )
        check_key(key, caller="NnxTrainState.create")
        check_optimizer(tx, caller="NnxTrainState.create")
        graphdef, params, rng_state, other = nnx.split(model, nnx.Param, nnx.RngState, ...)
        return cls(
            step=jnp.zeros((), jnp.int32),
            graphdef=graphdef,
            params=params,
            rng_state=rng_state,
            other=other,
            opt_state=tx.init(params),
            tx=tx,
            key=key,
        )

    def model(
        self,
        params: nnx.State | None = None,
        *,
        training: bool | None = True,
        key: jax.Array | None = None,
    ) -> nnx.Module:
        """The model of this step, its streams keyed by the stream rule.

        Args:
          params: the parameters to build it with (e.g. the argument of a loss
            function under ``jax.grad``); ``self.params`` when None.
          training: True calls ``.train()`` (dropout on), False ``.eval()``
            (deterministic, running averages), None keeps the mode of the model
            given to :meth:`create`.
          key: the root key of the streams; ``self.key`` when None. A Monte Carlo
            sample or an audit passes its own.

        Returns:
          A new ``nnx.Module`` (a fresh object on every call).
        """
        streams = rekeyed_streams(self.rng_state, self.key if key is None else key, self.step)
        # Fresh variables: the model's updates (BatchNorm statistics, stream counters)
        # must not write into this state, which stays an immutable value under any trace.
        model = nnx.merge(
            self.graphdef,
            self.params if params is None else params,
            streams,
            self.other,
            copy=True,
        )
        if training is True:
            model.train()
        elif training is False:
            model.eval()
        return model

    def step_key(self, stream: str = "dropout") -> jax.Array:
        """This step's key of one stream: ``stream_key(key, step, stream)``."""
        return stream_key(self.key, self.step, stream)

    def rngs(self, *names: str) -> nnx.Rngs:
        """An ``nnx.Rngs`` of this step's keys, for a model that takes ``rngs`` at call time.

        Stream ``name`` starts from ``stream_key(key, step, name)``, the key a Linen
        ``TrainState.rngs(name)`` gives, so the same code path keys both APIs alike.

        Args:
          *names: stream names; ``'dropout'`` when none are given.

        Returns:
          ``nnx.Rngs(**{name: key})``, e.g. ``model(x, rngs=state.rngs())``.
        """
        names = names or ("dropout",)
        return nnx.Rngs(**{name: stream_key(self.key, self.step, name) for name in names})

    def apply_gradients(self, *, grads: nnx.State, **changes: Any) -> NnxTrainState:
        """One optimizer update of ``params`` with ``grads``; ``step`` advances by 1.

        Args:
          grads: gradients shaped like ``params`` (``jax.grad`` of a function of
            ``params``, or ``nnx.grad``'s ``nnx.Param`` state).
          **changes: other fields to replace, e.g. ``other=`` new BatchNorm statistics.

        Raises:
          DropmaskValueError: ``grads`` is not a tree of ``params``' structure, or a
            leaf's shape or dtype is not its parameter's (a stack of gradients with a
            leading axis would otherwise broadcast into the parameters).
        """
        check_grads(grads, self.params, caller="NnxTrainState.apply_gradients")
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        return self.replace(
            step=self.step + 1,
            params=optax.apply_updates(self.params, updates),
            opt_state=opt_state,
            **changes,
        )

    def other_of(self, model: nnx.Module) -> nnx.State:
        """``model``'s variables besides parameters and streams (e.g. batch statistics),
        to store with ``apply_gradients(grads=..., other=state.other_of(model))``."""
        _, _, _, other = nnx.split(model, nnx.Param, nnx.RngState, ...)
        return other
