"""The one way ``dropmask train`` and ``dropmask audit`` find what they run.

A target is, in the order tried:

1. the name of a bundled example: ``digits`` and its Flax NNX twin ``digits_nnx``
   ship with the package (``dropmask.examples``); ``sst2``, ``seq2seq``,
   ``translate`` and ``lm`` live in a dropmask source checkout's ``examples/`` and
   are found there when dropmask is installed from that checkout in editable mode
   (``pip install -e``), or when the current directory is in the checkout;
2. a path: a directory whose ``train.py`` defines ``example``, or a ``.py`` file
   that defines it. A directory is imported as a package under a private name, so
   its modules import each other relatively (``from . import models``) and never
   collide with the user's other modules;
3. ``package.module:attribute``, imported from ``sys.path`` (the current
   directory is tried last), e.g. ``my_project.train:example``.

Nothing is put in front of ``sys.path``: a user's own ``examples/`` folder, or any
other package of that name, stays what it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shlex
import sys
import traceback
import types
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import DropmaskTypeError, DropmaskValueError, user_error
from .._optional import EXTRAS, extra_for
from ._example import Example

__all__ = [
    "Located",
    "add_target_arguments",
    "available",
    "checkout_examples",
    "is_library",
    "listing",
    "load_example",
    "locate",
]

# name -> (where it lives, what it trains). The digits examples are modules of the package;
# the others are directories of a source checkout's examples/.
_BUNDLED = {
    "digits": "dropmask.examples.digits.train",
    "digits_nnx": "dropmask.examples.digits_nnx.train",
}
_SUMMARIES = {
    "digits": "an MLP on scikit-learn's 8x8 digits (the Flax dropout guide's workflow)",
    "digits_nnx": "the digits MLP written in Flax NNX (NnxTrainState, the same loop)",
    "sst2": "a bidirectional LSTM sentence classifier with word dropout",
    "seq2seq": "an LSTM encoder-decoder that learns addition",
    "translate": "a Transformer on generated English-German pairs",
    "lm": "a Flax NNX byte-level Transformer language model",
}
# Config entries that an example's line of --list states, read from its default and
# named configs where the example is found, so that the line says what they use.
_STATED = {"lm": ("context",)}
_CHECKOUT_ONLY = ("sst2", "seq2seq", "translate", "lm")


@dataclasses.dataclass(frozen=True)
class Located:
    """What a target resolved to.

    Attributes:
      value: the object found (e.g. a :class:`dropmask.training.Example`).
      where: where it was found, for messages: a module attribute or a file.
      file: the source file of the module it was found in, when it has one.
    """

    value: Any
    where: str
    file: str | None = None


def checkout_examples() -> pathlib.Path | None:
    """``examples/`` of the dropmask source checkout in use, if any.

    That is the checkout dropmask is installed from in editable mode (its
    ``direct_url.json``, PEP 610), else the current directory or the nearest directory
    above it that is a dropmask checkout. A wheel installed outside a checkout has none.
    """
    cwd = pathlib.Path.cwd()
    for root in (*_editable_source(), cwd, *cwd.parents):
        if _is_checkout(root):
            return root / "examples"
    return None


def _editable_source() -> tuple[pathlib.Path, ...]:
    """The directory dropmask is installed from with ``pip install -e``, if it is."""
    try:
        record = json.loads(_direct_url() or "{}")
    except json.JSONDecodeError:
        return ()
    if not isinstance(record, dict) or not record.get("dir_info", {}).get("editable", False):
        return ()
    url = urllib.parse.urlparse(str(record.get("url", "")))
    if url.scheme != "file":
        return ()
    return (pathlib.Path(urllib.request.url2pathname(url.path)),)


def _direct_url() -> str | None:
    """dropmask's installation record (PEP 610's ``direct_url.json``), if it has one."""
    try:
        return importlib.metadata.distribution("dropmask").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None


def _is_checkout(root: pathlib.Path) -> bool:
    """Whether ``root`` is a dropmask source checkout with its examples."""
    return (
        (root / "pyproject.toml").is_file()
        and (root / "src" / "dropmask" / "__init__.py").is_file()
        and (root / "examples").is_dir()
    )


def available() -> list[tuple[str, str, str]]:
    """``(name, where, summary)`` of each example a name can run, bundled first.

    ``where`` is a module for bundled examples, a directory for those of this
    source checkout, and says "source checkout only" for those not found here.
    """
    rows = [(name, module, _SUMMARIES[name]) for name, module in _BUNDLED.items()]
    examples = checkout_examples()
    found = set()
    if examples is not None:
        for train in sorted(examples.glob("*/train.py")):
            name = train.parent.name
            if name not in _BUNDLED:
                found.add(name)
                summary = _SUMMARIES.get(name, "") + _stated(name, train.parent)
                rows.append((name, str(train.parent), summary))
    for name in _CHECKOUT_ONLY:
        if name not in found:
            rows.append((name, "source checkout only: examples/" + name, _SUMMARIES[name]))
    return rows


def _stated(name: str, directory: pathlib.Path) -> str:
    """`` (context 128; --config long: context 1024)``: the entries of ``_STATED[name]``
    in the example's default config, and in each named config that changes them; empty
    when there are none, or when the example cannot be imported or its configs built
    (``train`` says why when it is run)."""
    entries = _STATED.get(name, ())
    if not entries:
        return ""
    try:
        example = getattr(_import_directory(directory, name), "example", None)
        if not isinstance(example, Example):
            return ""
        default = example.get_config()
        parts = [", ".join(f"{entry} {default[entry]}" for entry in entries)]
        for config_name, get_config in example.configs.items():
            config = get_config()
            changed = [entry for entry in entries if config[entry] != default[entry]]
            if changed:
                values = ", ".join(f"{entry} {config[entry]}" for entry in changed)
                parts.append(f"--config {config_name}: {values}")
    except Exception:
        return ""
    return f" ({'; '.join(parts)})"


def listing() -> str:
    """:func:`available` as the table that ``--list`` prints."""
    rows = available()
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{name:<{width}}  {where}\n{'':<{width}}  {summary}" for name, where, summary in rows]
    lines.append(
        "Or give a directory whose train.py defines `example`, a .py file defining it, "
        "or package.module:attribute."
    )
    return "\n".join(lines)


def add_target_arguments(parser: argparse.ArgumentParser, dest: str) -> None:
    """Adds the optional ``TARGET`` (stored as ``dest``) and ``--list`` to ``parser``.

    Every command that runs an example takes its target and lists the examples with
    the same words, so that what ``--help`` says matches what :func:`locate` accepts.
    """
    parser.add_argument(
        dest,
        metavar="TARGET",
        nargs="?",
        help="a bundled example (e.g. digits), a directory whose train.py defines `example`, "
        "a .py file, or package.module:attribute",
    )
    parser.add_argument("--list", action="store_true", help="list the examples and where each is")


def locate(target: str, attributes: Sequence[str] = ("example",)) -> Located:
    """Resolves ``target`` (see the module docstring) to the object it names.

    Args:
      target: a bundled example's name, a path to a directory or ``.py`` file, or
        ``package.module:attribute``.
      attributes: the names looked up, in order, in the module a name or a path
        leads to (a directory's ``train.py``).

    Returns:
      A :class:`Located`.

    Raises:
      DropmaskValueError: nothing matches, or importing the target failed; the
        message names what was tried (and the failing line of an import).
    """
    if not isinstance(target, str) or not target.strip():
        raise user_error(
            DropmaskValueError,
            f"TARGET must be a non-empty string, got {target!r}",
            "Give an example's name (see --list), a directory, a .py file or "
            "package.module:attribute.",
            caller=None,
        )
    path = pathlib.Path(target).expanduser()
    if target in _BUNDLED:
        module = _import(target, lambda: importlib.import_module(_BUNDLED[target]))
        return _pick(module, attributes, target)
    examples = checkout_examples()
    if os.sep not in target and "/" not in target and ":" not in target and "." not in target:
        if examples is not None and (examples / target / "train.py").is_file():
            return _pick(_import_directory(examples / target, target), attributes, target)
        if not path.exists():
            raise user_error(
                DropmaskValueError,
                _unknown(target),
                caller=None,
            )
    if path.is_dir():
        if not (path / "train.py").is_file():
            raise user_error(
                DropmaskValueError,
                f"{target!r} is a directory without a train.py",
                "A target directory's train.py must define `example = "
                "dropmask.training.Example(...)`.",
                caller=None,
            )
        return _pick(_import_directory(path, target), attributes, target)
    if path.suffix == ".py":
        if not path.is_file():
            raise user_error(
                DropmaskValueError,
                f"no file {str(path.resolve())!r} ({target!r})",
                caller=None,
            )
        return _pick(_import_file(path, target), attributes, target)
    if ":" in target or re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", target):
        return _import_attribute(target, attributes)
    raise user_error(
        DropmaskValueError,
        _unknown(target),
        caller=None,
    )


def load_example(target: str) -> Any:
    """The :class:`dropmask.training.Example` that ``target`` names (see :func:`locate`).

    Raises:
      DropmaskValueError: nothing matches, or the import failed.
      DropmaskTypeError: the object found is not an ``Example``.
    """
    found = locate(target)
    if not isinstance(found.value, Example):
        raise user_error(
            DropmaskTypeError,
            f"{found.where} must be a dropmask.training.Example, got {type(found.value).__name__}",
            "Define example = Example(name=..., ...).",
            caller=None,
        )
    return found.value


def _unknown(target: str) -> str:
    names = ", ".join(name for name, where, _ in available() if "only" not in where)
    if target in _CHECKOUT_ONLY:
        return (
            f"example {target!r} lives in the dropmask source checkout (examples/{target}/), "
            "not in the installed package. Clone the repository and give its directory, "
            f"e.g. path/to/dropmask/examples/{target}"
        )
    return (
        f"no example {target!r}: it is not a bundled example ({names}), not a path to a "
        "directory or .py file, and not package.module:attribute. See --list"
    )


def _private_name(path: pathlib.Path) -> str:
    """A module name that no user module has: one per resolved path."""
    stem = re.sub(r"\W", "_", path.stem) or "target"
    return f"_dropmask_target_{stem}_{zlib.crc32(str(path).encode()):08x}"


_PACKAGE = pathlib.Path(__file__).resolve().parents[1]  # the dropmask package


def is_library(filename: str) -> bool:
    """Import machinery, installed packages or dropmask itself: not the user's line."""
    if filename.startswith("<") or "site-packages" in filename or "dist-packages" in filename:
        return True
    path = pathlib.Path(filename).resolve()
    return path.is_relative_to(_PACKAGE) or path.is_relative_to(pathlib.Path(os.__file__).parent)


def _location(error: BaseException) -> str:
    """`` at FILE:LINE`` of the user's line that failed: a syntax error's own position,
    else the deepest frame of the traceback outside the import machinery and libraries."""
    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if not is_library(f.filename)]
    frame = (mine or [f for f in frames if not f.filename.startswith("<")] or frames or [None])[-1]
    return f" at {frame.filename}:{frame.lineno}" if frame is not None else ""


