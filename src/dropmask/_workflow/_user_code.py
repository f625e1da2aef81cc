"""A user's :class:`Example`, checked where ``dropmask train`` and ``dropmask audit`` run it.

A mistake in an example is the user's to fix, in the user's file: it must read as one
line naming that file and line and the fix, never as a traceback from dropmask's
internals. :func:`checked` returns the example with

* its plain fields checked now (``name``, ``eval_splits``, ``best_mode``, ...), each
  error naming the line that defines ``example``;
* each hook wrapped: what it returns is checked against what the loop needs (a
  ``ConfigDict`` from ``get_config``, a mapping of arrays from ``train_batch``, a
  ``(state, metrics)`` pair from ``train_step``, ...), a wrong type being a
  :class:`DropmaskTypeError` naming the hook's definition, file and line; and an
  exception escaping it becomes an :class:`ExampleCodeError` whose cause is the
  original, traceback intact, with the line of the user's code that raised.

Errors dropmask raises on the user's input (``DropmaskError``) pass through unchanged:
they are one line already.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import pathlib
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
import numpy as np

from .._errors import DropmaskError, DropmaskTypeError, user_error
from ._example import Example
from ._locate import is_library, locate

__all__ = [
    "ExampleCodeError",
    "checked",
    "definition",
    "load_checked",
    "report",
    "report_exception",
]


class ExampleCodeError(DropmaskError):
    """An exception raised while dropmask ran one of an example's hooks.

    The original exception is ``__cause__`` (its traceback intact).

    Attributes:
      hook: the ``Example`` field that raised, e.g. ``'evaluate'``.
      frame: ``(file, line)`` of the deepest frame in the user's own files, or None
        when the traceback passes through none.
      users: whether the example is the user's (not one that ships with dropmask).
    """

    def __init__(
        self, message: str, *, hook: str, frame: tuple[str, int] | None, users: bool
    ) -> None:
        super().__init__(message)
        self.hook = hook
        self.frame = frame
        self.users = users


def definition(fn: Any) -> str | None:
    """``file:line`` where the function behind ``fn`` is defined, if it has one.

    Sees through ``jax.jit`` and ``functools.wraps`` (``__wrapped__``), bound methods
    and ``functools.partial``.
    """
    seen = 0
    while seen < 16:
        seen += 1
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            break
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    return f"{code.co_filename}:{code.co_firstlineno}"


def _is_users(filename: str, roots: tuple[pathlib.Path, ...]) -> bool:
    if is_library(filename):
        return False
    path = pathlib.Path(filename).resolve()
    return any(path.is_relative_to(root) for root in roots)


def _user_frame(error: BaseException, roots: tuple[pathlib.Path, ...]) -> tuple[str, int] | None:
    """The deepest frame of ``error``'s traceback in the user's files."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if _is_users(frame.filename, roots):
            return frame.filename, frame.lineno or 0
    return None


def _got(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {sorted(map(str, value))[:6]}"
    return f"{type(value).__name__} {value!r}"[:120]


def _is_config(value: Any) -> bool:
    return isinstance(value, ml_collections.ConfigDict)


def _is_state(value: Any) -> bool:
    return value is not None and not isinstance(value, tuple | list | Mapping)


def _is_batch(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) > 0


def _is_step_result(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[1], Mapping)
        and "loss" in value[1]
    )


def _is_metrics(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and np.ndim(v) == 0 for k, v in value.items()
    )


def _is_pair(value: Any) -> bool:
    return isinstance(value, tuple | list) and len(value) == 2


def _is_inputs(value: Any) -> bool:
    return isinstance(value, tuple | list)


