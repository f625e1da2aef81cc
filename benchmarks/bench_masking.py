"""Masking benchmarks: dropmask against the JAX / Flax code it replaces, in one run.

Each row times a jitted dropmask function and its anchor on the same inputs, forward
("fwd") and forward plus gradient ("fwd+bwd"), and reports ``ratio = dropmask /
anchor`` (below 1 is faster). The anchors are the usual hand-written forms, which
are wrong on empty rows (NaN or a uniform average) but set the speed to beat:

* ``masked_softmax``        vs ``jax.nn.softmax(x, where=mask)``
* ``masked_mean``           vs ``jnp.mean(x, axis=-1, where=mask)``
* ``masked_scan``           vs ``lax.scan`` with no mask (an RNN, time-major), and vs
  the usual hand-masked scan body (``where`` on carry and output)
* ``dot_product_attention`` vs ``flax.linen.dot_product_attention``

Timing: per pass, as in the dropout benchmark (``benchmarks/_harness.py``). Each
contestant runs in a ``fori_loop`` of passes inside one jit, and its time per pass is
the slope between a short and a long loop, so per-call costs (dispatch, copying the
inputs in, page-faulting fresh outputs) cancel. Each pass shifts the first input by
``i * eps`` (``eps`` a traced zero, so nothing can be hoisted out of the loop) and adds
the outputs to an accumulator; both contestants pay for that alike. The reported ratio
is the median of back-to-back pairs (``paired_per_pass_ratios``), so machine-load
drift cancels in each pair.

Usage: ``python -m benchmarks.bench_masking [--quick]``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dropmask as dm
from benchmarks._harness import Looped, looped, paired_per_pass_ratios, per_pass_medians, quartiles

Case = tuple[str, str, int, Callable[..., Any], Callable[..., Any], tuple[Any, ...]]


def _mask(rng: np.random.Generator, rows: int, cols: int) -> jax.Array:
    """Right padding with random lengths; every 16th row is empty (length 0)."""
    lengths = rng.integers(cols // 4, cols + 1, size=rows)
    lengths[::16] = 0
    return jnp.asarray(np.arange(cols) < lengths[:, None])


def _with_grad(f: Callable[..., jax.Array]) -> Callable[..., Any]:
    """``x, *rest -> (sum(f), d sum(f) / dx)``: a training step's worth of work."""
    return jax.value_and_grad(lambda x, *rest: jnp.sum(f(x, *rest)))


def _reduction_cases(rows: int, cols: int) -> list[Case]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, cols)), jnp.float32)
    mask = _mask(rng, rows, cols)
    n = rows * cols
    softmax = (dm.masked_softmax, lambda x, m: jax.nn.softmax(x, where=m))
    mean = (
        lambda x, m: dm.masked_mean(x, m, axis=-1),
        lambda x, m: jnp.mean(x, axis=-1, where=m),
    )
    return [
        ("masked_softmax fwd", "jax.nn.softmax(where=)", n, *softmax, (x, mask)),
        (
            "masked_softmax fwd+bwd",
            "jax.nn.softmax(where=)",
            n,
            _with_grad(softmax[0]),
            # The anchor's gradient is NaN on empty rows; zeroing the output keeps the
            # timing comparable without changing the work.
            _with_grad(lambda x, m: jnp.where(m, jax.nn.softmax(x, where=m), 0)),
            (x, mask),
        ),
        ("masked_mean fwd", "jnp.mean(where=)", n, *mean, (x, mask)),
        ("masked_mean fwd+bwd", "jnp.mean(where=)", n, *map(_with_grad, mean), (x, mask)),
    ]


