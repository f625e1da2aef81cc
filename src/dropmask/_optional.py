"""The one place optional dependencies are loaded, and the extra that installs each.

The library needs only JAX, Flax, Optax, orbax and ml_collections. The training
workflow and the examples need more; each is imported here, when first used, so a
missing one is one line naming the ``pip install`` that brings it.
"""

from __future__ import annotations

import importlib
import types

from ._errors import DropmaskError, user_error

__all__ = ["EXTRAS", "extra_for", "require"]

# Top-level module -> the extra of pyproject.toml that installs it.
EXTRAS: dict[str, str] = {
    "tqdm": "train",
    "tensorboardX": "train",
    "matplotlib": "train",
    "sklearn": "train",
    "sentencepiece": "examples",
    "sacrebleu": "examples",
}


def extra_for(module: str) -> str:
    """The extra that installs ``module`` (``'train'`` when it is not listed)."""
    return EXTRAS.get(module.partition(".")[0], "train")


def require(module: str, *, caller: str = "dropmask") -> types.ModuleType:
    """Imports the optional dependency ``module``, or says how to install it.

    Args:
      module: a module name, e.g. ``'matplotlib.figure'``.
      caller: the caller's name, for the message.

    Raises:
      DropmaskError: ``module`` is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.partition(".")[0]
        raise user_error(
            DropmaskError,
            f"needs the package {top!r}, which is not installed",
            f"Install it with pip install 'dropmask[{extra_for(top)}]'.",
            caller=caller,
        ) from None
