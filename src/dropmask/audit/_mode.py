"""How a model is put in training or evaluation, so that every fix names the user's own flag.

Flax models pick their mode in one of three ways: a call keyword (``training=`` or
``train=`` as in Flax's guides, ``deterministic=`` as in its layers), a config field
(Flax's WMT ``Transformer(config.replace(deterministic=True))``), or NNX's
``model.train()`` / ``model.eval()``. A :class:`Mode` phrases the fix in those terms.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import DropmaskValueError, user_error

__all__ = ["Mode", "from_call", "from_models", "from_signature", "nnx_mode", "unknown"]

# Call keywords that select the mode, with the value that selects training.
_KEYWORDS: dict[str, bool] = {"training": True, "train": True, "deterministic": False}


@dataclasses.dataclass(frozen=True)
class Mode:
    """The switch between training and evaluation, as the model spells it.

    Attributes:
      kind: ``'keyword'``, ``'config'``, ``'nnx'`` or ``'unknown'``.
      name: the keyword (``'training'``) or the config field's path
        (``'config.deterministic'``); ``''`` when unknown.
      train: the value that selects training (``True`` for ``training``).
      eval: the value that selects evaluation.
    """

    kind: str
    name: str = ""
    train: Any = None
    eval: Any = None
    advice: str = ""

    def wiring(self) -> str:
        """How a dropout layer follows the mode: the argument to build it with."""
        return self._wiring() + (f"; {self.advice}" if self.advice else "")

    def _wiring(self) -> str:
        if self.kind == "keyword" and self.train is False:
            return f"deterministic={self.name} (the model's own {self.name} argument)"
        if self.kind == "keyword":
            return f"deterministic=not {self.name}"
        if self.kind == "config" and self.name:
            flip = "" if self.train is False else "not "
            return f"deterministic={flip}self.{self.name}"
        if self.kind == "config":
            return "deterministic taken from the config field that eval_model changes"
        if self.kind == "nnx":
            return (
                "its deterministic attribute left to model.train() / model.eval() (a "
                "custom layer reads self.deterministic instead of fixing it)"
            )
        return "deterministic derived from the flag that selects training"

    def evaluation(self) -> str:
        """How the audit selected evaluation, e.g. ``'called with training=False'``."""
        if self.kind == "keyword":
            return f"called with {self.name}={self.eval!r}"
        if self.kind == "config":
            field = f" ({self.name}={self.eval!r})" if self.name and not self.advice else ""
            return f"applied as eval_model{field}"
        if self.kind == "nnx":
            return "after model.eval()"
        return "in evaluation"

    def training(self) -> str:
        """How the model is put in training, e.g. ``'with training=True'``."""
        if self.kind == "keyword":
            return f"with {self.name}={self.train!r}"
        if self.kind == "config":
            field = f" with {self.name}={self.train!r}" if self.name else ""
            return f"built{field}"
        if self.kind == "nnx":
            return "after model.train()"
        return "in training"


def unknown() -> Mode:
    """A mode the audit could not see: fixes speak of 'the training flag'."""
    return Mode("unknown")


def nnx_mode() -> Mode:
    """NNX's ``model.train()`` / ``model.eval()``."""
    return Mode("nnx")


def from_call(kwargs: Mapping[str, Any], model: Any) -> Mode:
    """The mode of a call with ``kwargs``: a mode keyword, else a config field, else unknown."""
    for name, train in _KEYWORDS.items():
        if name in kwargs:
            return Mode("keyword", name, train, not train)
    path = _flag_path(model)
    if path is not None:
        return Mode("config", path, False, True)
    return unknown()


def _flag_path(model: Any) -> str | None:
    """``'deterministic'`` or ``'config.deterministic'`` when the module has that field."""
    if isinstance(getattr(model, "deterministic", None), bool):
        return "deterministic"
    config = getattr(model, "config", None)
    if isinstance(getattr(config, "deterministic", None), bool):
        return "config.deterministic"
    return None


def from_models(model: Any, eval_model: Any) -> Mode:
    """The field whose value differs between the train and the eval module."""
    for path, (a, b) in _differing(model, eval_model, "", depth=2):
        if isinstance(a, bool) and isinstance(b, bool):
            return Mode("config", path, a, b)
    path = _flag_path(model)
    if path is None:
        return Mode("config")
    train = _get(model, path)
    advice = (
        f"eval_model has the train model's {path}={train!r}: build it with {path}={not train!r}"
    )
    return Mode("config", path, train, not train, advice)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _differing(a: Any, b: Any, prefix: str, depth: int) -> list[tuple[str, tuple[Any, Any]]]:
    if not dataclasses.is_dataclass(a) or type(a) is not type(b) or depth == 0:
        return []
    out = []
    for field in dataclasses.fields(a):
        if field.name in ("parent", "name"):
            continue
        x, y = getattr(a, field.name, None), getattr(b, field.name, None)
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(x):
            out.extend(_differing(x, y, path + ".", depth - 1))
        elif isinstance(x, bool) and x is not y:
            out.append((path, (x, y)))
    return out


def from_signature(
    fn: Callable[..., Any], caller: str
) -> tuple[dict[str, Any], dict[str, Any], Mode]:
    """Train and eval keyword arguments for a call whose signature has a mode keyword.

    Raises:
      DropmaskValueError: the signature has none of ``training``, ``train``,
        ``deterministic``.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    for name, train in _KEYWORDS.items():
        if name in params:
            return {name: train}, {name: not train}, Mode("keyword", name, train, not train)
    shown = ", ".join(params) or "..."
    raise user_error(
        DropmaskValueError,
        f"the model's call must take a training, train or deterministic argument, got ({shown})",
        "Pass train_kwargs=... and eval_kwargs=... naming its mode argument, or eval_model=... "
        "when a config field selects the mode.",
        caller=caller,
    )
