"""Typed PRNG keys in saved states: stored as key data plus the impl's name.

``flax.serialization.to_bytes`` and every array store go through NumPy, and a typed
key (``jax.random.key(0)``) has no NumPy dtype: saving one fails with "JAX array with
PRNGKey dtype cannot be converted to a NumPy array". Its ``uint32`` key data can be
saved; the impl name (``'threefry2x32'``, ``'rbg'``, ...) is what turns the data back
into a key of the same kind, so that restored streams draw the same masks.
"""

from __future__ import annotations

from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_instance
from .._errors import DropmaskValueError, user_error

__all__ = ["from_bytes", "keys_from_data", "keys_to_data", "to_bytes"]

# Recorded for a raw ``uint32[2]`` key, which is already plain data.
RAW = "raw"


def _is_typed_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def keys_to_data(tree: Any) -> tuple[Any, list[str | None]]:
    """Replaces every typed key leaf of ``tree`` by its ``uint32`` key data.

    Args:
      tree: any pytree, e.g. a ``TrainState``.

    Returns:
      ``(data_tree, impls)``: the tree with keys as ``uint32[..., n]`` arrays, and one
      entry per leaf in ``jax.tree.leaves`` order, the impl name for a key leaf and
      ``None`` for any other leaf. Both are plain data (NumPy- and JSON-friendly).

    Example:
      >>> import jax
      >>> data, impls = keys_to_data({"key": jax.random.key(0), "w": jax.numpy.ones(2)})
      >>> data["key"].dtype, impls
      (dtype('uint32'), ['threefry2x32', None])
    """
    leaves, treedef = jax.tree.flatten(tree)
    impls = [str(jax.random.key_impl(leaf)) if _is_typed_key(leaf) else None for leaf in leaves]
    data = [jax.random.key_data(leaf) if _is_typed_key(leaf) else leaf for leaf in leaves]
    return jax.tree.unflatten(treedef, data), impls


def keys_from_data(tree: Any, impls: list[str | None]) -> Any:
    """Inverse of :func:`keys_to_data`: wraps the recorded leaves back into typed keys.

    Args:
      tree: a tree with the same structure as the one given to :func:`keys_to_data`.
      impls: the list it returned.

    Returns:
      ``tree`` with each recorded leaf turned back into a key of its recorded impl.

    Raises:
      DropmaskValueError: ``tree`` has a different number of leaves than recorded.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if len(leaves) != len(impls):
        raise user_error(
            DropmaskValueError,
            f"the saved state has {len(impls)} leaves but the target has {len(leaves)}",
            "Restore into a state built from the same model and optimizer.",
            caller=None,
        )
    out = [
        jax.random.wrap_key_data(leaf, impl=impl) if impl is not None else leaf
        for leaf, impl in zip(leaves, impls, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)


def to_bytes(state: Any) -> bytes:
    """``flax.serialization.to_bytes`` for states that hold typed PRNG keys.

    Keys are written as their key data; :func:`from_bytes` restores them to the impl
    of the target's keys. For whole runs (optimizer state, step, data position,
    config, keep-best), prefer :class:`dropmask.training.Checkpointer`.

    Args:
      state: a pytree, e.g. a ``dropmask.training.TrainState``.

    Returns:
      msgpack bytes.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> state = {"key": jax.random.key(3), "w": jnp.arange(3.0)}
      >>> back = from_bytes(state, to_bytes(state))
      >>> bool((jax.random.key_data(back["key"]) == jax.random.key_data(state["key"])).all())
      True
    """
    data, _ = keys_to_data(state)
    return flax.serialization.to_bytes(data)


def leaf_dtype(leaf: Any) -> np.dtype:
    """A leaf's dtype, for arrays and Python scalars alike."""
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.result_type(leaf)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A Flax state dict as ``{'a/b/c': leaf}``."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}/{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def from_bytes(target: Any, encoded: bytes) -> Any:
    """Restores :func:`to_bytes` output into the structure of ``target``.

    Args:
      target: a state of the same structure (e.g. a freshly created one); its key
        leaves decide the impl the saved key data is wrapped in.
      encoded: bytes from :func:`to_bytes`.

    Returns:
      A state like ``target`` holding the saved values, keys included.

    Raises:
      DropmaskTypeError: ``encoded`` is not bytes.
      DropmaskValueError: ``encoded`` is not :func:`to_bytes` output, or holds
        another structure, shape or dtype than ``target`` (the message names the leaf).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> saved = to_bytes({"key": jax.random.key(7), "w": jnp.arange(3.0)})
      >>> fresh = {"key": jax.random.key(0), "w": jnp.zeros(3)}  # the structure to fill
      >>> back = from_bytes(fresh, saved)
      >>> back["w"].tolist(), jax.random.key_data(back["key"]).tolist()
      ([0.0, 1.0, 2.0], [0, 7])
    """
    check_instance(
        encoded,
        (bytes, bytearray, memoryview),
        caller="from_bytes",
        name="encoded",
        what="bytes from dropmask.training.to_bytes",
        fix="Read the file in binary mode ('rb').",
    )
    data_target, impls = keys_to_data(target)
    try:
        saved = flax.serialization.msgpack_restore(bytes(encoded))
    except Exception:
        saved = None
    if not isinstance(saved, dict):
        raise user_error(
            DropmaskValueError,
            f"encoded must be bytes written by dropmask.training.to_bytes, got {len(encoded)} "
            "bytes that do not decode as a saved state",
            "Pass the bytes to_bytes returned, unchanged (a truncated or text-mode copy does "
            "not decode).",
            caller="from_bytes",
        )
    want = _flat(flax.serialization.to_state_dict(data_target))
    have = _flat(saved)
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        raise user_error(
            DropmaskValueError,
            f"encoded must hold target's structure, but only the saved state has {extra[:3]} and "
            f"only target has {missing[:3]}",
            "Restore into a state built from the same model and optimizer.",
            caller="from_bytes",
        )
    for path, leaf in want.items():
        shape, dtype = np.shape(leaf), leaf_dtype(leaf)
        got = have[path]
        if np.shape(got) != shape or leaf_dtype(got) != dtype:
            raise user_error(
                DropmaskValueError,
                f"encoded must hold target's shapes and dtypes, but {path} is {leaf_dtype(got)}"
                f"{np.shape(got)} there and {dtype}{shape} in target",
                "Restore into a state built from the same config.",
                caller="from_bytes",
            )
    data = flax.serialization.from_state_dict(data_target, saved)
    return keys_from_data(data, impls)
