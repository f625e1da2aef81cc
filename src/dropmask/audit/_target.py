"""What an example hands to ``dropmask audit``: one dataclass, one function to run it."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import DropmaskTypeError, DropmaskValueError
from ._linen import audit_model, audit_step
from ._report import AuditReport

__all__ = ["AuditTarget", "audit_target", "load_target"]


@dataclasses.dataclass(frozen=True)
class AuditTarget:
    """Everything needed to audit a Linen model and its train step.

    An example exposes ``audit_target() -> AuditTarget`` in ``examples/<name>/audit.py``.

    Attributes:
      model: the ``flax.linen.Module``.
      variables: its variables (``{'params': ...}``).
      args: positional inputs of one call, e.g. ``(images,)``.
      train_kwargs: keyword arguments selecting training, e.g. ``{'training': True}``;
        None: as :func:`audit_model` infers them (none with ``eval_model``, else the
        model's ``training``, ``train`` or ``deterministic`` parameter).
      eval_kwargs: keyword arguments selecting evaluation; None: inferred likewise.
      train_step: ``(state, batch) -> state | (state, ...)``; None skips the step audit.
      state: the train state the step starts from.
      batches: at least two batches for the step audit.
      eval_model: the module applied in evaluation when a config field, not a call
        argument, selects the mode (e.g. ``config.replace(deterministic=True)``);
        None: ``model`` with ``eval_kwargs``.
    """

    model: Any
    variables: Mapping[str, Any]
    args: tuple[Any, ...]
    train_kwargs: Mapping[str, Any] | None = None
    eval_kwargs: Mapping[str, Any] | None = None
    train_step: Callable[..., Any] | None = None
    state: Any = None
    batches: Sequence[Any] = ()
    eval_model: Any = None


def audit_target(target: AuditTarget) -> AuditReport:
    """:func:`audit_model` on the model, then :func:`audit_step` on the step if given.

    Raises:
      DropmaskTypeError: ``target`` is not an :class:`AuditTarget`.
    """
    if not isinstance(target, AuditTarget):
        raise DropmaskTypeError(
            f"expected a dropmask.audit.AuditTarget, got {type(target).__name__}. An "
            "example's audit hook must return AuditTarget(model=..., variables=..., args=...)."
        )
    report = audit_model(
        target.model,
        target.variables,
        *target.args,
        train_kwargs=target.train_kwargs,
        eval_kwargs=target.eval_kwargs,
        eval_model=target.eval_model,
    )
    if target.train_step is not None:
        report = report.merged(audit_step(target.train_step, target.state, target.batches))
    return report


def load_target(example: str) -> AuditTarget:
    """Calls ``audit_target()`` of an example's hook module.

    Args:
      example: a bundled example's name (``'digits'`` imports ``examples.digits.audit``
        from the current directory), a dotted module name, or a path to a ``.py`` file.

    Raises:
      DropmaskValueError: the hook cannot be found or has no ``audit_target``.
    """
    path = pathlib.Path(example)
    if example.endswith(".py"):
        if not path.is_file():
            raise DropmaskValueError(f"no audit hook file at {example!r}.")
        spec = importlib.util.spec_from_file_location("_dropmask_audit_hook", path)
        if spec is None or spec.loader is None:
            raise DropmaskValueError(f"cannot import {example!r} as a Python module.")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        name = example if "." in example else f"examples.{example}.audit"
        if "" not in sys.path and str(pathlib.Path.cwd()) not in sys.path:
            sys.path.insert(0, str(pathlib.Path.cwd()))
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            raise DropmaskValueError(
                f"no audit hook {name!r} for example {example!r} ({err}). Run from the "
                "repository root, or pass the hook file's path, e.g. examples/digits/audit.py."
            ) from err
    hook = getattr(module, "audit_target", None)
    if not callable(hook):
        raise DropmaskValueError(
            f"{module.__name__} has no audit_target() function returning an AuditTarget."
        )
    target = hook()
    if not isinstance(target, AuditTarget):
        raise DropmaskTypeError(
            f"{module.__name__}.audit_target() returned {type(target).__name__}; it must "
            "return a dropmask.audit.AuditTarget(model=..., variables=..., args=...)."
        )
    return target
