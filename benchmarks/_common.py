"""What every benchmark shares: timing, the environment record, and the contestants.

* Timing. A kernel's time is the slope between a short and a long loop of passes
  inside one jit (:class:`Looped`), so per-call costs (dispatch, copying inputs into the
  loop, page-faulting fresh outputs) cancel; contestants are timed back to back within
  each repeat, so load drifting on a shared machine cancels in paired ratios.
* Environment. Where, when and how numbers were measured (:func:`environment`), and
  :func:`write_section`, which replaces one marked section of ``RESULTS.md``.
* Contestants. The ways of doing dropout that the benchmarks compare
  (:func:`contestants`), their loops forward and forward+backward, an output check,
  and the residual bytes a contestant keeps for the backward pass.

Benchmarks reach dropmask's internals only through :mod:`dropmask.testing`.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import inspect
import math
import os
import platform
import statistics
import subprocess
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dropmask
from dropmask import testing

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


# --- contestants ----------------------------------------------------------------------

RATE = 0.1
KEEP = 1.0 - RATE
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
MODES = ("fwd", "fwd+bwd")
LIMIT = "x * c (memory-bound limit)"
FLAX = "flax.linen.Dropout (threefry)"


@dataclass(frozen=True)
class Contestant:
    """One way of doing dropout: ``apply(x, aux) -> y`` with ``aux = make_aux(dtype)``."""

    name: str
    apply: Callable[[jax.Array, Any], jax.Array]
    make_aux: Callable[[Any], Any]
    is_dropout: bool = True


def default_impl() -> str:
    """The ``impl`` that ``dropmask.dropout`` uses when none is given."""
    return str(inspect.signature(dropmask.dropout).parameters["impl"].default)


def dropmask_name() -> str:
    """The name of the contestant for ``dropmask.dropout`` with its defaults."""
    return f"dropmask (default impl={default_impl()!r})"


def residual_choices() -> tuple[str, ...]:
    """The values of ``dropmask.dropout``'s ``residual`` argument other than its default,
    from its ``Literal`` annotation (``("none",)`` if it is not one); none where the
    argument does not exist."""
    param = inspect.signature(dropmask.dropout).parameters.get("residual")
    if param is None:
        return ()
    try:
        hint = typing.get_type_hints(dropmask.dropout).get("residual")
    except Exception:  # noqa: BLE001 - an unresolvable annotation: use the documented choice
        hint = None
    choices = [a for a in typing.get_args(hint) if isinstance(a, str)] or ["none"]
    return tuple(c for c in choices if c != param.default)


def threefry_key(dtype: Any) -> jax.Array:
    del dtype
    return jax.random.key(0)


def _rbg_key(dtype: Any) -> jax.Array:
    del dtype
    return jax.random.key(0, impl="rbg")


def _limit() -> Contestant:
    return Contestant(
        LIMIT, lambda x, c: x * c, lambda dtype: jnp.asarray(1.0 / KEEP, dtype), is_dropout=False
    )


def contestants(full: bool = True) -> tuple[list[Contestant], list[str]]:
    """The contestants that can be imported here, and notes on any that cannot.

    ``full=False``: dropmask's default, Flax's and the limit only (what the targets use).
    """
    import flax.linen as nn

    flax_dropout = nn.Dropout(rate=RATE, deterministic=False)

    def flax_apply(x: jax.Array, key: jax.Array) -> jax.Array:
        return flax_dropout.apply({}, x, rngs={"dropout": key})

    ours = Contestant(dropmask_name(), lambda x, key: dropmask.dropout(x, RATE, key), threefry_key)
    flax = Contestant(FLAX, flax_apply, threefry_key)
    if not full:
        return [ours, flax, _limit()], []
    out = [ours]
    for choice in residual_choices():
        kwargs = {"residual": choice}
        out.append(
            Contestant(
                f"dropmask residual={choice!r}",
                lambda x, key, kw=kwargs: dropmask.dropout(x, RATE, key, **kw),
                threefry_key,
            )
        )
    out += [
        Contestant(
            "dropmask impl='flax'",
            lambda x, key: dropmask.dropout(x, RATE, key, impl="flax"),
            threefry_key,
        ),
        flax,
        Contestant("flax.linen.Dropout (rbg)", flax_apply, _rbg_key),
    ]
    notes = []
    try:
        import equinox as eqx

        eqx_dropout = eqx.nn.Dropout(p=RATE)
        out.append(
            Contestant(
                "eqx.nn.Dropout",
                lambda x, key: eqx_dropout(x, key=key, inference=False),
                threefry_key,
            )
        )
    except ImportError as err:
        notes.append(f"equinox not installed ({err}); skipped")
    try:
        import haiku as hk

        out.append(Contestant("hk.dropout", lambda x, key: hk.dropout(key, RATE, x), threefry_key))
    except ImportError as err:
        notes.append(f"dm-haiku not installed ({err}); skipped")
    out.append(_limit())
    return out, notes


def inputs(shape: tuple[int, ...], dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``x`` and the cotangent ``g``, standard normal."""
    kx, kg = jax.random.split(jax.random.key(1234))
    return jax.random.normal(kx, shape, dtype), jax.random.normal(kg, shape, dtype)


