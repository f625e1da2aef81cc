"""Config entries: ``--config.key=value`` overrides, as in Flax's examples, and checks."""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from .._errors import DropmaskValueError, user_error

__all__ = ["apply_overrides", "check_config", "parse_overrides"]

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
            raise user_error(
                DropmaskValueError,
                f"unrecognized argument {arg!r}; config entries are set as --config.NAME=VALUE",
                caller=None,
            )
        name, sep, text = arg[len(PREFIX) :].partition("=")
        if not sep:
            if not items:
                raise user_error(
                    DropmaskValueError,
                    f"{arg} needs a value, e.g. {arg}=VALUE",
                    caller=None,
                )
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
    invalid = user_error(
        DropmaskValueError,
        f"--config.{name}={text} is not a valid {_kind(current)} (the current value is "
        f"{current!r})",
        caller=None,
    )
    try:
        if isinstance(current, bool):
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise invalid
            return lowered in ("true", "1")
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float):
            number = float(text)
            if not math.isfinite(number):
                raise user_error(
                    DropmaskValueError,
                    f"--config.{name} must be a finite float, got {text} (the current value "
                    f"is {current!r})",
                    caller=None,
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
                raise invalid
            return type(current)(value)
        return ast.literal_eval(text)
    except DropmaskValueError:
        raise
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise invalid from None


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
            raise user_error(
                DropmaskValueError,
                f"--config.{path}: no such config entry; the entries are "
                f"{', '.join(sorted(config.keys()))}",
                caller=None,
            )
        with node.unlocked():
            node[leaf] = _convert(path, node[leaf], text)
    return config


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bound(value: float) -> str:
    return str(value) if _is_int(value) else f"{value:g}"


def check_config(
    config: ml_collections.ConfigDict,
    *,
    widths: Sequence[str] = (),
    at_least: Mapping[str, int] | None = None,
    in_range: Mapping[str, tuple[float, float]] | None = None,
    below: Mapping[str, tuple[float, float]] | None = None,
    positive: Sequence[str] = (),
    choices: Mapping[str, tuple[Any, ...]] | None = None,
) -> None:
    """Refuses config entries outside their bounds, naming the entry and the flag that sets it.

    An example calls it first thing in ``load_data``, so that a bad entry fails in one
    line before any data or model is built (a width of 0 would otherwise fail deep
    inside Flax). Entries that depend on the data (``batch_size`` against the
    number of examples) are the example's own checks.

    Args:
      config: the run's config.
      widths: entries that are an int ``>= 1``, or a tuple or list of them (layer widths).
      at_least: ``{entry: bound}``: an int ``>= bound``.
      in_range: ``{entry: (low, high)}``: a real number in ``[low, high]`` (NaN is not).
      below: ``{entry: (low, high)}``: a real number in ``[low, high)`` (a fraction to
        drop, where dropping everything leaves nothing to compute).
      positive: entries that are a real number ``> 0``.
      choices: ``{entry: values}``: one of ``values``.

    Raises:
      DropmaskValueError: the first entry out of bounds, of the wrong type or missing, as
        ``config.NAME must be ..., got VALUE. Set it with --config.NAME=...``.

    Example:
      >>> import ml_collections
      >>> config = ml_collections.ConfigDict({"hidden": (64, 0), "learning_rate": 0.1})
      >>> check_config(config, positive=["learning_rate"])
      >>> check_config(config, widths=["hidden"])
      Traceback (most recent call last):
      ...
      dropmask._errors.DropmaskValueError: config.hidden must be widths >= 1, got (64, 0). Set it with --config.hidden=(N, ...).
    """  # noqa: E501
    rules: list[tuple[str, bool, str, str]] = []
    for name in widths:
        value: Any = config.get(name)
        if isinstance(value, tuple | list):
            ok = all(_is_int(v) and v >= 1 for v in value)
            rules.append((name, ok, "widths >= 1", "(N, ...)"))
        else:
            rules.append((name, _is_int(value) and value >= 1, "a width >= 1", "N"))
    for name, low in (at_least or {}).items():
        value: Any = config.get(name)
        rules.append((name, _is_int(value) and value >= low, f"an int >= {low}", "N"))
    for name, (low, high) in (in_range or {}).items():
        value: Any = config.get(name)
        ok = _is_real(value) and low <= value <= high
        rules.append((name, ok, f"in [{_bound(low)}, {_bound(high)}]", "VALUE"))
    for name, (low, high) in (below or {}).items():
        value: Any = config.get(name)
        ok = _is_real(value) and low <= value < high
        rules.append((name, ok, f"in [{_bound(low)}, {_bound(high)})", "VALUE"))
    for name in positive:
        value: Any = config.get(name)
        rules.append((name, _is_real(value) and value > 0, "> 0", "VALUE"))
    for name, values in (choices or {}).items():
        value: Any = config.get(name)
        names = ", ".join(repr(v) for v in values)
        rules.append((name, value in values, f"one of {names}", str(values[0])))
    for name, ok, must, form in rules:
        if not ok:
            raise user_error(
                DropmaskValueError,
                f"config.{name} must be {must}, got {config.get(name)!r}",
                f"Set it with --config.{name}={form}.",
                caller=None,
            )
