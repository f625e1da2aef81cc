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

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from benchmarks import _contestants, _harness, _mlp
from benchmarks._contestants import DTYPES, FLAX, LIMIT, MODES, Contestant
from benchmarks._harness import interleaved_medians, markdown_table, per_pass_medians

SHAPES = ((1024, 1024), (2048, 2048), (4096, 4096))

# MLP train step for the temp-memory measurement.
MLP_BATCH = 1024
MLP_WIDTH = 1024
MLP_DROPOUT_LAYERS = 2

_LOOPS: dict[tuple[str, tuple[int, ...], str, str], _harness.Looped] = {}


def _loop(c: Contestant, shape: tuple[int, ...], dtype_name: str, mode: str) -> _harness.Looped:
    """``c``'s loops for one case, pass count probed once per run."""
    key = (c.name, shape, dtype_name, mode)
    if key not in _LOOPS:
        _LOOPS[key] = _contestants.loop(c, shape, dtype_name, mode)
    return _LOOPS[key]


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
    x, g = _contestants.inputs(shape, dtype)
    n = math.prod(shape)
    calls, loops = {}, {}
    for c in cs:
        aux = c.make_aux(dtype)
        calls[c.name] = (
            (_contestants.fwd_fn(c), (x, aux))
            if mode == "fwd"
            else (_contestants.fwd_bwd_fn(c), (x, aux, g))
        )
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
            check = _contestants.check_output(x, y, g if dx is not None else None, dx)
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
    res_rows = [_contestants.residuals(c, dtype) for dtype in DTYPES.values() for c in cs]
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


# --- tables ---------------------------------------------------------------------


def speed_tables(speed: list[dict[str, Any]], peak_gbps: float | None) -> str:
    dm = _contestants.dropmask_name()
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
    cs, notes = _contestants.contestants()
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
        "ratio toward 1). `x limit` = time / time of `x * c` measured the same way. "
        "Forward+backward keeps the two passes apart, as the layers between them in a "
        "network do (an optimization barrier over the output, the vjp residuals and the "
        "cotangent). The targets (`make bench`) use the loop.\n\n"
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
    if notes:
        md += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return {
        "speed": speed,
        "residuals": res_rows,
        "train_step": step_rows,
        "notes": notes,
        "markdown": md,
    }