def _failure(target: str, error: BaseException) -> DropmaskValueError:
    """One line naming the target, the failing line of its import, and the error."""
    line = _location(error)
    missing = getattr(error, "name", None) if isinstance(error, ImportError) else None
    path = pathlib.Path(target)
    if isinstance(error, SyntaxError):
        detail = f"{error.msg} ({(error.text or '').strip()!r})" if error.text else error.msg
        return DropmaskValueError(
            f"importing {target!r} failed{line}: SyntaxError: {detail}. Fix the syntax there"
        )
    if isinstance(error, ImportError) and "relative import" in str(error) and path.suffix == ".py":
        return DropmaskValueError(
            f"importing {target!r} failed{line}: {error}. A file whose imports are relative "
            f"(from . import ...) is part of a package: pass its directory instead, e.g. "
            f"dropmask train {shlex.quote(str(path.parent) or '.')}"
        )
    fix = (
        f"Install it: pip install 'dropmask[{extra_for(missing)}]'"
        if missing in EXTRAS
        else "Fix that module, or install what it needs"
    )
    return DropmaskValueError(
        f"importing {target!r} failed{line}: {type(error).__name__}: {error}. {fix}"
    )


def _import(target: str, load: Callable[[], types.ModuleType]) -> types.ModuleType:
    """Runs ``load()``; any failure becomes one line naming the target and the line.

    ``sys.exit`` at import (a script that trains when run) is a failure too: importing
    a target must only define it.
    """
    try:
        return load()
    except DropmaskValueError:
        raise
    except SystemExit as error:
        raise user_error(
            DropmaskValueError,
            f"importing {target!r} called sys.exit({error.code!r}){_location(error)}: a "
            "target must define `example` when imported, not run. Put what runs under "
            "if __name__ == '__main__':",
            caller=None,
        ) from None
    except Exception as error:
        raise _failure(target, error) from error