_CONFIG = (
    _is_config,
    "an ml_collections.ConfigDict",
    "Build it on dropmask.training.base_config(): config = base_config(); config.NAME = ...; "
    "return config",
)
# field -> (check, what it must return, the fix).
_RETURNS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "get_config": _CONFIG,
    "get_tiny_config": _CONFIG,
    "create_state": (
        _is_state,
        "the train state",
        "Return TrainState.create(apply_fn=model.apply, params=params, tx=tx, key=dropout_key)",
    ),
    "train_batch": (
        _is_batch,
        "a non-empty mapping of name to array[batch, ...]",
        "Return e.g. {'x': images, 'y': labels}",
    ),
    "train_step": (
        _is_step_result,
        "a pair (new_state, metrics) whose metrics mapping holds 'loss'",
        "Return e.g. (state.apply_gradients(grads=grads), {'loss': loss})",
    ),
    "evaluate": (
        _is_metrics,
        "a mapping of metric name to a number",
        "Return e.g. {'loss': float(loss), 'accuracy': float(accuracy)}",
    ),
    "data_position": (
        lambda v: isinstance(v, Mapping),
        "a dict",
        "Return e.g. {'epoch': epoch, 'batch': index}",
    ),
    "predict": (
        _is_pair,
        "a pair (logits, labels)",
        "Return e.g. (logits, labels), or use dropmask.training.ClassifierEval(...).predict",
    ),
    "model_inputs": (
        _is_inputs,
        "a tuple of the model's positional inputs",
        "Return e.g. (batch['x'],)",
    ),
    "eval_model": (lambda v: v is not None, "a module", "Return e.g. model.clone(...)"),
    "sample": (
        lambda v: isinstance(v, str),
        "the prompt and its continuation (a str)",
        "Return e.g. prompt + bytes(new).decode('utf-8', errors='replace')",
    ),
}
_REQUIRED = ("get_config", "load_data", "create_state", "train_batch", "train_step", "evaluate")


