"""The timing harness every benchmark shares, and the record of where numbers came from.

* Timing. A kernel's time is the slope between a short and a long loop of passes
  inside one jit (:class:`Looped`), so per-call costs (dispatch, copying inputs into the
  loop, page-faulting fresh outputs) cancel; contestants are timed back to back within
  each repeat, so load drifting on a shared machine cancels in paired ratios.
* Environment. Where, when and how numbers were measured (:func:`environment`), and
  :func:`write_section`, which replaces one marked section of ``RESULTS.md``.

The ways of doing dropout that the benchmarks compare live in ``_contestants.py``.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

# --- timing ---------------------------------------------------------------------------


def interleaved_medians(
    cases: Mapping[Any, tuple[Callable[..., Any], Sequence[Any]]],
    *,
    repeats: int = 7,
    warmup: int = 2,
) -> dict[Any, float]:
    """Median wall time of each ``fn(*args)`` in ``cases``, timed round-robin.

    On a shared machine the background load drifts during a run; timing the
    contestants in turn within every repeat spreads that drift over all of them
    instead of penalising whichever happened to run during a busy spell.

    Args:
      cases: name -> (jitted fn, args). Every fn is compiled and run ``warmup`` times
        before any timing.
      repeats: timed calls per case; the median is reported.
      warmup: untimed calls per case.

    Returns:
      name -> median seconds.
    """
    for fn, args in cases.values():
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    times: dict[Any, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (fn, args) in cases.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


@dataclass(frozen=True)
class Looped:
    """One contestant as loops of passes inside one jit, at two lengths.

    ``make(passes)`` returns a jitted function of ``*args`` running ``passes`` passes;
    ``short`` passes and ``short + extra`` passes are timed, and the per-pass time is
    the difference over ``extra``: whatever a call pays once (copying the input into
    the loop, page-faulting a fresh output: tens of ms for 64 MiB on this CPU) cancels,
    so a slow kernel cannot hide behind a large fixed cost.
    """

    make: Callable[[int], Callable[..., Any]]
    args: Sequence[Any]
    extra: int
    short: int = 2

    @functools.cached_property
    def short_fn(self) -> Callable[..., Any]:
        return self.make(self.short)

    @functools.cached_property
    def long_fn(self) -> Callable[..., Any]:
        return self.make(self.short + self.extra)


def looped(
    make: Callable[[int], Callable[..., Any]],
    args: Sequence[Any],
    *,
    extra_seconds: float = 0.25,
    min_extra: int = 8,
    max_extra: int = 512,
) -> Looped:
    """A :class:`Looped` whose extra passes take about ``extra_seconds``.

    A probe times loops of 2 and 10 passes to estimate the per-pass time; cheap
    kernels get many extra passes (so their difference clears the per-call noise),
    slow ones few (so the run stays short). Clamped to ``[min_extra, max_extra]``.
    """
    probe = Looped(make, args, extra=min_extra)
    for fn in (probe.short_fn, probe.long_fn):
        jax.block_until_ready(fn(*args))
    short = min(_timed(probe.short_fn, args) for _ in range(2))
    long = min(_timed(probe.long_fn, args) for _ in range(2))
    per_pass = (long - short) / min_extra
    extra = max_extra if per_pass <= 0 else round(extra_seconds / per_pass)
    extra = max(min_extra, min(max_extra, extra))
    if extra == min_extra:
        return probe
    return Looped(make, args, extra=extra)


def per_pass_medians(
    loops: Mapping[str, Looped], *, repeats: int = 7, warmup: int = 2
) -> dict[str, float]:
    """Seconds per pass of each loop: ``(median(long) - median(short)) / extra``, with
    all loops timed round-robin (see :func:`interleaved_medians`)."""
    cases = {}
    for name, loop in loops.items():
        cases[(name, "short")] = (loop.short_fn, loop.args)
        cases[(name, "long")] = (loop.long_fn, loop.args)
    medians = interleaved_medians(cases, repeats=repeats, warmup=warmup)
    return {
        name: _positive_slope(medians[(name, "long")] - medians[(name, "short")], name) / loop.extra
        for name, loop in loops.items()
    }


def paired_per_pass_seconds(
    loops: Mapping[str, Looped], *, repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Per-pass seconds of every loop, one value per repeat, all loops back to back.

    Within a repeat the short and long loops of every contestant run in turn, in an
    order reversed every other repeat, so that a spell of background load on a shared
    machine lands on all contestants of that repeat and cancels in paired ratios or
    differences; per-call fixed costs cancel in each slope (see :class:`Looped`).

    A repeat in which a loop's long run was not slower than its short one (a burst of
    load landed on the short run) gives NaN for that loop, so one burst cannot end a
    run; :func:`quartiles` leaves NaN out. Raises if it happens in every repeat.
    """
    calls = [(name, which) for name in loops for which in ("short", "long")]
    fns = {(n, w): getattr(loops[n], f"{w}_fn") for n, w in calls}
    for name, which in calls:
        for _ in range(warmup):
            jax.block_until_ready(fns[(name, which)](*loops[name].args))
    out: dict[str, list[float]] = {name: [] for name in loops}
    for r in range(repeats):
        seconds = {}
        for call in calls if r % 2 == 0 else reversed(calls):
            seconds[call] = _timed(fns[call], loops[call[0]].args)
        for name, loop in loops.items():
            slope = seconds[(name, "long")] - seconds[(name, "short")]
            out[name].append(slope / loop.extra if slope > 0 else math.nan)
    for name, values in out.items():
        if values and all(math.isnan(v) for v in values):
            _positive_slope(0.0, name)
    return out