def vjp_apart(c: Contestant, x: jax.Array, aux: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(y, dx)`` of one ``jax.vjp``, the backward kept apart from the forward.

    In a network other layers run between a dropout's forward and backward pass, so
    whatever the backward needs (a saved mask, or the key to regenerate it) is written
    and read back. With nothing in between, XLA would fuse the two passes into one
    kernel that draws the mask once; an optimization barrier over the output, the vjp
    residuals and the cotangent stops that, as the layers in between would.
    """
    y, vjp_fn = jax.vjp(lambda x: c.apply(x, aux), x)
    y, vjp_fn, g = lax.optimization_barrier((y, vjp_fn, g))
    return y, vjp_fn(g)[0]


def fwd_fn(c: Contestant) -> Callable[[jax.Array, Any], jax.Array]:
    """One jitted forward call ``(x, aux) -> y``."""
    return jax.jit(c.apply)


def fwd_bwd_fn(c: Contestant) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """One jitted forward+backward call ``(x, aux, g) -> (y, dx)`` (see :func:`vjp_apart`)."""
    return jax.jit(lambda x, aux, g: vjp_apart(c, x, aux, g))


def _step_aux(c: Contestant, aux: Any, i: jax.Array) -> Any:
    """A fresh key per loop iteration (so no mask is loop-invariant); the limit's scale."""
    return jax.random.fold_in(aux, i) if c.is_dropout else aux


def looped_fwd(c: Contestant, passes: int) -> Callable[[jax.Array, Any], jax.Array]:
    """``passes`` forward passes inside one jit, each feeding the next: no output buffer
    is allocated per pass, so the time is the kernel's, not the allocator's."""

    def run(x: jax.Array, aux: Any) -> jax.Array:
        return lax.fori_loop(0, passes, lambda i, x: c.apply(x, _step_aux(c, aux, i)), x)

    return jax.jit(run)


def looped_fwd_bwd(c: Contestant, passes: int) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """``passes`` forward+backward passes (:func:`vjp_apart`) inside one jit,
    ``(x, g) -> (y, dx)`` feeding the next."""

    def body(i: jax.Array, carry: tuple[jax.Array, jax.Array], aux: Any) -> Any:
        x, g = carry
        return vjp_apart(c, x, _step_aux(c, aux, i), g)

    def run(x: jax.Array, aux: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        return lax.fori_loop(0, passes, lambda i, carry: body(i, carry, aux), (x, g))

    return jax.jit(run)


def loop(c: Contestant, shape: tuple[int, ...], dtype_name: str, mode: str) -> Looped:
    """``c``'s loops for one case, with the pass count probed (see :func:`looped`)."""
    x, g = inputs(shape, DTYPES[dtype_name])
    aux = c.make_aux(x.dtype)
    if mode == "fwd":
        return looped(lambda passes: looped_fwd(c, passes), (x, aux))
    return looped(lambda passes: looped_fwd_bwd(c, passes), (x, aux, g))


def looped_mask_words(shape: tuple[int, ...], passes: int) -> Callable[[jax.Array, Any], Any]:
    """``passes`` draws of the packed keep-words that dropmask's packed paths compute
    before applying them (the generator alone), a fresh key per pass; ``x`` is unused."""
    words_shape = jax.eval_shape(lambda: testing.packed_mask_words(jax.random.key(0), shape, RATE))

    def run(x: jax.Array, key: Any) -> jax.Array:
        def body(i: jax.Array, acc: jax.Array) -> jax.Array:
            return acc ^ testing.packed_mask_words(jax.random.fold_in(key, i), shape, RATE)

        return lax.fori_loop(0, passes, body, jnp.zeros(words_shape.shape, jnp.uint32))

    return jax.jit(run)


def check_output(
    x: jax.Array, y: jax.Array, g: jax.Array | None, dx: jax.Array | None
) -> dict[str, Any]:
    """Whether ``y`` (and ``dx``) look like dropout at RATE of ``x``: returns stats and ok.

    The drop fraction within 6 sigma of RATE, kept values scaled by about ``1/KEEP``,
    and the backward zero exactly where the forward dropped.
    """
    xn = np.asarray(x, np.float32)
    yn = np.asarray(y, np.float32)
    dropped = yn == 0
    n = dropped.size
    drop_frac = float(dropped.mean())
    sigma = math.sqrt(RATE * KEEP / n)
    kept = ~dropped & (xn != 0)
    scale = float(np.median(yn[kept] / xn[kept])) if kept.any() else float("nan")
    ok = abs(drop_frac - RATE) <= 6 * sigma + 1e-4 and abs(scale * KEEP - 1) <= 0.02
    consistent = None
    if dx is not None and g is not None:
        gn = np.asarray(g, np.float32)
        dxn = np.asarray(dx, np.float32)
        where = (xn != 0) & (gn != 0)
        consistent = bool(((dxn == 0) == dropped)[where].all())
        ok = ok and consistent
    return {"drop_frac": drop_frac, "scale": scale, "mask_consistent": consistent, "ok": bool(ok)}


def checked(c: Contestant, shape: tuple[int, ...], dtype_name: str, mode: str) -> dict[str, Any]:
    """:func:`check_output` of one call of ``c`` (no check for the limit)."""
    if not c.is_dropout:
        return {"drop_frac": None, "scale": None, "mask_consistent": None, "ok": None}
    x, g = inputs(shape, DTYPES[dtype_name])
    aux = c.make_aux(x.dtype)
    if mode == "fwd":
        return check_output(x, fwd_fn(c)(x, aux), None, None)
    y, dx = fwd_bwd_fn(c)(x, aux, g)
    return check_output(x, y, g, dx)


def _nbytes(leaf: Any) -> int:
    dtype = leaf.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return math.prod(leaf.shape) * dtype.itemsize
    return math.prod(leaf.shape) * jnp.dtype(dtype).itemsize


def _residual_leaves(c: Contestant, shape: tuple[int, ...], dtype: Any) -> list[Any]:
    """The leaves of the vjp closure: what ``jax.vjp`` keeps for the backward pass."""
    x = jax.ShapeDtypeStruct(shape, dtype)
    aux = c.make_aux(dtype)

    def closure(x: jax.Array, aux: Any) -> Any:
        return jax.vjp(lambda x: c.apply(x, aux), x)[1]

    return jax.tree_util.tree_leaves(jax.eval_shape(closure, x, aux))


def residuals(c: Contestant, dtype: Any) -> dict[str, Any]:
    """Residual bytes per element: the growth of the vjp residuals between two sizes.

    A constant part (a key, a scalar rate) costs nothing per element; anything that
    grows with the input (a stored mask, a saved input) shows up as B/elem.
    """
    small, large = (1024, 1024), (2048, 2048)
    leaves = {shape: _residual_leaves(c, shape, dtype) for shape in (small, large)}
    totals = [sum(_nbytes(leaf) for leaf in leaves[s]) for s in (small, large)]
    n_small, n_large = math.prod(small), math.prod(large)
    per_element = (totals[1] - totals[0]) / (n_large - n_small)
    describe = [f"{leaf.dtype}[{','.join(map(str, leaf.shape))}]" for leaf in leaves[large]]
    sizes = [[math.prod(leaf.shape) for leaf in leaves[s]] for s in (small, large)]
    if len(sizes[0]) == len(sizes[1]):
        growing = [d for d, a, b in zip(describe, *sizes, strict=True) if b > a]
    else:  # the leaves differ in number between the sizes: name them all if any grew
        growing = describe if per_element else []
    return {
        "contestant": c.name,
        "dtype": str(jnp.dtype(dtype)),
        "residual_bytes_per_element": per_element,
        "residual_bytes_constant": totals[0] - per_element * n_small,
        "growing_residuals": growing,
        "residuals_at_2048x2048": describe,
    }
