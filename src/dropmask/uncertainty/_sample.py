"""Monte Carlo dropout: K predictions with dropout on, one key per sample, in chunks.

The per-sample key rule, shared by every entry point: sample ``i`` is drawn with
``jax.random.fold_in(key, i)``. The same key and ``num_samples`` give the same
samples, and sample ``i`` does not change when ``num_samples`` grows.

Samples are computed by ``jax.vmap`` over the keys; with ``chunk_size`` set, by
``jax.lax.map(..., batch_size=chunk_size)`` (a ``vmap`` of ``chunk_size`` samples inside
a sequential loop), so that at most ``chunk_size`` samples' activations are live at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from .. import nnx as dnnx
from .._checks import check_callable, check_instance, check_int, check_key
from .._errors import DropmaskValueError, user_error

__all__ = ["sample", "sample_keys", "sample_linen", "sample_nnx"]

# The NNX layers that sample_nnx turns on, as a Linen model's train flag does: the
# dropout family and MaskedRNN's zoneout and weight dropout. Every other module runs in
# evaluation mode.
_NNX_DROPOUT = (
    nnx.Dropout,
    dnnx.Dropout,
    dnnx.WordDropout,
    dnnx.DropPath,
    dnnx.GaussianDropout,
    dnnx.AlphaDropout,
    dnnx.MaskedRNN,
)


def sample_keys(key: jax.Array, num_samples: int) -> jax.Array:
    """The keys of samples 0 to ``num_samples - 1``: ``fold_in(key, i)``.

    Args:
      key: one PRNG key (typed, or a raw ``uint32[2]`` key).
      num_samples: ``K >= 1``.

    Returns:
      ``K`` keys stacked on a leading axis, of ``key``'s kind.

    Raises:
      DropmaskTypeError: ``key`` is not one PRNG key, or ``num_samples`` not an int.
      DropmaskValueError: ``num_samples < 1``.

    Example:
      >>> import jax
      >>> from dropmask import uncertainty
      >>> keys = uncertainty.sample_keys(jax.random.key(0), 3)
      >>> bool(keys[2] == jax.random.fold_in(jax.random.key(0), 2))
      True
    """
    caller = "uncertainty.sample_keys"
    check_key(key, caller=caller)
    num_samples = check_int(num_samples, name="num_samples", caller=caller, minimum=1, shape=True)
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_samples))


def _check_chunk(chunk_size: Any, caller: str) -> int | None:
    if chunk_size is None:
        return None
    return check_int(chunk_size, name="chunk_size", caller=caller, minimum=1, shape=True)


def _over_keys(
    one: Callable[[jax.Array], Any], key: jax.Array, num_samples: int, chunk_size: Any, caller: str
) -> Any:
    """``one(fold_in(key, i))`` for every sample ``i``, stacked on a leading axis."""
    check_key(key, caller=caller)
    num_samples = check_int(num_samples, name="num_samples", caller=caller, minimum=1, shape=True)
    chunk = _check_chunk(chunk_size, caller)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_samples))
    if chunk is None or chunk >= num_samples:
        return jax.vmap(one)(keys)
    return jax.lax.map(one, keys, batch_size=chunk)


def sample(
    f: Callable[[Any, jax.Array], Any],
    x: Any,
    key: jax.Array,
    num_samples: int,
    *,
    chunk_size: int | None = None,
) -> Any:
    """``num_samples`` draws of ``f(x, key_i)``, ``key_i = fold_in(key, i)``.

    Args:
      f: ``(x, key) -> output``, a prediction that applies dropout with ``key``.
      x: its input, any pytree (the same for every sample).
      key: one PRNG key.
      num_samples: ``K >= 1``.
      chunk_size: at most this many samples are computed at once (``vmap`` of a chunk
        inside ``lax.map``); None: all ``K`` in one ``vmap``.

    Returns:
      ``f``'s output with a leading axis of size ``K`` on every leaf.

    Raises:
      DropmaskTypeError: ``f`` is not callable or ``key`` is not one PRNG key.
      DropmaskValueError: ``num_samples`` or ``chunk_size`` below 1.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> from dropmask import uncertainty
      >>> f = lambda x, key: dropmask.dropout(x, 0.5, key=key)
      >>> samples = uncertainty.sample(f, jnp.ones(4), jax.random.key(0), 8, chunk_size=3)
      >>> samples.shape
      (8, 4)
      >>> bool((samples[5] == f(jnp.ones(4), jax.random.fold_in(jax.random.key(0), 5))).all())
      True
    """
    caller = "uncertainty.sample"
    check_callable(
        f,
        caller=caller,
        name="f",
        what="callable as f(x, key)",
        fix="Pass the prediction, e.g. lambda x, key: model.apply(variables, x, "
        "rngs={'dropout': key}).",
    )
    return _over_keys(lambda k: f(x, k), key, num_samples, chunk_size, caller)


def sample_linen(
    model: nn.Module,
    variables: Mapping[str, Any],
    *args: Any,
    key: jax.Array,
    num_samples: int,
    train_kwargs: Mapping[str, Any] | None = None,
    rng_collection: str = "dropout",
    chunk_size: int | None = None,
    method: Callable[..., Any] | str | None = None,
    **kwargs: Any,
) -> Any:
    """``num_samples`` predictions of a Linen model with dropout on.

    Sample ``i`` is ``model.apply(variables, *args, **train_kwargs, **kwargs,
    rngs={rng_collection: fold_in(key, i)})``. Only dropout may be stochastic: if the
    train mode also updates a variable collection (``BatchNorm`` with
    ``use_running_average=not training``, for instance, updates ``batch_stats``), the
    call raises naming it, since its output would depend on the other samples of the
    batch and not only on the dropout masks.

    Args:
      model: a ``flax.linen.Module`` whose dropout is on under ``train_kwargs``; for a
        model whose mode is a config field (Flax's WMT example), the train-mode
        instance, with ``train_kwargs={}``.
      variables: its variables, e.g. ``{'params': ...}``.
      *args: positional inputs of one call, e.g. ``x: float32[batch, features]``.
      key: one PRNG key; sample ``i`` uses ``fold_in(key, i)``.
      num_samples: ``K >= 1``.
      train_kwargs: keyword arguments that turn dropout on; default
        ``{'training': True}`` as in the Flax dropout guide (``{'deterministic':
        False}`` or ``{'train': True}`` for other conventions).
      rng_collection: the PRNG stream dropout draws from.
      chunk_size: see :func:`sample`.
      method: passed to ``model.apply``.
      **kwargs: further keyword arguments of every call.

    Returns:
      The model's output with a leading axis of size ``K``, e.g. logits
      ``float32[K, batch, classes]``.

    Raises:
      DropmaskTypeError: ``model`` is not a Linen module, or ``key`` not one PRNG key.
      DropmaskValueError: the train mode updates a variable collection, or draws from
        a PRNG stream other than ``rng_collection``; ``num_samples < 1``.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from dropmask import linen as dl, uncertainty
      >>> class MLP(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x, training: bool):
      ...         x = dl.Dropout(0.5, deterministic=not training)(nn.relu(nn.Dense(16)(x)))
      ...         return nn.Dense(3)(x)
      >>> x = jnp.ones((5, 4))
      >>> variables = MLP().init(jax.random.key(0), x, training=False)
      >>> logits = uncertainty.sample_linen(
      ...     MLP(), variables, x, key=jax.random.key(1), num_samples=10)
      >>> logits.shape
      (10, 5, 3)
    """
    caller = "uncertainty.sample_linen"
    check_instance(
        model,
        nn.Module,
        caller=caller,
        name="model",
        what="a flax.linen.Module",
        fix="For an nnx.Module use uncertainty.sample_nnx(model, *args, key=..., num_samples=...).",
    )
    call = {**kwargs, **(train_kwargs if train_kwargs is not None else {"training": True})}

    def one(k: jax.Array) -> Any:
        return model.apply(variables, *args, rngs={rng_collection: k}, method=method, **call)

    try:
        return _over_keys(one, key, num_samples, chunk_size, caller)
    except flax.errors.ModifyScopeVariableError as error:
        raise user_error(
            DropmaskValueError,
            f"in the mode {call!r} the model updates a variable ({error})",
            "That layer (typically BatchNorm) would use statistics of the other samples instead "
            "of its running averages. Give it its own flag, e.g. "
            "BatchNorm(use_running_average=True) while sampling, and pass only the flag that "
            "turns dropout on.",
            caller=caller,
        ) from None
    except flax.errors.InvalidRngError as error:
        raise user_error(
            DropmaskValueError,
            f"in the mode {call!r} the model draws from a PRNG stream other than "
            f"{rng_collection!r} ({error})",
            "Only dropout may be random while sampling: switch that layer off, or pass "
            "rng_collection= if dropout draws from another stream.",
            caller=caller,
        ) from None


def _rekeyed(keys: Any, counts: Any, key: jax.Array) -> tuple[Any, Any]:
    """The PRNG streams' keys and counts for one sample: stream ``j`` (in graph order)
    gets ``fold_in(key, j)`` and a zero count, so that the layers draw distinct masks."""
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    leaves, treedef = jax.tree.flatten(keys)
    fresh = [jax.random.fold_in(key, j) for j in range(len(leaves))]
    return jax.tree.unflatten(treedef, fresh), jax.tree.map(jnp.zeros_like, counts)


def _sampling_mode(copy: nnx.Module) -> nnx.Module:
    """``copy`` in evaluation mode with only its dropout layers on."""
    for _, module in nnx.iter_modules(copy):
        on = isinstance(module, _NNX_DROPOUT) or hasattr(module, "dropout_rate")
        if hasattr(module, "deterministic"):
            setattr(module, "deterministic", not on)  # noqa: B010 - any module class
        if hasattr(module, "use_running_average"):
            setattr(module, "use_running_average", True)  # noqa: B010
    return copy


def sample_nnx(
    model: nnx.Module,
    *args: Any,
    key: jax.Array,
    num_samples: int,
    chunk_size: int | None = None,
    **kwargs: Any,
) -> Any:
    """``num_samples`` predictions of an NNX model with only its dropout layers on.

    Each sample runs on a copy of ``model``: every module in evaluation mode
    (``deterministic=True``, ``use_running_average=True``, as ``model.eval()`` sets
    them), then the dropout layers (``nnx.Dropout``, ``dropmask.nnx``'s dropout family,
    ``dropmask.nnx.MaskedRNN``'s zoneout and weight dropout, and modules with a
    ``dropout_rate`` such as ``nnx.MultiHeadAttention``) switched on. Sample ``i``
    rekeys the copy's PRNG streams from ``fold_in(key, i)`` (stream ``j`` in graph
    order: ``fold_in(fold_in(key, i), j)``). ``model``, its modes and its PRNG counters
    are unchanged afterwards.

    Args:
      model: an ``nnx.Module`` called as ``model(*args, **kwargs)``; its dropout layers
        draw from their own ``rngs`` (a layer given ``rngs`` or ``deterministic`` at
        call time by the model's code follows the model's code).
      *args: positional inputs, e.g. ``x: float32[batch, features]``.
      key: one PRNG key.
      num_samples: ``K >= 1``.
      chunk_size: see :func:`sample`.
      **kwargs: keyword arguments of every call.

    Returns:
      The model's output with a leading axis of size ``K``.

    Raises:
      DropmaskTypeError: ``model`` is not an ``nnx.Module``, or ``key`` not one key.
      DropmaskValueError: ``num_samples < 1``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import uncertainty
      >>> model = nnx.Sequential(
      ...     nnx.Linear(4, 16, rngs=nnx.Rngs(0)),
      ...     nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=1)),
      ...     nnx.Linear(16, 3, rngs=nnx.Rngs(2)))
      >>> model.eval()  # the model stays in evaluation mode
      >>> logits = uncertainty.sample_nnx(
      ...     model, jnp.ones((5, 4)), key=jax.random.key(1), num_samples=10)
      >>> logits.shape, bool(jnp.std(logits, axis=0).max() > 0)
      ((10, 5, 3), True)
    """
    caller = "uncertainty.sample_nnx"
    check_instance(
        model,
        nnx.Module,
        caller=caller,
        name="model",
        what="an nnx.Module",
        fix="For a Linen module use uncertainty.sample_linen(model, variables, *args, "
        "key=..., num_samples=...).",
    )
    graphdef, keys, counts, rest = nnx.split(model, nnx.RngKey, nnx.RngCount, ...)

    def one(k: jax.Array) -> Any:
        copy = nnx.merge(graphdef, *_rekeyed(keys, counts, k), rest)
        return _sampling_mode(copy)(*args, **kwargs)

    return _over_keys(one, key, num_samples, chunk_size, caller)
