"""Dropout speed and memory, side by side: dropmask vs Flax, Equinox, Haiku and ``x * c``.

Every contestant is jitted the same way, takes its key (or, for the limit, its scale)
as an argument so nothing is constant-folded, sees the same inputs, and is timed
round-robin with its outputs blocked on. The memory-bound limit is ``x * c`` with a
traced scalar ``c``: it reads and writes what an ideal dropout must (forward: read
``x``, write ``y``; forward+backward: also read ``g``, write ``dx``) and does nothing
else. Each timed dropout output is also checked (drop fraction, kept values scaled by
about ``1/keep``, backward zeros where the forward dropped), so a broken fast path
cannot look good.

Called by ``benchmarks/run.py``; ``run(quick=..., peak_gbps=...)`` returns a dict of
rows and markdown tables.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import dropmask
from benchmarks import _mlp
from benchmarks._timing import (
    Looped,
    interleaved_medians,
    looped,
    paired_per_pass_ratios,
    per_pass_medians,
    quartiles,
)
from dropmask import _fast_mask

RATE = 0.1
KEEP = 1.0 - RATE
SHAPES = ((1024, 1024), (2048, 2048), (4096, 4096))
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
MODES = ("fwd", "fwd+bwd")
LIMIT = "x * c (memory-bound limit)"
FLAX = "flax.linen.Dropout (threefry)"
TARGET_SHAPE = (4096, 4096)

# MLP train step for the temp-memory measurement.
MLP_BATCH = 1024
MLP_WIDTH = 1024
MLP_DROPOUT_LAYERS = 2


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


def _threefry_key(dtype: Any) -> jax.Array:
    return jax.random.key(0)


def _rbg_key(dtype: Any) -> jax.Array:
    return jax.random.key(0, impl="rbg")


def contestants() -> tuple[list[Contestant], list[str]]:
    """All contestants that can be imported here, and notes on any that cannot."""
    import flax.linen as nn

    flax_dropout = nn.Dropout(rate=RATE, deterministic=False)

    def flax_apply(x: jax.Array, key: jax.Array) -> jax.Array:
        return flax_dropout.apply({}, x, rngs={"dropout": key})

    out = [
        Contestant(
            f"dropmask (default impl={default_impl()!r})",
            lambda x, key: dropmask.dropout(x, RATE, key),
            _threefry_key,
        ),
        Contestant(
            "dropmask impl='flax'",
            lambda x, key: dropmask.dropout(x, RATE, key, impl="flax"),
            _threefry_key,
        ),
        Contestant(FLAX, flax_apply, _threefry_key),
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
                _threefry_key,
            )
        )
    except ImportError as err:
        notes.append(f"equinox not installed ({err}); skipped")
    try:
        import haiku as hk

        out.append(Contestant("hk.dropout", lambda x, key: hk.dropout(key, RATE, x), _threefry_key))
    except ImportError as err:
        notes.append(f"dm-haiku not installed ({err}); skipped")
    out.append(
        Contestant(
            LIMIT,
            lambda x, c: x * c,
            lambda dtype: jnp.asarray(1.0 / KEEP, dtype),
            is_dropout=False,
        )
    )
    return out, notes


def _fwd(c: Contestant) -> Callable[[jax.Array, Any], jax.Array]:
    return jax.jit(c.apply)


def _fwd_bwd(c: Contestant) -> Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, jax.Array]]:
    """``(x, aux, g) -> (y, dx)``: one vjp with a given cotangent, both outputs returned."""

    def run(x: jax.Array, aux: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        y, vjp_fn = jax.vjp(lambda x: c.apply(x, aux), x)
        return y, vjp_fn(g)[0]

    return jax.jit(run)


def _step_aux(c: Contestant, aux: Any, i: jax.Array) -> Any:
    """A fresh key per loop iteration (so no mask is loop-invariant); the limit's scale."""
    return jax.random.fold_in(aux, i) if c.is_dropout else aux


_LOOPS: dict[tuple[str, tuple[int, ...], str, str], Looped] = {}