class _Hook:
    """One hook of the example: calls it, checks its result, attributes its exceptions.

    ``field`` is the ``Example`` field whose result check applies; ``name`` is how
    messages call the hook after ``example.`` (default: ``field``).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        field: str,
        roots: tuple[pathlib.Path, ...],
        name: str | None = None,
    ):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._field = field
        self._roots = roots
        self._name = name or field

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            out = self._fn(*args, **kwargs)
        except DropmaskError:
            raise
        except Exception as error:
            frame = _user_frame(error, self._roots)
            at = f" at {frame[0]}:{frame[1]}, in your code" if frame else ""
            text = str(error).splitlines()[0] if str(error) else ""
            raise ExampleCodeError(
                f"the example's {self._name} raised {type(error).__name__}{at}: {text}",
                hook=self._field,
                frame=frame,
                users=bool(self._roots),
            ) from error
        check = _RETURNS.get(self._field)
        if check is not None and not check[0](out):
            where = definition(self._fn)
            raise user_error(
                DropmaskTypeError,
                f"{where + ': ' if where else ''}example.{self._name} must return {check[1]}, "
                f"got {_got(out)}",
                f"{check[2]}.",
                caller=None,
            )
        return out


def _example_line(file: str | None) -> str:
    """``file:line`` of the line that assigns ``example`` in ``file`` (or the file)."""
    if file is None:
        return "the example"
    try:
        text = pathlib.Path(file).read_text()
    except OSError:
        return file
    for number, line in enumerate(text.splitlines(), start=1):
        if re.match(r"example\s*(:[^=]*)?=", line):
            return f"{file}:{number}"
    return file


def _check_fields(example: Example, where: str) -> None:
    """The plain fields, and that every hook is callable; raises naming ``where``."""

    def fail(name: str, expected: str, value: Any, fix: str) -> None:
        raise user_error(
            DropmaskTypeError,
            f"Example {name} must be {expected}, got {_got(value)}",
            f"{fix}.",
            caller=where,
        )

    if not isinstance(example.name, str) or not example.name:
        fail("name", "a non-empty str", example.name, "Pass e.g. name='mine'")
    splits = example.eval_splits
    if (
        not isinstance(splits, tuple | list)
        or not splits
        or not all(isinstance(s, str) for s in splits)
    ):
        fail("eval_splits", "a tuple of split names", splits, "Pass e.g. eval_splits=('eval',)")
    if not isinstance(example.best_metric, str):
        fail("best_metric", "a metric name (str)", example.best_metric, "Pass e.g. 'accuracy'")
    if example.best_mode not in ("max", "min"):
        fail("best_mode", "'max' or 'min'", example.best_mode, "Pass best_mode='max' or 'min'")
    for name in ("train_kwargs", "eval_kwargs"):
        value = getattr(example, name)
        if not isinstance(value, Mapping):
            fail(name, "a mapping of keyword to value", value, f"Pass e.g. {name}={{}}")
    configs = example.configs
    if not isinstance(configs, Mapping) or not all(
        isinstance(k, str) and k and callable(v) for k, v in configs.items()
    ):
        fail(
            "configs",
            "a mapping of config name to a function returning a ConfigDict",
            configs,
            "Pass e.g. configs={'long': configs.get_long_config}",
        )
    for field in dataclasses.fields(example):
        value = getattr(example, field.name)
        if field.name in _RETURNS or field.name in _REQUIRED:
            if value is None and field.name not in _REQUIRED:
                continue
            if not callable(value):
                fail(field.name, "a function", value, f"Pass the function itself as {field.name}=")


def checked(example: Any, where: str, file: str | None = None) -> Example:
    """``example`` with its fields checked and its hooks wrapped (see the module docstring).

    Args:
      example: what the target named; must be an :class:`Example`.
      where: the target as :func:`~dropmask._workflow.locate` found it.
      file: the file that defines ``example``; the user's code is what lives in its
        directory (none when it is dropmask's own).

    Raises:
      DropmaskTypeError: not an ``Example``, or a field of the wrong type.
    """
    if not isinstance(example, Example):
        raise user_error(
            DropmaskTypeError,
            f"{where} must be a dropmask.training.Example, got {type(example).__name__}",
            "Define example = Example(name=..., ...).",
            caller=None,
        )
    _check_fields(example, _example_line(file))
    roots: tuple[pathlib.Path, ...] = ()
    if file is not None and not is_library(file):
        roots = (pathlib.Path(file).resolve().parent,)
    hooks: dict[str, Any] = {
        field.name: _Hook(getattr(example, field.name), field.name, roots)
        for field in dataclasses.fields(example)
        if (field.name in _RETURNS or field.name == "load_data")
        and getattr(example, field.name) is not None
    }
    # A named config is a get_config: its result is checked the same way, and its
    # messages name the function called for it.
    hooks["configs"] = {
        name: _Hook(fn, "get_config", roots, _config_name(name, fn))
        for name, fn in example.configs.items()
    }
    return dataclasses.replace(example, **hooks)


def _config_name(name: str, fn: Any) -> str:
    """How messages call the named config ``name``: ``configs['long']``, and the
    function behind it (``get_long_config``) when it has a name."""
    function = getattr(inspect.unwrap(fn), "__name__", "<")
    return f"configs[{name!r}]" + ("" if function.startswith("<") else f" ({function})")


def report(command: str, error: ExampleCodeError) -> None:
    """Prints the original traceback, then one line saying whose code raised.

    For an example that ships with dropmask, the line asks for a report instead: the
    error is dropmask's.
    """
    cause = error.__cause__
    if cause is not None:
        traceback.print_exception(cause)
    if not error.users:
        print(
            f"{command}: internal error: {error}. This is a bug in dropmask, not in your "
            "command: please report it with the command and the traceback above.",
            file=sys.stderr,
        )
        return
    print(
        f"{command}: error: {str(error).rstrip('.')} (its traceback is above). Fix it there.",
        file=sys.stderr,
    )


def load_checked(target: str) -> Example:
    """The :class:`Example` that ``target`` names (as ``load_example`` finds it), checked.

    Raises:
      DropmaskValueError: nothing matches, or the import failed.
      DropmaskTypeError: it is not an ``Example``, or a field has the wrong type.
    """
    found = locate(target)
    return checked(found.value, found.where, found.file)


def report_exception(command: str, error: BaseException) -> None:
    """An unexpected exception of a command: its traceback, then one line saying whose.

    Raised in a frame of the user's (outside dropmask, the standard library and
    installed packages, e.g. in their model's ``__call__``), it is theirs to fix;
    otherwise it is a bug in dropmask, to report.
    """
    traceback.print_exception(error)
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if not is_library(f.filename)]
    if not mine:
        print(
            f"{command}: internal error: this is a bug in dropmask, not in your command. "
            "Please report it with the command and the traceback above.",
            file=sys.stderr,
        )
        return
    text = str(error).splitlines()[0] if str(error) else ""
    print(
        f"{command}: error: {type(error).__name__} raised at {mine[-1].filename}:"
        f"{mine[-1].lineno}, in your code: {text.rstrip('.')} (its traceback is above). "
        "Fix it there.",
        file=sys.stderr,
    )