def _import_directory(directory: pathlib.Path, target: str) -> types.ModuleType:
    """``directory/train.py`` as a submodule of a privately named package."""
    directory = directory.resolve()
    package = _private_name(directory)

    def load() -> types.ModuleType:
        if package not in sys.modules:
            init = directory / "__init__.py"
            if init.is_file():
                spec = importlib.util.spec_from_file_location(
                    package, init, submodule_search_locations=[str(directory)]
                )
            else:
                spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
                spec.submodule_search_locations = [str(directory)]
            if spec is None:
                raise user_error(
                    DropmaskValueError,
                    f"cannot import {str(init)!r} as a Python module",
                    caller=None,
                )
            module = importlib.util.module_from_spec(spec)
            sys.modules[package] = module
            try:
                if spec.loader is not None:
                    spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[package]
                raise
        return importlib.import_module(f"{package}.train")

    return _import(target, load)


def _import_file(path: pathlib.Path, target: str) -> types.ModuleType:
    """A ``.py`` file as a privately named module."""
    path = path.resolve()
    name = _private_name(path)

    def load() -> types.ModuleType:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise user_error(
                DropmaskValueError,
                f"cannot import {str(path)!r} as a Python module",
                caller=None,
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module

    return _import(target, load)


def _import_attribute(target: str, attributes: Sequence[str]) -> Located:
    """``package.module[:attribute]``, the current directory tried after ``sys.path``."""
    module_name, _, attribute = target.partition(":")
    if not module_name or (":" in target and not attribute):
        raise user_error(
            DropmaskValueError,
            f"{target!r} must be package.module:attribute, e.g. my_project.train:example",
            caller=None,
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = _import(target, lambda: importlib.import_module(module_name))
    except DropmaskValueError as failed:
        error = failed.__cause__
        if not isinstance(error, ModuleNotFoundError):
            raise
        if error.name is not None and (module_name + ".").startswith(error.name + "."):
            raise user_error(
                DropmaskValueError,
                f"no module {module_name!r} (for {target!r}) on sys.path or in {cwd}. "
                "Install the package, or run from the directory that holds it",
                caller=None,
            ) from None
        raise
    if not attribute:
        return _pick(module, attributes, target)
    return _attribute(module, module_name, attribute, target)


def _attribute(module: types.ModuleType, module_name: str, attribute: str, target: str) -> Located:
    """``module``'s (dotted) ``attribute``."""
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise user_error(
                DropmaskValueError,
                f"{module_name} has no attribute {attribute!r} ({target!r})",
                caller=None,
            )
        value = getattr(value, part)
    return Located(value, f"{module_name}:{attribute}", getattr(module, "__file__", None))


def _pick(module: types.ModuleType, attributes: Sequence[str], target: str) -> Located:
    file = getattr(module, "__file__", None)
    where = file or module.__name__
    for name in attributes:
        if hasattr(module, name):
            return Located(getattr(module, name), f"{where}:{name}", file)
    wanted = " or ".join(f"`{name}`" for name in attributes)
    raise user_error(
        DropmaskValueError,
        f"{where} (for {target!r}) defines no {wanted}",
        "Define example = dropmask.training.Example(name=..., ...) there.",
        caller=None,
    )