def paired_per_pass_ratios(
    numerator: Looped, denominator: Looped, *, repeats: int = 21, warmup: int = 2
) -> list[float]:
    """Per-pass time ratios numerator / denominator, one per repeat, each pair timed
    back to back (see :func:`paired_per_pass_seconds`)."""
    seconds = paired_per_pass_seconds(
        {"numerator": numerator, "denominator": denominator}, repeats=repeats, warmup=warmup
    )
    return [n / d for n, d in zip(seconds["numerator"], seconds["denominator"], strict=True)]


def _timed(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _positive_slope(seconds: float, name: Any) -> float:
    if seconds <= 0:
        raise RuntimeError(
            f"{name}: the longer loop was not slower than the shorter one "
            f"({seconds * 1e3:.3f} ms); add passes so the difference clears the noise."
        )
    return seconds


def finite(values: Sequence[float]) -> list[float]:
    """``values`` without NaN and infinities (repeats discarded as noise)."""
    return [v for v in values if math.isfinite(v)]


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile) of the finite ``values``; NaN if none."""
    kept = finite(values)
    if len(kept) < 2:
        return (kept[0],) * 3 if kept else (math.nan,) * 3
    q1, q2, q3 = statistics.quantiles(kept, n=4, method="inclusive")
    return q1, q2, q3


# --- environment ----------------------------------------------------------------------


def write_section(path: Path, name: str, body: str, *, first: bool = False) -> None:
    """Replaces the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in ``path``.

    The section is added if absent (after the title line when ``first``, else at the
    end); the rest of the file is left as it was.
    """
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}\n"
    text = path.read_text() if path.exists() else "# dropmask benchmark results\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block.rstrip("\n") + tail
    elif first:
        title, _, rest = text.partition("\n")
        text = title + "\n\n" + block + "\n" + rest.lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(module: str) -> str:
    """``module.__version__``, or "not installed"."""
    try:
        return importlib.import_module(module).__version__
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return "not installed"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=False
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(command: str) -> dict[str, Any]:
    """Where and how the numbers were measured; ``command`` is what was run."""
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    dev = jax.devices()[0]
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "load_average_at_start": os.getloadavg(),
        "backend": jax.default_backend(),
        "device": f"{dev.platform}: {getattr(dev, 'device_kind', '?')}",
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "flax": version("flax"),
        "equinox": version("equinox"),
        "haiku": version("haiku"),
        "optax": version("optax"),
        "dropmask": version("dropmask"),
        "python": platform.python_version(),
        "git_commit": (_git("rev-parse", "--short", "HEAD") or "?") + (" (dirty)" if dirty else ""),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "command": command,
    }


def environment_markdown(env: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in env["load_average_at_start"])
    end = env.get("load_average_at_end")
    at_end = "" if end is None else ", at end " + ", ".join(f"{x:.2f}" for x in end)
    took = env.get("wall_seconds")
    return (
        f"- date: {env['date_utc']}\n"
        f"- machine: {env['cpu_model']}, {env['cpu_count']} cores "
        f"({env['cpus_usable']} usable), load average at start {load}{at_end}\n"
        f"- backend: {env['device']}\n"
        f"- versions: jax {env['jax']}, jaxlib {env['jaxlib']}, flax {env['flax']}, "
        f"equinox {env['equinox']}, haiku {env['haiku']}, optax {env['optax']}, "
        f"dropmask {env['dropmask']} @ {env['git_commit']}, python {env['python']}\n"
        f"- command: `XLA_FLAGS={env['xla_flags']!r} {env['command']}`"
        + ("" if took is None else f" ({took / 60:.1f} min)")
        + "\n"
    )


def markdown_table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    """``cols``: (header, key or format spec 'key:fmt'); a missing value prints as '-'."""
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, spec in cols:
            key, _, fmt = spec.partition(":")
            v = r.get(key)
            cells.append("-" if v is None else (format(v, fmt) if fmt else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