def _scan_cases(steps: int, batch: int, hidden: int) -> list[Case]:
    rng = np.random.default_rng(1)
    xs = jnp.asarray(rng.normal(size=(steps, batch, hidden)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(hidden, hidden)) / np.sqrt(hidden), jnp.float32)
    mask = _mask(rng, batch, steps).T  # [time, batch]
    h0 = jnp.zeros((batch, hidden), jnp.float32)

    def cell(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(h @ w + x)
        return h, h

    def ours(xs: jax.Array, mask: jax.Array) -> jax.Array:
        return dm.masked_scan(cell, h0, xs, mask)[1]

    def anchor(xs: jax.Array, mask: jax.Array) -> jax.Array:
        del mask  # lax.scan ignores padding: the speed of doing no masking at all
        return lax.scan(cell, h0, xs)[1]

    def by_hand(xs: jax.Array, mask: jax.Array) -> jax.Array:
        """The usual recipe: where on the carry and the output, nothing on the inputs."""

        def body(h: jax.Array, inputs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, Any]:
            x, m = inputs
            new, y = cell(h, x)
            return jnp.where(m[:, None], new, h), jnp.where(m[:, None], y, 0)

        return lax.scan(body, h0, (xs, mask))[1]

    n = steps * batch * hidden
    return [
        ("masked_scan fwd", "lax.scan (unmasked)", n, ours, anchor, (xs, mask)),
        ("masked_scan fwd", "lax.scan, masked by hand", n, ours, by_hand, (xs, mask)),
        (
            "masked_scan fwd+bwd",
            "lax.scan (unmasked)",
            n,
            _with_grad(ours),
            _with_grad(anchor),
            (xs, mask),
        ),
        (
            "masked_scan fwd+bwd",
            "lax.scan, masked by hand",
            n,
            _with_grad(ours),
            _with_grad(by_hand),
            (xs, mask),
        ),
    ]


def _attention_cases(batch: int, length: int, heads: int, depth: int) -> list[Case]:
    rng = np.random.default_rng(2)
    shape = (batch, length, heads, depth)
    q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(3))
    valid = _mask(rng, batch, length)
    mask = dm.combine_masks(dm.attention_mask(valid, valid), dm.causal_mask(length))

    def ours(q: jax.Array, k: jax.Array, v: jax.Array, m: jax.Array) -> jax.Array:
        return dm.dot_product_attention(q, k, v, mask=m)

    def anchor(q: jax.Array, k: jax.Array, v: jax.Array, m: jax.Array) -> jax.Array:
        return nn.dot_product_attention(q, k, v, mask=m)

    n = q.size
    name = "flax.linen.dot_product_attention"
    return [
        ("dot_product_attention fwd", name, n, ours, anchor, (q, k, v, mask)),
        (
            "dot_product_attention fwd+bwd",
            name,
            n,
            _with_grad(ours),
            _with_grad(anchor),
            (q, k, v, mask),
        ),
    ]


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            *_reduction_cases(256, 512),
            *_scan_cases(64, 16, 32),
            *_attention_cases(2, 128, 4, 32),
        ]
    return [
        *_reduction_cases(1024, 1024),
        *_reduction_cases(4096, 1024),
        *_scan_cases(256, 64, 64),
        *_attention_cases(8, 256, 8, 64),
    ]


def _looped(f: Callable[..., Any], passes: int) -> Callable[..., Any]:
    """``passes`` calls of ``f`` inside one jit: ``(eps, *args) -> sum of f's outputs``."""

    def run(eps: jax.Array, first: jax.Array, *rest: Any) -> Any:
        shape = jax.eval_shape(f, first, *rest)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)

        def body(i: jax.Array, acc: Any) -> Any:
            out = f(first + i.astype(first.dtype) * eps.astype(first.dtype), *rest)
            return jax.tree.map(jnp.add, acc, out)

        return lax.fori_loop(0, passes, body, zeros)

    return jax.jit(run)


def _loop(f: Callable[..., Any], args: tuple[Any, ...]) -> Looped:
    return looped(lambda passes: _looped(f, passes), (jnp.zeros((), jnp.float32), *args))


def run(quick: bool = False) -> list[dict]:
    """Times every case per pass; prints a table; returns one row per case."""
    repeats, pairs = (3, 3) if quick else (7, 11)
    rows = []
    for name, anchor_name, n, ours, anchor, args in cases(quick):
        print(f"  masking {name} vs {anchor_name} [{n} elements] ...", flush=True)
        loops = {"ours": _loop(ours, args), "anchor": _loop(anchor, args)}
        seconds = per_pass_medians(loops, repeats=repeats)
        ratios = paired_per_pass_ratios(loops["ours"], loops["anchor"], repeats=pairs)
        q1, q2, q3 = quartiles(ratios)
        rows.append(
            {
                "name": name,
                "anchor": anchor_name,
                "n_elements": int(n),
                "dropmask_ms": seconds["ours"] * 1e3,
                "anchor_ms": seconds["anchor"] * 1e3,
                "ratio": q2,
                "ratio_quartiles": f"{q1:.2f}-{q3:.2f} ({len(ratios)} pairs)",
            }
        )
    _print_table(rows)
    return rows


def _print_table(rows: list[dict]) -> None:
    header = (
        f"{'case':32} {'anchor':34} {'elements':>10} {'dropmask ms':>12} "
        f"{'anchor ms':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:32} {r['anchor']:34} {r['n_elements']:>10} "
            f"{r['dropmask_ms']:>12.3f} {r['anchor_ms']:>10.3f} {r['ratio']:>6.2f}"
        )


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
