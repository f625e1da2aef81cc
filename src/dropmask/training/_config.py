"""``--config.key=value`` overrides on an ``ml_collections.ConfigDict``, as in Flax's examples."""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any

import ml_collections

from .._errors import DropmaskValueError

__all__ = ["apply_overrides", "parse_overrides"]

PREFIX = "--config."


def parse_overrides(args: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs ``--config.a.b=value`` (or ``--config.a.b value``) into ``(path, text)``.

    Raises:
      DropmaskValueError: an argument that is not a config override, or an override
        without a value.
    """
    pairs, items = [], list(args)
    while items:
        arg = items.pop(0)
        if not arg.startswith(PREFIX):
            raise DropmaskValueError(
                f"unrecognized argument {arg!r}; config entries are set as --config.NAME=VALUE"
            )
        name, sep, text = arg[len(PREFIX) :].partition("=")
        if not sep:
            if not items:
                raise DropmaskValueError(f"{arg} needs a value, e.g. {arg}=VALUE")
            text = items.pop(0)
        pairs.append((name, text))
    return pairs


def _kind(current: Any) -> str:
    """What a value of ``current``'s type is called in a message."""
    if isinstance(current, tuple | list) and current:
        return f"{type(current).__name__} of {type(current[0]).__name__}"
    return type(current).__name__


def _convert(name: str, current: Any, text: str) -> Any:
    """``text`` as a value of ``current``'s type (tuples from Python literals)."""
    try:
        if isinstance(current, bool):
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return lowered in ("true", "1")
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float):
            number = float(text)
            if not math.isfinite(number):
                raise DropmaskValueError(
                    f"--config.{name} must be a finite float, got {text} (the current value "
                    f"is {current!r})"
                )
            return number
        if isinstance(current, str):
            return text
        if isinstance(current, tuple | list):
            value = ast.literal_eval(text)
            value = value if isinstance(value, tuple | list) else (value,)
            kinds = {type(item) for item in current}
            # (32,) must not become ('a',): the entries keep the current entries' type.
            if len(kinds) == 1 and not all(type(item) in kinds for item in value):
                raise ValueError(text)
            return type(current)(value)
        return ast.literal_eval(text)
    except DropmaskValueError:
        raise
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise DropmaskValueError(
            f"--config.{name}={text} is not a valid {_kind(current)} (the current "
            f"value is {current!r})"
        ) from None


def apply_overrides(
    config: ml_collections.ConfigDict, pairs: Sequence[tuple[str, str]]
) -> ml_collections.ConfigDict:
    """Returns a copy of ``config`` with each ``(dotted path, text)`` set.

    Example:
      >>> config = ml_collections.ConfigDict({"rate": 0.1, "hidden": (8,)})
      >>> apply_overrides(config, [("rate", "0.3"), ("hidden", "(4, 4)")]).hidden
      (4, 4)

    Raises:
      DropmaskValueError: an unknown entry, or a value of the wrong type.
    """
    config = config.copy_and_resolve_references()
    for path, text in pairs:
        *parents, leaf = path.split(".")
        node = config
        for part in parents:
            node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
        if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
            raise DropmaskValueError(
                f"--config.{path}: no such config entry; the entries are "
                f"{', '.join(sorted(config.keys()))}"
            )
        with node.unlocked():
            node[leaf] = _convert(path, node[leaf], text)
    return config