def _loop(c: Contestant, shape: tuple[int, ...], dtype_name: str, mode: str) -> Looped:
    """``c``'s loops for one case (see ``_timing.Looped``), pass count probed once."""
    key = (c.name, shape, dtype_name, mode)
    if key not in _LOOPS:
        x, g = _inputs(shape, DTYPES[dtype_name])
        aux = c.make_aux(x.dtype)
        if mode == "fwd":
            _LOOPS[key] = looped(lambda passes: _looped_fwd(c, passes), (x, aux))
        else:
            _LOOPS[key] = looped(lambda passes: _looped_fwd_bwd(c, passes), (x, aux, g))
    return _LOOPS[key]


def _looped_fwd(c: Contestant, trips: int) -> Callable[[jax.Array, Any], jax.Array]:
    """``trips`` forward passes inside one jit, each feeding the next: no output buffer
    is allocated per pass, so the time is the kernel's, not the allocator's."""

    def run(x: jax.Array, aux: Any) -> jax.Array:
        return lax.fori_loop(0, trips, lambda i, x: c.apply(x, _step_aux(c, aux, i)), x)

    return jax.jit(run)


def _looped_fwd_bwd(
    c: Contestant, trips: int
) -> Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, jax.Array]]:
    """``trips`` vjps inside one jit, ``(x, g) -> (y, dx)`` feeding the next."""

    def body(i: jax.Array, carry: tuple[jax.Array, jax.Array], aux: Any) -> Any:
        x, g = carry
        step_aux = _step_aux(c, aux, i)
        y, vjp_fn = jax.vjp(lambda x: c.apply(x, step_aux), x)
        return y, vjp_fn(g)[0]

    def run(x: jax.Array, aux: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        return lax.fori_loop(0, trips, lambda i, carry: body(i, carry, aux), (x, g))

    return jax.jit(run)


def _looped_mask_words(shape: tuple[int, ...], passes: int) -> Callable[[jax.Array, Any], Any]:
    """``passes`` draws of the packed keep-words that dropmask's CPU forward pass computes
    before applying them (the generator alone), a fresh key per pass; ``x`` is unused."""
    thr = _fast_mask.threshold(KEEP)
    words_shape = jax.eval_shape(
        lambda: _fast_mask.packed_keep_words(jnp.zeros(4, jnp.uint32), shape, thr)
    )

    def run(x: jax.Array, key: Any) -> jax.Array:
        def body(i: jax.Array, acc: jax.Array) -> jax.Array:
            words = _fast_mask.key_words(jax.random.fold_in(key, i))
            return acc ^ _fast_mask.packed_keep_words(words, shape, thr)

        return lax.fori_loop(0, passes, body, jnp.zeros(words_shape.shape, jnp.uint32))

    return jax.jit(run)


def _inputs(shape: tuple[int, ...], dtype: Any) -> tuple[jax.Array, jax.Array]:
    kx, kg = jax.random.split(jax.random.key(1234))
    return jax.random.normal(kx, shape, dtype), jax.random.normal(kg, shape, dtype)


def check_output(x: jax.Array, y: jax.Array, g: jax.Array | None, dx: jax.Array | None) -> dict:
    """Whether ``y`` (and ``dx``) look like dropout at RATE of ``x``: returns stats and ok."""
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


def time_speed(
    cs: list[Contestant], shape: tuple[int, ...], dtype_name: str, mode: str, repeats: int
) -> list[dict[str, Any]]:
    """Median times of every contestant for one (shape, dtype, mode), timed round-robin.

    Two timings per contestant: one call (outputs freshly allocated, as an op-by-op
    user sees it; on CPU, buffers over 32 MiB come from mmap and every call pays a page
    fault per 4 KiB page), and the per-pass time of a loop of passes inside one jit:
    the slope between a short and a long loop, so that what a call pays once (copying
    the input into the loop, faulting in the output) cancels. Targets use the loop.
    """
    dtype = DTYPES[dtype_name]
    x, g = _inputs(shape, dtype)
    n = math.prod(shape)
    calls, loops = {}, {}
    for c in cs:
        aux = c.make_aux(dtype)
        calls[c.name] = (_fwd(c), (x, aux)) if mode == "fwd" else (_fwd_bwd(c), (x, aux, g))
        loops[c.name] = _loop(c, shape, dtype_name, mode)
    call_s = interleaved_medians(calls, repeats=repeats)
    loop_s = per_pass_medians(loops, repeats=repeats)
    itemsize = jnp.dtype(dtype).itemsize
    ideal_bytes = (2 if mode == "fwd" else 4) * n * itemsize
    rows = []
    for c in cs:
        fn, args = calls[c.name]
        if c.is_dropout:
            out = fn(*args)
            y, dx = (out, None) if mode == "fwd" else out
            check = check_output(x, y, g if dx is not None else None, dx)
            del out, y, dx
        else:
            check = {"drop_frac": None, "scale": None, "mask_consistent": None, "ok": None}
        rows.append(
            {
                "contestant": c.name,
                "mode": mode,
                "dtype": dtype_name,
                "shape": list(shape),
                "n_elements": n,
                "ms_call": call_s[c.name] * 1e3,
                "ratio_call": call_s[c.name] / call_s[LIMIT],
                "ms_loop": loop_s[c.name] * 1e3,
                "loop_passes": f"{loops[c.name].short}/{loops[c.name].short + loops[c.name].extra}",
                "ratio_to_limit": loop_s[c.name] / loop_s[LIMIT],
                "ideal_gbps": ideal_bytes / loop_s[c.name] / 1e9,
                **check,
            }
        )
    return rows


# --- memory ---------------------------------------------------------------------


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
    totals = []
    for shape in (small, large):
        totals.append(sum(_nbytes(leaf) for leaf in _residual_leaves(c, shape, dtype)))
    n_small, n_large = math.prod(small), math.prod(large)
    per_element = (totals[1] - totals[0]) / (n_large - n_small)
    leaves = _residual_leaves(c, large, dtype)
    describe = [f"{leaf.dtype}[{','.join(map(str, leaf.shape))}]" for leaf in leaves]
    return {
        "contestant": c.name,
        "dtype": str(jnp.dtype(dtype)),
        "residual_bytes_per_element": per_element,
        "residual_bytes_constant": totals[0] - per_element * n_small,
        "growing_residuals": [
            d
            for d, leaf in zip(describe, leaves, strict=True)
            if math.prod(leaf.shape) * 16 >= n_large
        ],
        "residuals_at_2048x2048": describe,
    }


def _make_step(
    drop: Callable[[jax.Array, jax.Array], jax.Array] | None,
) -> tuple[Callable[..., Any], optax.GradientTransformation]:
    opt = optax.sgd(1e-2)
    loss_fn = _mlp.loss(drop, MLP_DROPOUT_LAYERS)

    def step(params: dict, opt_state: Any, x: jax.Array, y: jax.Array, key: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, opt


def train_step_temp_bytes(c: Contestant | None) -> int:
    """``temp_size_in_bytes`` of the compiled MLP train step with this dropout (None: none)."""
    step, opt = _make_step(None if c is None else c.apply)
    params = _mlp.params(jax.random.key(0), MLP_WIDTH, MLP_DROPOUT_LAYERS, jnp.float32)
    x = jnp.zeros((MLP_BATCH, MLP_WIDTH), jnp.float32)
    key = c.make_aux(jnp.float32) if c is not None else jax.random.key(0)
    compiled = jax.jit(step).lower(params, opt.init(params), x, x, key).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def memory(cs: list[Contestant]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    res_rows = [residuals(c, dtype) for dtype in DTYPES.values() for c in cs]
    base = train_step_temp_bytes(None)
    per_layer = MLP_BATCH * MLP_WIDTH
    step_rows = [
        {
            "contestant": "no dropout",
            "temp_bytes": base,
            "extra_bytes_per_element_per_layer": 0.0,
        }
    ]
    for c in cs:
        if not c.is_dropout:
            continue
        temp = train_step_temp_bytes(c)
        step_rows.append(
            {
                "contestant": c.name,
                "temp_bytes": temp,
                "extra_bytes_per_element_per_layer": (temp - base)
                / (MLP_DROPOUT_LAYERS * per_layer),
            }
        )
    return res_rows, step_rows


# --- targets and tables -----------------------------------------------------------


def paired_target_ratios(cs: list[Contestant], repeats: int) -> dict[tuple[str, str], dict]:
    """Paired per-pass ratios at the target size: dropmask / limit and Flax / dropmask,
    per (dtype, mode), each pair timed back to back so that machine-load drift cancels."""
    by_name = {c.name: c for c in cs}
    dm = by_name[f"dropmask (default impl={default_impl()!r})"]
    out: dict[tuple[str, str], dict] = {}
    for dtype_name, dtype in DTYPES.items():
        for mode in MODES:
            print(f"  paired ratios {mode} {dtype_name} {list(TARGET_SHAPE)} ...", flush=True)
            ours, limit = (_loop(c, TARGET_SHAPE, dtype_name, mode) for c in (dm, by_name[LIMIT]))
            entry = {"vs_limit": paired_per_pass_ratios(ours, limit, repeats=repeats)}
            if mode == "fwd" and default_impl() == "fast":
                x, _ = _inputs(TARGET_SHAPE, dtype)
                gen = looped(
                    lambda passes: _looped_mask_words(TARGET_SHAPE, passes),
                    (x, jax.random.key(0)),
                )
                entry["generator_vs_limit"] = paired_per_pass_ratios(gen, limit, repeats=repeats)
            if FLAX in by_name:
                entry["flax_speedup"] = paired_per_pass_ratios(
                    _loop(by_name[FLAX], TARGET_SHAPE, dtype_name, mode),
                    ours,
                    repeats=max(3, repeats // 3),
                )
            out[(dtype_name, mode)] = entry
    return out


def _spread(values: list[float]) -> str:
    q1, q2, q3 = quartiles(values)
    return f"{q2:.2f}x (quartiles {q1:.2f}-{q3:.2f}, {len(values)} pairs)"


def targets(
    paired: dict[tuple[str, str], dict],
    speed: list[dict[str, Any]],
    res_rows: list[dict],
    step_rows: list[dict],
    quick: bool,
) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and PASS / MISS (or n/a).

    Speed targets use the paired ratios (median of back-to-back pairs); the output
    checks come from the speed rows.
    """
    dm = f"dropmask (default impl={default_impl()!r})"
    on_cpu = jax.default_backend() == "cpu"

    def row(dtype: str, mode: str, name: str) -> dict[str, Any] | None:
        for r in speed:
            if (
                r["contestant"] == name
                and r["dtype"] == dtype
                and r["mode"] == mode
                and tuple(r["shape"]) == TARGET_SHAPE
            ):
                return r
        return None

    out = []

    def add(target: str, value: str, passed: bool | None, why: str = "") -> None:
        status = "n/a" if passed is None else ("PASS" if passed else "MISS")
        out.append({"target": target, "measured": value, "status": status, "note": why})

    na = "--quick: target size not run" if quick else ("targets are for CPU" if not on_cpu else "")
    for mode, limit in (("fwd", 1.3), ("fwd+bwd", 1.5)):
        r, p = row("f32", mode, dm), paired.get(("f32", mode))
        if r is None or p is None or na:
            add(f"f32 {mode} <= {limit}x limit (loop)", "-", None, na)
            continue
        add(
            f"f32 {mode} <= {limit}x limit (loop)",
            _spread(p["vs_limit"]),
            quartiles(p["vs_limit"])[1] <= limit and bool(r["ok"]),
            "" if r["ok"] else "output check failed",
        )
        if "generator_vs_limit" in p:
            add(
                f"(diagnostic) f32 {mode}: generating the packed mask alone, x limit",
                _spread(p["generator_vs_limit"]),
                None,
                "no target: the packed keep-words without applying them; the forward "
                "pass costs about 1 + this",
            )
    for mode in MODES:
        r, p = row("f32", mode, dm), paired.get(("f32", mode))
        if r is None or p is None or "flax_speedup" not in p or na:
            add(f"f32 {mode} >= 8x faster than {FLAX} (loop)", "-", None, na)
            continue
        speedup = quartiles(p["flax_speedup"])[1]
        add(
            f"f32 {mode} >= 8x faster than {FLAX} (loop)",
            _spread(p["flax_speedup"]),
            speedup >= 8 and bool(r["ok"]),
        )
    for mode in MODES:
        r16, p16, p32 = row("bf16", mode, dm), paired.get(("bf16", mode)), paired.get(("f32", mode))
        if r16 is None or p16 is None or p32 is None or na:
            add(f"bf16 {mode} ratio to limit <= f32's (loop)", "-", None, na)
            continue
        m16, m32 = quartiles(p16["vs_limit"])[1], quartiles(p32["vs_limit"])[1]
        add(
            f"bf16 {mode} ratio to limit <= f32's (loop)",
            f"{m16:.2f}x vs {m32:.2f}x",
            m16 <= m32 and bool(r16["ok"]),
        )
    for r in res_rows:
        if r["contestant"] == dm:
            per = r["residual_bytes_per_element"]
            add(
                f"residuals 0 bytes/element ({r['dtype']})",
                f"{per:.3g} B/elem (+{r['residual_bytes_constant']:.0f} B constant)",
                per == 0,
                "saves " + ", ".join(r["growing_residuals"]) if r["growing_residuals"] else "",
            )
    for r in step_rows:
        if r["contestant"] == dm:
            extra = r["extra_bytes_per_element_per_layer"]
            add(
                "train-step temp <= 1 B/element per dropout layer",
                f"{extra:.3f} B/elem",
                extra <= 1.0,
            )
    return out


def markdown_table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    """``cols``: (header, key or format spec 'key:fmt')."""
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, spec in cols:
            key, _, fmt = spec.partition(":")
            v = r.get(key)
            cells.append("-" if v is None else (format(v, fmt) if fmt else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def speed_tables(speed: list[dict[str, Any]], peak_gbps: float | None) -> str:
    dm = f"dropmask (default impl={default_impl()!r})"
    parts = []
    keys = sorted(
        {(tuple(r["shape"]), r["dtype"], r["mode"]) for r in speed},
        key=lambda k: (k[2], k[1], math.prod(k[0])),
    )
    for shape, dtype, mode in keys:
        rows = [
            r for r in speed if (tuple(r["shape"]), r["dtype"], r["mode"]) == (shape, dtype, mode)
        ]
        flax_row = next(r for r in rows if r["contestant"] == FLAX)
        dm_row = next(r for r in rows if r["contestant"] == dm)
        for r in rows:
            r["speedup_vs_flax"] = flax_row["ms_loop"] / r["ms_loop"]
            if peak_gbps:
                r["frac_of_peak"] = r["ideal_gbps"] / peak_gbps
            r["drop_pct"] = None if r["drop_frac"] is None else f"{100 * r['drop_frac']:.2f}"
            r["check"] = None if r["ok"] is None else ("ok" if r["ok"] else "FAILED")
        cols = [
            ("contestant", "contestant"),
            ("ms/pass (loop)", "ms_loop:.3f"),
            ("x limit (loop)", "ratio_to_limit:.2f"),
            ("passes (short/long)", "loop_passes"),
            ("speedup vs flax.linen (loop)", "speedup_vs_flax:.2f"),
            ("ms/call", "ms_call:.3f"),
            ("x limit (call)", "ratio_call:.2f"),
            ("drop %", "drop_pct"),
            ("scale", "scale:.4f"),
            ("bwd mask ok", "mask_consistent"),
            ("check", "check"),
        ]
        if jax.default_backend() == "gpu":
            cols.insert(3, ("GB/s (ideal bytes, loop)", "ideal_gbps:.0f"))
            if peak_gbps:
                cols.insert(4, ("of peak", "frac_of_peak:.2f"))
        parts.append(
            f"**{mode}, {dtype}, {list(shape)} ({math.prod(shape)} elements)** — "
            "dropmask vs flax.linen.Dropout: "
            f"{flax_row['ms_loop'] / dm_row['ms_loop']:.1f}x in the loop, "
            f"{flax_row['ms_call'] / dm_row['ms_call']:.1f}x per call\n\n"
            + markdown_table(rows, cols)
        )
    return "\n".join(parts)


def run(quick: bool = False, peak_gbps: float | None = None) -> dict[str, Any]:
    """Runs everything; returns rows plus a markdown report."""
    cs, notes = contestants()
    shapes = SHAPES[:1] if quick else SHAPES
    repeats = 3 if quick else 9
    speed = []
    for shape in shapes:
        for dtype_name in DTYPES:
            for mode in MODES:
                print(f"  dropout {mode} {dtype_name} {list(shape)} ...", flush=True)
                speed.extend(time_speed(cs, shape, dtype_name, mode, repeats))
    print("  dropout memory ...", flush=True)
    res_rows, step_rows = memory(cs)
    paired = {} if quick else paired_target_ratios(cs, repeats=21)
    target_rows = targets(paired, speed, res_rows, step_rows, quick)
    md = (
        "### Dropout speed\n\n"
        "Median ms. *loop*: per pass of a `lax.fori_loop` of passes inside one jit (a "
        "fresh key per pass via `fold_in`): the difference between a short and a long loop "
        "divided by the extra passes, so what a call pays once (copying the input into the "
        "loop, page-faulting a fresh output) cancels and the kernel's own time remains; "
        "each contestant gets enough extra passes for about 0.25 s of work (at least 8). "
        "*call*: one jitted call with freshly allocated outputs, what op-by-op code pays "
        "(on Linux CPU, outputs over 32 MiB are mmap'd and every call page-faults them "
        "in: about 30 ms for 64 MiB here, which swamps a 3 ms kernel and pulls every "
        "ratio toward 1). `x limit` = time / time of `x * c` measured the same way. The "
        "targets use the loop.\n\n"
    )
    md += speed_tables(speed, peak_gbps) + "\n"
    md += "### Dropout memory\n\n"
    md += "Residuals: what `jax.vjp` keeps for the backward pass (the leaves of the vjp "
    md += "closure); B/elem is their growth from a [1024, 1024] to a [2048, 2048] input, "
    md += "constant is the size-independent rest (keys, scalars).\n\n"
    md += markdown_table(
        res_rows,
        [
            ("contestant", "contestant"),
            ("dtype", "dtype"),
            ("B/elem", "residual_bytes_per_element:.3f"),
            ("constant B", "residual_bytes_constant:.0f"),
            ("residuals at [2048, 2048]", "residuals_at_2048x2048"),
        ],
    )
    md += (
        f"\nTrain step: {MLP_DROPOUT_LAYERS + 1}-layer MLP, width {MLP_WIDTH}, batch "
        f"{MLP_BATCH}, f32, optax.sgd, dropout after each of the {MLP_DROPOUT_LAYERS} hidden "
        "layers; `temp_size_in_bytes` of the compiled step; extra = (temp - no-dropout "
        f"temp) / ({MLP_DROPOUT_LAYERS} x {MLP_BATCH * MLP_WIDTH}).\n\n"
    )
    md += markdown_table(
        step_rows,
        [
            ("contestant", "contestant"),
            ("temp bytes", "temp_bytes"),
            ("extra B/elem/layer", "extra_bytes_per_element_per_layer:.3f"),
        ],
    )
    md += "\n### Targets (dropmask default impl, CPU, [4096, 4096])\n\n"
    md += (
        "Speed targets are medians of paired per-pass ratios: each pair times the short "
        "and long loops of both sides back to back (order alternating), so that load "
        "drifting on a shared machine cancels in each ratio; quartiles show the spread. "
        "The tables above time all contestants round-robin and can disagree with them by "
        "the machine's drift.\n\n"
    )
    md += markdown_table(
        target_rows,
        [("target", "target"), ("measured", "measured"), ("status", "status"), ("note", "note")],
    )
    if notes:
        md += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return {
        "speed": speed,
        "residuals": res_rows,
        "train_step": step_rows,
        "targets": target_rows,
        "paired_ratios": [{"dtype": d, "mode": m, **v} for (d, m), v in paired.items()],
        "notes": notes,
        "markdown": md,
    }
