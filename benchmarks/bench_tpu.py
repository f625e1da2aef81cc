"""Dropout and attention on a TPU: TPU = CPU masks, per-call times, a train step, attention.

Run on a machine with a TPU (a v5e chip was measured), flax installed::

    python -m benchmarks.bench_tpu --out DIR [--quick] [--step-dtypes bfloat16,float32]
        [--parts checks,per_call,attention,step,models,anchors,short,mesh]
        [--model-rows none,residual,all,flax] [--check-ways default,kernel,XLA]

It writes ``DIR/tpu_results.json`` after each row, so a run cut short still reports what
it finished; ``python -m benchmarks.bench_tpu --render DIR/tpu_results.json [MORE ...]``
turns it into the ``tpu`` section of ``benchmarks/RESULTS.md``, where a row the run did
not reach reads "not run". ``--parts`` runs some parts only (to fit a run's time
limit); ``--render`` given several files takes each part from the last file that ran it,
and lists every run. What it measures, in order:

1. Checks: outputs of ``dropmask.dropout`` (and its gradient, ``keep_mask``, a traced
   rate, ``broadcast_dims``, ``vmap`` over keys, bf16/f16/complex, shapes the kernel
   serves and shapes that fall back) equal a CPU process's outputs for the same keys
   bit for bit, by the default path, the TPU kernel (``testing.tpu_kernels()``) and
   XLA's path (``testing.tpu_kernels(False)``), or the ways ``--check-ways`` names (on a
   v5e the three ways ran past 4 minutes; ``default`` alone compiles a third of the
   programs); the CPU process is this module with ``--reference`` under
   ``JAX_PLATFORMS=cpu``. And attention's dropped weights (``v`` the identity over
   keys, so the output is each query's weights, zero where dropped): on a TPU by its
   Pallas kernels, on the CPU by its dense path.
2. Per call at [8192, 8192], f32 and bf16, forward and forward + backward (``jax.vjp``
   with a fixed cotangent) in one program: ``x * c``, dropmask's default (on a TPU with
   one device, the kernel; rows say what ran), dropmask's XLA path and Flax's
   ``nn.Dropout`` under the threefry, rbg and unsafe_rbg key impls. Each is timed in a
   compiled loop whose every call reads the same input with its own key
   (``fold_in(key, i)``; ``x * c`` its own scale ``c[i % 2]``) and whose carry is the
   output: no call's operand is the carry, so XLA copies nothing a call would not. A
   call's time is the slope between loops of 2 and 12 calls (a run-time trip count, so
   one compilation serves both), medians of ``REPEATS``; beside it, for information,
   the median of ``DISPATCHES`` calls of ``jit(f)(x)`` after a warm-up.
3. A 4-layer Flax Transformer train step ([16, 1024, 1024], 16 heads, MLP 4096;
   ``bench_transformer_step``'s layer), bf16 (``--step-dtypes`` adds float32): without
   dropout, Flax's model with dropout on the residual and MLP branches only, on the
   attention weights only, and on both, and the first and last under
   ``swap_dropout(attention=False)`` (dropmask's default path; Flax's attention-weight
   dropout stays). Step time (each row paired with the step without dropout, in turn
   first and second per repeat), XLA's temporaries and compile time of the looped step;
   the rows cheapest to compile first. And Flax's full model under
   ``swap_dropout(attention=True)``: dropmask's attention too (on a TPU, its Pallas
   kernels), and Flax's residual-only model so swapped (the kernels' cost without
   attention dropout).
4. Attention, bf16 [1, L, 8, 128] for L = 4096, 8192 and 32768, causal, dropout on the
   weights, forward + backward in one program: dropmask's ``"auto"`` (on a TPU, its
   Pallas kernels) with one mask for every head (Flax's default) and with a mask per
   head, JAX's Pallas TPU flash attention without dropout and Flax's dense
   ``dot_product_attention`` with dropout (up to 8192 tokens): time and temporaries.
5. Models: the step of 3. at the shapes TPU models have (``MODEL_SHAPES``: ViT-B/16's
   197 tokens, BERT-base, a short sequence, GPT-2 small, and 3.'s own), bf16, and f32
   for ViT-B and BERT-base: without dropout, swapped residual-only, swapped with
   dropmask's attention too, and Flax's full dropout (``--model-rows`` picks some),
   every dtype's bf16 rows first.
6. Anchors: attention against the public kernels a TPU user would pick, at tuned
   tiles: splash attention with its fused backward kernel and JAX's flash attention,
   each with every block 1024 and 512 (splash at 1024 also computing 512 and 256 keys
   at once, ``SPLASH_COMPUTE``), against dropmask with and without dropout;
   causal depth 128 at 4096, 8192 and 32768 tokens, and at 8192 depth 64, full
   attention and 8 query heads over 2 (``ANCHOR_CASES``): time, temporaries and the
   share of the chip's bf16 peak.
6b. Short attention: the lengths the models of 5. attend over and a little beyond,
   bf16 [16, L, 8, 64] causal for L = 128, 197, 256, 512, 1024 and 2048 (and float32
   at 197 and 512), dropout on the weights with a mask per head, forward + backward:
   dropmask's ``"auto"`` (its path named), its dense path, its TPU kernels and Flax's
   dense ``dot_product_attention`` with dropout, timed in rotating rounds against each
   other; time, temporaries and compile time.
7. Mesh: attention and the step (at 1024 tokens and at ViT-B/16's shape, whose
   attention is the dense path) over a one-device mesh of explicit axes against the
   same programs unsharded.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dropmask
from benchmarks._harness import environment, environment_markdown, markdown_table, write_section
from dropmask import testing
from dropmask.cli import OneLineParser

SECTION = "tpu"
REPEATS = 15
DISPATCHES = 25
SHAPE, QUICK_SHAPE = (8192, 8192), (256, 1024)
RATE = 0.1
STEP = {"batch": 16, "length": 1024, "width": 1024, "heads": 16, "mlp_dim": 4096, "layers": 4}
QUICK_STEP = {"batch": 2, "length": 64, "width": 128, "heads": 2, "mlp_dim": 256, "layers": 2}
DTYPES = ("float32", "bfloat16")
STEP_DTYPES = ("bfloat16",)
IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
KERNEL, BYTES, XLA = "TPU kernel", "TPU bytes, XLA's select", "XLA path"
# The kernels' primitives as a jaxpr names them: how a row tells what drew its masks.
PATH_PRIMITIVES = {"dropmask_tpu_masked_linear": KERNEL, "dropmask_tpu_bytes_linear": BYTES}


def dropout_path(f: Callable[..., Any], *args: Any) -> str:
    """What draws and applies dropmask's dropout masks in ``f``: ``KERNEL``, ``BYTES``
    (both, joined by " + "), or ``XLA``, read from the traced program."""
    text = str(jax.make_jaxpr(f)(*args))
    return " + ".join(v for k, v in PATH_PRIMITIVES.items() if k in text) or XLA


def drawn_by(differentiated: bool = False) -> str:
    """What draws ``dropmask.dropout``'s mask here by default (:func:`dropout_path`),
    called alone or, with ``differentiated``, under ``jax.grad``."""
    key, x = jax.random.key(0), jnp.ones((32, 1024))
    f = lambda x: jnp.sum(dropmask.dropout(x, RATE, key))  # noqa: E731
    return dropout_path(jax.grad(f) if differentiated else f, x)


# --- 1. checks ------------------------------------------------------------------------


def _check_cases() -> dict[str, Callable[[], Any]]:
    """Named computations whose outputs must be equal on the TPU and on a CPU."""
    key = jax.random.key(11)

    def ones(shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jnp.ones(shape, dtype)

    def grad_of(shape: tuple[int, ...]) -> jax.Array:
        # Small integers: a cotangent that every backend computes exactly.
        w = (jnp.arange(np.prod(shape), dtype=jnp.float32) % 7 - 3).reshape(shape)
        loss = lambda x: jnp.sum(dropmask.dropout(x, RATE, key) * w)  # noqa: E731
        return jax.grad(loss)(jnp.ones(shape))

    cases: dict[str, Callable[[], Any]] = {}
    shapes = [(8, 256, 1024), (4, 64, 5120), (32, 128), (3, 100), (7, 96), (2, 1, 4096)]
    for shape in [*shapes, (2, 197, 768), (2, 5, 77, 200)]:
        for dtype in ("float32", "bfloat16"):
            cases[f"dropout {shape} {dtype}"] = lambda s=shape, d=dtype: dropmask.dropout(
                ones(s, d), RATE, key
            )
    cases["dropout f16 (64, 1024)"] = lambda: dropmask.dropout(
        ones((64, 1024), "float16"), RATE, key
    )
    cases["dropout complex64 (64, 1024)"] = lambda: dropmask.dropout(
        ones((64, 1024), "complex64"), RATE, key
    )
    cases["traced rate 0.3 (8, 256, 1024)"] = lambda: jax.jit(
        lambda r: dropmask.dropout(ones((8, 256, 1024)), r, key)
    )(jnp.float32(0.3))
    cases["broadcast_dims=(1,) (8, 256, 1024)"] = lambda: dropmask.dropout(
        ones((8, 256, 1024)), RATE, key, broadcast_dims=(1,)
    )
    cases["keep_mask (64, 2048)"] = lambda: dropmask.keep_mask(key, (64, 2048), RATE)
    cases["vmap over keys (4, 64, 1024)"] = lambda: jax.vmap(
        lambda k: dropmask.dropout(ones((64, 1024)), RATE, k)
    )(jax.random.split(key, 4))
    cases["grad (8, 256, 1024)"] = lambda: grad_of((8, 256, 1024))
    cases["grad (3, 100)"] = lambda: grad_of((3, 100))
    cases["grad (4, 197, 768)"] = lambda: grad_of((4, 197, 768))

    def dropped(rate: Any, one_mask: bool, length: int = 1024, **tiles: Any) -> jax.Array:
        # v the identity over keys: the output is each query's weights, 0 where dropped.
        b, h, d = 1, 2, 64
        q, k = jax.random.normal(jax.random.key(12), (2, b, length, h, d))
        v = jnp.broadcast_to(jnp.eye(length)[None, :, None], (b, length, h, length))
        out = dropmask.dot_product_attention(
            q,
            k,
            v,
            dropout_rate=rate,
            key=key,
            deterministic=False,
            broadcast_dropout=one_mask,
            **tiles,
        )
        return out != 0

    for one_mask, label in ((True, "one mask"), (False, "a mask per head")):
        cases[f"attention dropped weights, {label} (1, 1024, 2, 64)"] = lambda m=one_mask: dropped(
            RATE, m
        )
    # 197 tokens take the dense path, whose kept mask the dropout kernel draws as bytes.
    cases["attention dropped weights, a mask per head (1, 197, 2, 64)"] = lambda: dropped(
        RATE, False, 197
    )
    # Query tiles of 128 and key tiles under 1024: the kernels draw with the rows along
    # lanes (the default tiles at 1024 tokens do not).
    cases["attention dropped weights, 128 x 256 tiles (1, 512, 2, 64)"] = lambda: dropped(
        RATE, False, 512, algorithm="pallas", block_q=128, block_k=256
    )
    cases["attention dropped weights, traced rate 0.3"] = lambda: jax.jit(
        lambda r: dropped(r, True)
    )(jnp.float32(0.3))
    # Computed on the host's CPU (a TPU host's evaluation, data preparation): lowered for
    # the CPU, the kernels' programs take the CPU's paths.
    cases["on the host's CPU: dropout (8, 256, 1024)"] = lambda: on_host_cpu(
        lambda: dropmask.dropout(ones((8, 256, 1024)), RATE, key)
    )
    cases["on the host's CPU: attention dropped weights, a mask per head"] = lambda: on_host_cpu(
        lambda: dropped(RATE, False)
    )
    # A one-device mesh of explicit axes, the arrays placed by NamedSharding.
    cases["one-device mesh: dropout (8, 256, 1024)"] = lambda: on_mesh(
        lambda x: dropmask.dropout(x, RATE, key), ones((8, 256, 1024))
    )
    cases["one-device mesh: grad (8, 256, 1024)"] = lambda: on_mesh(
        lambda x: grad_of(x.shape), ones((8, 256, 1024))
    )

    def shared_grad(x: jax.Array) -> jax.Array:  # a mask shared along the rows
        w = (jnp.arange(x.size, dtype=jnp.float32) % 7 - 3).reshape(x.shape)
        loss = lambda x: jnp.sum(dropmask.dropout(x, RATE, key, broadcast_dims=(1,)) * w)  # noqa: E731
        return jax.grad(loss)(x)

    cases["one-device mesh: grad broadcast_dims=(1,) (8, 256, 1024)"] = lambda: on_mesh(
        shared_grad, ones((8, 256, 1024))
    )
    # Inside shard_map the dropout kernel draws and selects at once, whatever path the
    # default takes for a whole mask.
    cases["inside shard_map: dropout (2, 197, 768) bfloat16"] = lambda: in_shard_map(
        lambda x: dropmask.dropout(x, RATE, key), ones((2, 197, 768), "bfloat16")
    )
    cases["inside shard_map: grad (4, 197, 768)"] = lambda: in_shard_map(
        lambda x: grad_of(x.shape), ones((4, 197, 768))
    )
    # A float32 user's context: the kernels' bfloat16 products must not take it (Mosaic
    # refuses a float32 contraction of bfloat16 operands).
    highest = functools.partial(jax.default_matmul_precision, "highest")
    cases["default precision highest: dropout (8, 256, 1024) bfloat16"] = lambda: _within(
        highest, lambda: dropmask.dropout(ones((8, 256, 1024), "bfloat16"), RATE, key)
    )
    cases["default precision highest: grad (4, 197, 768)"] = lambda: _within(
        highest, lambda: grad_of((4, 197, 768))
    )
    cases["default precision highest: attention dropped weights (1, 1024, 2, 64)"] = lambda: (
        _within(highest, lambda: dropped(RATE, True))
    )
    return cases


def _within(context: Callable[[], Any], f: Callable[[], Any]) -> Any:
    """``f()`` inside a fresh ``context()``."""
    with context():
        return f()


def on_host_cpu(fn: Callable[[], Any]) -> Any:
    """``fn()`` computed on this host's CPU, its result as NumPy; raises unless it lies
    there."""
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        out = jax.jit(fn)()
    if out.devices() != {cpu}:
        raise AssertionError(f"computed on {out.devices()}, not the host's CPU")
    return np.asarray(out)


def one_device_mesh() -> jax.sharding.Mesh:
    """A mesh of one device and one explicit axis, ``"data"``."""
    return jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))


def on_mesh(fn: Callable[..., Any], *args: jax.Array) -> Any:
    """``fn(*args)`` jitted over a one-device mesh, the arrays placed by ``NamedSharding``
    (the first axis over ``"data"``)."""
    mesh = one_device_mesh()
    spec = jax.sharding.PartitionSpec("data")
    with jax.set_mesh(mesh):
        placed = [jax.device_put(a, jax.sharding.NamedSharding(mesh, spec)) for a in args]
        return np.asarray(jax.jit(fn)(*placed))


def in_shard_map(fn: Callable[..., Any], *args: jax.Array) -> Any:
    """``fn(*args)`` jitted inside ``shard_map`` over a one-device mesh, every array whole
    on it."""
    spec = jax.sharding.PartitionSpec()
    mapped = jax.shard_map(fn, mesh=one_device_mesh(), in_specs=spec, out_specs=spec)
    return np.asarray(jax.jit(mapped)(*args))


def _bits(x: Any) -> np.ndarray:
    """An output as unsigned integers of its width: ``.npz`` keeps no bfloat16, and bits
    compare NaN and -0.0 exactly."""
    x = np.asarray(x)
    return x.view(f"uint{8 * x.dtype.itemsize}") if x.dtype != bool else x


def reference(path: str) -> None:
    """The check cases' outputs on this process's backend, as bits, saved to ``path``."""
    out = {name: _bits(fn()) for name, fn in _check_cases().items()}
    np.savez(path, **{str(i): v for i, v in enumerate(out.values())}, names=np.array(list(out)))


CHECK_WAYS = {  # how the checks draw: the context each way's cases are traced in
    "default": contextlib.nullcontext,
    "kernel": lambda: testing.tpu_kernels(True),
    "XLA": lambda: testing.tpu_kernels(False),
}


def checks(out_dir: Path, ways: tuple[str, ...] = tuple(CHECK_WAYS)) -> dict[str, Any]:
    """Each case's output on this backend, by each of ``ways`` (``CHECK_WAYS``' names),
    against a CPU process's: ``{case: {way: same bits}}``."""
    ref_path = out_dir / "cpu_reference.npz"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "benchmarks.bench_tpu", "--reference", str(ref_path)]
    subprocess.run(cmd, check=True, env=env)
    ref = np.load(ref_path)
    want = {name: ref[str(i)] for i, name in enumerate(ref["names"])}
    results: dict[str, Any] = {name: {} for name in want}
    for way in ways:
        with CHECK_WAYS[way]():
            for name, fn in _check_cases().items():
                got = _bits(fn())
                same = got.shape == want[name].shape and np.array_equal(got, want[name])
                results[name][way] = bool(same)
    return results


# --- 2. per call ----------------------------------------------------------------------

Contestant = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
"""``(x, i, c) -> y``: call ``i`` on ``x``. ``c`` holds ``x * c``'s two equal scales as
an argument, so that XLA can neither fold ``c[i % 2]`` nor hoist it out of the loop."""

X_C, DEFAULT, XLA_ROW = "x * c", "dropmask default", "dropmask XLA path, tpu_kernels(False)"
FLAX_ROWS = tuple(f"flax {impl}" for impl in IMPLS)
PER_CALL_ROWS = (X_C, DEFAULT, XLA_ROW, *FLAX_ROWS)


def _flax_dropout(impl: str) -> Contestant:
    import flax.linen as nn

    key = jax.random.key(3, impl=impl)
    layer = nn.Dropout(RATE, deterministic=False)
    return lambda x, i, c: layer.apply({}, x, rngs={"dropout": jax.random.fold_in(key, i)})


def per_call_contestants() -> dict[str, Contestant]:
    """The contestants, by row name; ``XLA_ROW`` is ``DEFAULT`` traced inside
    ``testing.tpu_kernels(False)``."""
    key = jax.random.key(3)

    def dropout(x: jax.Array, i: jax.Array, c: jax.Array) -> jax.Array:
        del c
        return dropmask.dropout(x, RATE, jax.random.fold_in(key, i))

    out: dict[str, Contestant] = {X_C: lambda x, i, c: x * c[i % 2], DEFAULT: dropout}
    out[XLA_ROW] = dropout
    for impl, name in zip(IMPLS, FLAX_ROWS, strict=True):
        out[name] = _flax_dropout(impl)
    return out


def _way(name: str) -> contextlib.AbstractContextManager[None]:
    """The context a contestant is traced in."""
    return testing.tpu_kernels(False) if name == XLA_ROW else contextlib.nullcontext()


def _slope(run: Callable[[int], Any], reps: int) -> float:
    """Milliseconds per call: the slope between 2 and 12 calls, median of ``reps``, after
    a call that compiles."""
    jax.block_until_ready(run(2))

    def timed(n: int) -> float:
        t = time.perf_counter()
        jax.block_until_ready(run(n))
        return time.perf_counter() - t

    short = [timed(2) for _ in range(reps)]
    long = [timed(12) for _ in range(reps)]
    return (float(np.median(long)) - float(np.median(short))) / 10 * 1e3


def _looped(f: Callable[..., Any], *args: Any) -> Callable[[int], Any]:
    """``n ->`` the last of ``f(i, *args)`` for ``i < n``, one compiled loop: every call
    reads the same ``args``, and its output, the loop's carry, is no call's operand."""

    def run(n: jax.Array, *args: Any) -> Any:
        out = jax.eval_shape(f, jnp.int32(0), *args)
        init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out)
        return lax.fori_loop(0, n, lambda i, _: f(i, *args), init)

    loop = jax.jit(run)
    return lambda n: loop(jnp.int32(n), *args)


def _dispatch_ms(f: Callable[..., Any], *args: Any) -> float:
    """Milliseconds of one call of ``jit(f)(0, *args)``: the median of ``DISPATCHES``
    after a warm-up."""
    call = jax.jit(f)
    jax.block_until_ready(call(jnp.int32(0), *args))
    times = []
    for _ in range(DISPATCHES):
        t = time.perf_counter()
        jax.block_until_ready(call(jnp.int32(0), *args))
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def per_call_rows(shape: tuple[int, ...], reps: int) -> Iterator[dict[str, Any]]:
    """One row per dtype and contestant: loop slopes and one-call medians, in ms."""
    for dtype in DTYPES:
        x = jax.random.normal(jax.random.key(0), shape, dtype)
        g = jax.random.normal(jax.random.key(1), shape, dtype)
        c = jnp.full((2,), 1 / (1 - RATE), dtype)
        for name, f in per_call_contestants().items():

            def forward(i: jax.Array, x: jax.Array, c: jax.Array, f: Contestant = f) -> Any:
                return f(x, i, c)

            def both(
                i: jax.Array, x: jax.Array, g: jax.Array, c: jax.Array, f: Contestant = f
            ) -> Any:
                y, vjp = jax.vjp(lambda x: f(x, i, c), x)
                return y, vjp(g)[0]

            row: dict[str, Any] = {"dtype": dtype, "name": name}
            with _way(name):
                if name == DEFAULT:
                    alone, differentiated = drawn_by(), drawn_by(differentiated=True)
                    row["path"] = alone
                    if differentiated != alone:
                        row["path"] += f"; differentiated: {differentiated}"
                row["forward_ms"] = _slope(_looped(forward, x, c), reps)
                row["fwd_bwd_ms"] = _slope(_looped(both, x, g, c), reps)
                row["dispatch_forward_ms"] = _dispatch_ms(forward, x, c)
                row["dispatch_fwd_bwd_ms"] = _dispatch_ms(both, x, g, c)
            print(row, flush=True)
            yield row


# --- 3. train step --------------------------------------------------------------------

NO_DROPOUT, FLAX_RESIDUAL, SWAPPED_RESIDUAL = (
    "no dropout",
    "flax residual-only",
    "swapped residual-only",
)
FLAX_FULL, SWAPPED_FULL, FLAX_ATTENTION = "flax full", "swapped full", "flax attention-only"
SWAPPED_ALL = "swapped full, attention too"
SWAPPED_ATTENTION_PATH = "swapped residual-only, attention too"
# name: (rate of the residual and MLP dropouts, rate of the attention weights' dropout,
# None, or the ``attention`` argument of the swap_dropout Flax's model is traced under);
# cheapest to compile first, so that a run cut short has the rows the targets need.
STEP_ROWS = {
    NO_DROPOUT: (0.0, 0.0, None),
    SWAPPED_RESIDUAL: (RATE, 0.0, False),
    SWAPPED_ALL: (RATE, RATE, True),
    SWAPPED_ATTENTION_PATH: (RATE, 0.0, True),
    SWAPPED_FULL: (RATE, RATE, False),
    FLAX_ATTENTION: (0.0, RATE, None),
    FLAX_RESIDUAL: (RATE, 0.0, None),
    FLAX_FULL: (RATE, RATE, None),
}


def _step_ms(exe: Any, params: Any, x: jax.Array) -> float:
    """Milliseconds per step of a compiled loop of steps: the slope between 2 and 6."""
    times = {}
    for n in (2, 6):
        t = time.perf_counter()
        jax.block_until_ready(exe(jnp.int32(n), params, x, jax.random.key(2)))
        times[n] = time.perf_counter() - t
    return (times[6] - times[2]) / 4 * 1e3


def step_rows(
    size: dict[str, int],
    reps: int,
    dtypes: tuple[str, ...] = STEP_DTYPES,
    *,
    names: tuple[str, ...] | None = None,
    mesh: Any = None,
) -> Iterator[dict[str, Any]]:
    """One row per dtype and ``STEP_ROWS`` entry (or those ``names``), in that order: step
    ms (each row's repeats paired with the step without dropout, which runs first in
    even repeats and second in odd ones), XLA's temporaries and the looped step's
    compile time. With ``mesh`` each step is also compiled over it, the batch placed by
    ``NamedSharding`` and the parameters replicated, and timed in turn with the plain
    one (``mesh_ms``, ``mesh_ratio``: mesh / plain)."""
    import flax.linen as nn

    from benchmarks import bench_transformer_step as ts
    from benchmarks.bench_swap import swapped

    class Encoder(nn.Module):
        rate: float
        attention_rate: float
        dtype: Any

        @nn.compact
        def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
            for _ in range(size["layers"]):
                x = ts.EncoderLayer(
                    ts.FLAX,
                    self.rate,
                    size["heads"],
                    size["mlp_dim"],
                    self.dtype,
                    attention_rate=self.attention_rate,
                )(x, deterministic)
            return x

    for dtype in dtypes:
        shape = (size["batch"], size["length"], size["width"])
        x = jax.random.normal(jax.random.key(0), shape, dtype)
        params = Encoder(0.0, 0.0, dtype).init(jax.random.key(1), x, True)["params"]
        base = None
        for name, (rate, attention_rate, swap) in STEP_ROWS.items():
            if names is not None and name not in names:
                continue
            step = ts.step_fn(Encoder(rate, attention_rate, dtype))  # pyright: ignore[reportArgumentType]
            if swap is not None:
                step = swapped(step, attention=swap)
            run = lambda n, p, x, k, step=step: lax.fori_loop(  # noqa: E731
                0, n, lambda i, p: step(p, x, jax.random.fold_in(k, i)), p
            )
            t = time.perf_counter()
            exe = jax.jit(run).lower(jnp.int32(2), params, x, jax.random.key(2)).compile()
            row: dict[str, Any] = {
                "dtype": dtype,
                "name": name,
                "compile_s": time.perf_counter() - t,
                "temp_mib": temp_mib(exe),
            }
            if swap is not None:
                row["path"] = dropout_path(step, params, x, jax.random.key(2))
            if swap:
                row["attention_path"] = attention_path(step, params, x, jax.random.key(2))
            if base is None:
                base = exe
                row["step_ms"] = float(np.median([_step_ms(exe, params, x) for _ in range(reps)]))
            else:
                mine, theirs = [], []
                for r in range(reps):
                    if r % 2 == 0:
                        theirs.append(_step_ms(base, params, x))
                    mine.append(_step_ms(exe, params, x))
                    if r % 2 == 1:
                        theirs.append(_step_ms(base, params, x))
                row["step_ms"] = float(np.median(mine))
                row["baseline_ms"] = float(np.median(theirs))
                row["ratio"] = float(np.median(np.array(mine) / np.array(theirs)))
            if mesh is not None:
                with_dropmask = step if swap is not None else None
                row.update(_step_on_mesh(mesh, run, exe, params, x, reps, with_dropmask))
            print(row, flush=True)
            yield row


MODEL_SHAPES = {  # the step's size per model shape; 4 layers each, as the step part
    "ViT-B/16": {"batch": 64, "length": 197, "width": 768, "heads": 12, "mlp_dim": 3072},
    "BERT-base": {"batch": 32, "length": 512, "width": 768, "heads": 12, "mlp_dim": 3072},
    "short": {"batch": 8, "length": 128, "width": 768, "heads": 12, "mlp_dim": 3072},
    "GPT-2 small": {"batch": 16, "length": 1024, "width": 768, "heads": 12, "mlp_dim": 3072},
    "wide": {"batch": 16, "length": 1024, "width": 1024, "heads": 16, "mlp_dim": 4096},
}
QUICK_MODEL_SHAPES = {
    "ViT-like": {"batch": 2, "length": 13, "width": 128, "heads": 2, "mlp_dim": 256},
}
MODEL_DTYPES = {"ViT-B/16": ("bfloat16", "float32"), "BERT-base": ("bfloat16", "float32")}
# --model-rows' short names: the step rows a model shape runs, cheapest to compile first
MODEL_ROWS = {
    "none": NO_DROPOUT,
    "residual": SWAPPED_RESIDUAL,
    "all": SWAPPED_ALL,
    "flax": FLAX_FULL,
}


def model_rows(
    shapes: dict[str, dict[str, int]], reps: int, names: tuple[str, ...] | None = None
) -> Iterator[dict[str, Any]]:
    """``step_rows`` at each model shape (``MODEL_DTYPES``' dtypes, else bfloat16), each
    row tagged with its model's name."""
    for dtype in ("bfloat16", "float32"):  # every model's bfloat16 rows first
        for model, size in shapes.items():
            if dtype in MODEL_DTYPES.get(model, STEP_DTYPES):
                rows = names or tuple(MODEL_ROWS.values())
                for row in step_rows({**size, "layers": 4}, reps, (dtype,), names=rows):
                    yield {"model": model, **row}


def _step_on_mesh(
    mesh: Any, run: Any, plain: Any, params: Any, x: jax.Array, reps: int, step: Any = None
) -> dict[str, Any]:
    """The looped step compiled over ``mesh`` (the batch over ``"data"``, the parameters
    replicated), timed in turn with ``plain``; with ``step`` (a row with dropmask's
    dropout), what draws its masks over the mesh (``mesh_path``)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    out: dict[str, Any] = {}
    with jax.set_mesh(mesh):
        placed_params = jax.device_put(params, NamedSharding(mesh, P()))
        placed_x = jax.device_put(x, NamedSharding(mesh, P("data")))
        exe = jax.jit(run).lower(jnp.int32(2), placed_params, placed_x, jax.random.key(2))
        exe = exe.compile()
        if step is not None:
            out["mesh_path"] = dropout_path(step, placed_params, placed_x, jax.random.key(2))
    ms, mesh_ms, ratio = _paired_ms(
        lambda: _step_ms(plain, params, x), lambda: _step_ms(exe, placed_params, placed_x), reps
    )
    return {**out, "plain_ms": ms, "mesh_ms": mesh_ms, "mesh_ratio": ratio}


# --- 4. attention ----------------------------------------------------------------------

FLASH_NAME = "dropmask_flash_fwd"  # the forward kernel's name in a jaxpr
ATTENTION_LENGTHS = (4096, 8192, 32768)
QUICK_ATTENTION_LENGTHS = (256,)
DENSE_MAX = 8192  # Flax's dense weights at 32768 tokens alone exceed the chip's memory
ATTENTION_SHAPE = {"batch": 1, "heads": 8, "depth": 128}
AUTO, AUTO_PER_HEAD, JAX_FLASH, FLAX_DENSE = (
    "dropmask (auto)",
    "dropmask (auto), a mask per head",
    "JAX's Pallas TPU flash attention, no dropout",
    "Flax dot_product_attention (dense)",
)


def attention_path(f: Callable[..., Any], *args: Any) -> str:
    """What computed dropmask's attention in ``f``: the Pallas TPU kernels or XLA."""
    return "TPU kernels" if FLASH_NAME in str(jax.make_jaxpr(f)(*args)) else "XLA"


ATTENTION_SEED = 4  # every attention contestant's dropout key


def dropmask_attention(one_mask: bool, algorithm: str = "auto") -> Callable[..., Any]:
    """dropmask's causal attention, dropout ``RATE``, one mask for every head or one per
    head, by ``algorithm``."""
    key = jax.random.key(ATTENTION_SEED)
    return lambda q, k, v: dropmask.dot_product_attention(
        q,
        k,
        v,
        is_causal=True,
        dropout_rate=RATE,
        key=key,
        deterministic=False,
        broadcast_dropout=one_mask,
        algorithm=algorithm,  # pyright: ignore[reportArgumentType]
    )


def flax_attention(one_mask: bool) -> Callable[..., Any]:
    """Flax's dense causal attention, dropout ``RATE``, one mask or one per head."""
    import flax.linen as nn

    key = jax.random.key(ATTENTION_SEED)

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        mask = nn.make_causal_mask(jnp.ones((1, q.shape[1])))
        return nn.dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            dropout_rng=key,
            dropout_rate=RATE,
            deterministic=False,
            broadcast_dropout=one_mask,
        )

    return attend


def attention_contestants(length: int) -> dict[str, Callable[..., Any]]:
    """``(q, k, v) -> out`` for ``[batch, length, heads, depth]`` inputs, causal, with
    attention dropout at ``RATE`` (JAX's kernel: none)."""
    out: dict[str, Callable[..., Any]] = {
        AUTO: dropmask_attention(True),
        AUTO_PER_HEAD: dropmask_attention(False),
    }
    if jax.default_backend() == "tpu":
        from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

        def heads_first(x: jax.Array) -> jax.Array:
            return x.transpose(0, 2, 1, 3)

        def jax_flash(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            scale = q.shape[-1] ** -0.5
            o = flash_attention(*map(heads_first, (q, k, v)), causal=True, sm_scale=scale)
            return heads_first(o)

        out[JAX_FLASH] = jax_flash
    if length <= DENSE_MAX:
        out[FLAX_DENSE] = flax_attention(True)
    return out


def temp_mib(exe: Any) -> float:
    """A compiled program's temporaries by XLA's memory analysis, MiB (0 where the
    backend reports none)."""
    return int(getattr(exe.memory_analysis(), "temp_size_in_bytes", 0)) / 2**20


def _median_ms(exe: Any, args: tuple[Any, ...], reps: int) -> float:
    """The median of ``reps`` calls of a compiled program after a warm-up call, ms."""
    jax.block_until_ready(exe(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(exe(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def attention_rows(lengths: tuple[int, ...], reps: int) -> Iterator[dict[str, Any]]:
    """Forward + backward of each contestant in one program, bf16: the median of
    ``reps`` calls of the compiled program after a warm-up, and XLA's temporaries."""
    s = ATTENTION_SHAPE
    for length in lengths:
        shape = (s["batch"], length, s["heads"], s["depth"])
        keys = jax.random.split(jax.random.key(length), 4)
        q, k, v, g = (jax.random.normal(kk, shape, jnp.bfloat16) for kk in keys)
        for name, f in attention_contestants(length).items():

            def loss(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, f=f) -> jax.Array:
                return jnp.sum((f(q, k, v) * g).astype(jnp.float32))

            grads = jax.grad(loss, argnums=(0, 1, 2))
            row: dict[str, Any] = {"length": length, "name": name}
            if name in (AUTO, AUTO_PER_HEAD):
                row["path"] = attention_path(f, q, k, v)
            exe = jax.jit(grads).lower(q, k, v, g).compile()
            row["temp_mib"] = temp_mib(exe)
            row["fwd_bwd_ms"] = _median_ms(exe, (q, k, v, g), reps)
            print(row, flush=True)
            yield row


# --- against the public kernels at tuned tiles -------------------------------------------

ANCHOR_LENGTHS = (4096, 8192, 32768)
# name: (head depth, causal, key-value heads, lengths); 8 query heads, batch 1, bf16
ANCHOR_CASES = {
    "causal, depth 128": (128, True, 8, ANCHOR_LENGTHS),
    "causal, depth 64": (64, True, 8, (8192,)),
    "full, depth 128": (128, False, 8, (8192,)),
    "causal, depth 128, 8 query heads over 2": (128, True, 2, (8192,)),
}
QUICK_ANCHOR_CASES = {"causal, depth 128": (128, True, 8, (512,))}
ANCHOR_HEADS = 8
ANCHOR_TILES = (1024, 512)
# Splash attention's 1024 tiles computed in pieces too, as dropmask's kernels compute
# theirs (``_flash_tpu_plan.FORWARD_CHUNK``): its own knob for it, tuned alike.
SPLASH_COMPUTE = (512, 256)
OURS_DROPOUT, OURS_PLAIN = "dropmask (auto), dropout 0.1", "dropmask (auto), no dropout"
V5E_BF16_PEAK = 197e12  # FLOP/s, a v5e chip's bf16 matrix peak


def splash_name(tile: int, compute: int | None = None) -> str:
    name = f"splash attention, fused backward, {tile} tiles"
    return name if compute is None else f"{name}, {compute} keys computed at once"


def jax_flash_name(tile: int) -> str:
    return f"JAX's flash attention, {tile} tiles"


def attention_flops(length: int, depth: int, causal: bool, heads: int = ANCHOR_HEADS) -> float:
    """Forward + backward matrix FLOPs: the forward's two products (4 L^2 D a head, half
    of it where causal), and 2.5 times that backward (dV, dP, dS k and dS^T q; the
    scores again), 3.5 times the forward in all."""
    forward = 4 * length * length * depth * heads * (0.5 if causal else 1.0)
    return 3.5 * forward


def _splash(
    length: int, depth: int, causal: bool, kv_heads: int, tile: int, compute: int | None = None
) -> Callable[..., Any]:
    """Splash attention on ``[batch, L, heads, depth]`` inputs, fused backward, ``tile``
    for every block (clamped to ``length``), its key blocks computed ``compute`` keys at
    a time where given (``block_kv_compute``, ``block_kv_dkv_compute``); grouped heads by
    its MQA kernel per key-value head. Interpreted off a TPU."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    t = min(tile, length)
    c = t if compute is None else min(compute, t)
    sizes = sk.BlockSizes(
        block_q=t,
        block_kv=t,
        block_kv_compute=c,
        block_q_dkv=t,
        block_kv_dkv=t,
        block_kv_dkv_compute=c,
        use_fused_bwd_kernel=True,
    )
    groups = ANCHOR_HEADS // kv_heads
    one = sm.CausalMask((length, length)) if causal else sm.FullMask((length, length))
    mask = sm.MultiHeadMask([one] * (groups if kv_heads < ANCHOR_HEADS else ANCHOR_HEADS))
    interpret = jax.default_backend() != "tpu"
    make = sk.make_splash_mqa if kv_heads < ANCHOR_HEADS else sk.make_splash_mha
    kernel = make(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        q = q * jnp.asarray(depth**-0.5, q.dtype)
        b, length_, _, d = q.shape
        if kv_heads == ANCHOR_HEADS:  # [b, h, L, d] each
            o = jax.vmap(kernel)(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)))
            return o.transpose(0, 2, 1, 3)
        qg = q.reshape(b, length_, kv_heads, groups, d).transpose(0, 2, 3, 1, 4)
        kg, vg = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [b, kv, L, d]
        o = jax.vmap(jax.vmap(kernel))(qg, kg, vg)  # [b, kv, groups, L, d]
        return o.transpose(0, 3, 1, 2, 4).reshape(b, length_, ANCHOR_HEADS, d)

    return attend


def _jax_flash(length: int, depth: int, causal: bool, tile: int) -> Callable[..., Any]:
    """JAX's Pallas TPU flash attention with every block ``tile`` (clamped)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    t = min(tile, length)
    sizes = fa.BlockSizes(
        block_q=t,
        block_k_major=t,
        block_k=t,
        block_b=1,
        block_q_major_dkv=t,
        block_k_major_dkv=t,
        block_k_dkv=t,
        block_q_dkv=t,
        block_k_major_dq=t,
        block_k_dq=t,
        block_q_dq=t,
    )

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        heads_first = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
        o = fa.flash_attention(
            *map(heads_first, (q, k, v)),
            causal=causal,
            sm_scale=depth**-0.5,
            block_sizes=sizes,
        )
        return heads_first(o)

    return attend


def anchor_contestants(
    length: int, depth: int, causal: bool, kv_heads: int
) -> dict[str, Callable[..., Any]]:
    """dropmask with and without dropout, splash attention (fused backward) and JAX's
    flash attention (equal heads only; on a TPU only: it has no interpreter switch) at
    each of ``ANCHOR_TILES``."""
    key = jax.random.key(4)

    def ours(rate: float) -> Callable[..., Any]:
        return lambda q, k, v: dropmask.dot_product_attention(
            q, k, v, is_causal=causal, dropout_rate=rate, key=key, deterministic=rate == 0
        )

    out: dict[str, Callable[..., Any]] = {OURS_DROPOUT: ours(RATE), OURS_PLAIN: ours(0.0)}
    for tile in ANCHOR_TILES:
        out[splash_name(tile)] = _splash(length, depth, causal, kv_heads, tile)
    for compute in SPLASH_COMPUTE:  # as dropmask's kernels compute their 1024 tiles
        name = splash_name(ANCHOR_TILES[0], compute)
        out[name] = _splash(length, depth, causal, kv_heads, ANCHOR_TILES[0], compute)
    if jax.default_backend() == "tpu" and kv_heads == ANCHOR_HEADS:
        for tile in ANCHOR_TILES:
            out[jax_flash_name(tile)] = _jax_flash(length, depth, causal, tile)
    return out


def anchor_rows(cases: dict[str, Any], reps: int) -> Iterator[dict[str, Any]]:
    """Each case's contestants, forward + backward in one program, bf16 ``[1, L, 8,
    depth]``: the median of ``reps`` calls after a warm-up, XLA's temporaries and the
    fraction of a v5e's bf16 peak the call's matrix FLOPs (``attention_flops``) reach."""
    for case, (depth, causal, kv_heads, lengths) in cases.items():
        for length in lengths:
            keys = jax.random.split(jax.random.key(length + depth), 4)
            q = jax.random.normal(keys[0], (1, length, ANCHOR_HEADS, depth), jnp.bfloat16)
            k, v = (
                jax.random.normal(kk, (1, length, kv_heads, depth), jnp.bfloat16)
                for kk in keys[1:3]
            )
            g = jax.random.normal(keys[3], q.shape, jnp.bfloat16)
            for name, f in anchor_contestants(length, depth, causal, kv_heads).items():

                def loss(q: Any, k: Any, v: Any, g: Any, f: Any = f) -> jax.Array:
                    return jnp.sum((f(q, k, v) * g).astype(jnp.float32))

                row: dict[str, Any] = {"case": case, "length": length, "name": name}
                try:
                    exe = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v, g).compile()
                except Exception as err:  # noqa: BLE001 - a contestant that cannot run is a row
                    row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                    print(row, flush=True)
                    yield row
                    continue
                if name in (OURS_DROPOUT, OURS_PLAIN):
                    row["path"] = attention_path(f, q, k, v)
                row["temp_mib"] = temp_mib(exe)
                row["fwd_bwd_ms"] = _median_ms(exe, (q, k, v, g), reps)
                flops = attention_flops(length, depth, causal)
                row["peak_fraction"] = flops / (row["fwd_bwd_ms"] * 1e-3) / V5E_BF16_PEAK
                print(row, flush=True)
                yield row


# --- 5. on a one-device mesh ----------------------------------------------------------

# --- short attention ----------------------------------------------------------------

SHORT_LENGTHS = {"bfloat16": (128, 197, 256, 512, 1024, 2048), "float32": (197, 512)}
QUICK_SHORT_LENGTHS = {"bfloat16": (16, 40)}
SHORT_SHAPE = {"batch": 16, "heads": 8, "depth": 64}
SHORT_AUTO, SHORT_DENSE, SHORT_KERNELS = (
    "dropmask (auto)",
    "dropmask, algorithm='dense'",
    "dropmask, algorithm='pallas' (TPU kernels)",
)
SHORT_TARGET = 1.0  # most dropmask's auto may take of Flax's dense attention with dropout


def short_contestants() -> dict[str, Callable[..., Any]]:
    """``(q, k, v) -> out``, causal, dropout ``RATE`` with a mask per head (as Flax's
    ``MultiHeadDotProductAttention(broadcast_dropout=False)`` draws it)."""
    out = {SHORT_AUTO: dropmask_attention(False), SHORT_DENSE: dropmask_attention(False, "dense")}
    if jax.default_backend() == "tpu":
        out[SHORT_KERNELS] = dropmask_attention(False, "pallas")
    out[FLAX_DENSE] = flax_attention(False)
    return out


def short_rows(lengths: dict[str, tuple[int, ...]], reps: int) -> Iterator[dict[str, Any]]:
    """Forward + backward of each contestant in one program at ``SHORT_SHAPE``, XLA's
    temporaries and the compile time. At each length every contestant is compiled first,
    then timed in ``reps`` rounds, each contestant once a round in a rotating order
    (:func:`_rounds`): ``fwd_bwd_ms`` is the median of its rounds, ``ratio`` the median
    of its round-by-round ratios to Flax's dense attention, so that a drift of the
    machine between contestants cancels."""
    s = SHORT_SHAPE
    for dtype, dtype_lengths in lengths.items():
        for length in dtype_lengths:
            shape = (s["batch"], length, s["heads"], s["depth"])
            keys = jax.random.split(jax.random.key(length), 4)
            args = tuple(jax.random.normal(kk, shape, dtype) for kk in keys)
            rows, exes = [], []
            for name, f in short_contestants().items():

                def loss(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, f=f):
                    return jnp.sum((f(q, k, v) * g).astype(jnp.float32))

                row: dict[str, Any] = {"dtype": dtype, "length": length, "name": name}
                if name != FLAX_DENSE:
                    row["path"] = attention_path(f, *args[:3])
                t = time.perf_counter()
                exe = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
                row["compile_s"] = time.perf_counter() - t
                row["temp_mib"] = temp_mib(exe)
                rows.append(row)
                exes.append(exe)
            times = _rounds(exes, args, reps)
            flax = times[[r["name"] for r in rows].index(FLAX_DENSE)]
            for row, mine in zip(rows, times, strict=True):
                row["fwd_bwd_ms"] = float(np.median(mine))
                row["ratio"] = float(np.median(np.array(mine) / np.array(flax)))
                print(row, flush=True)
                yield row


SHORT_CALLS = 5  # back-to-back calls per timing: one call's dispatch is not what is timed


def _rounds(exes: list[Any], args: tuple[Any, ...], reps: int) -> list[list[float]]:
    """Per compiled program, ``reps`` timings (ms per call, the mean of ``SHORT_CALLS``
    calls dispatched back to back), one per round; round ``r`` starts at program ``r``
    (mod their number), so that none is always timed first or after the same one."""
    for exe in exes:
        jax.block_until_ready(exe(*args))
    times: list[list[float]] = [[] for _ in exes]
    for r in range(reps):
        for i in range(len(exes)):
            j = (r + i) % len(exes)
            t = time.perf_counter()
            for _ in range(SHORT_CALLS):
                out = exes[j](*args)
            jax.block_until_ready(out)
            times[j].append((time.perf_counter() - t) / SHORT_CALLS * 1e3)
    return times


MESH_ATTENTION_LENGTHS = (4096, 8192)
MESH_STEP_ROWS = (NO_DROPOUT, SWAPPED_ALL)
MESH_MODELS = ("ViT-B/16",)  # model shapes the mesh part steps at too (MODEL_SHAPES)


def _paired_ms(plain: Callable[[], float], meshed: Callable[[], float], reps: int):
    """Medians of ``reps`` timings of each, in turn first and second per repeat, and the
    median of their ratios (mesh / plain)."""
    a, b = [], []
    for r in range(reps):
        if r % 2 == 0:
            a.append(plain())
        b.append(meshed())
        if r % 2 == 1:
            a.append(plain())
    return float(np.median(a)), float(np.median(b)), float(np.median(np.array(b) / np.array(a)))


def _call_ms(exe: Any, *args: Any) -> float:
    t = time.perf_counter()
    jax.block_until_ready(exe(*args))
    return (time.perf_counter() - t) * 1e3


def mesh_rows(
    lengths: tuple[int, ...],
    size: dict[str, int],
    reps: int,
    models: dict[str, dict[str, int]] | None = None,
) -> Iterator[dict[str, Any]]:
    """dropmask's attention and the train step (at ``size``, then at each of ``models``'
    shapes, 4 layers) as they are and jitted over a one-device mesh of explicit axes,
    inputs placed by ``NamedSharding``: each pair timed in turn. The mesh takes the same
    kernels (the rows say what ran); a slower mesh row would be a cost of the sharding
    machinery. ViT-B/16's shape takes the dense attention path, whose backward pass
    under a mesh once cost 1.086x the unsharded step."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = one_device_mesh()
    s = ATTENTION_SHAPE
    for length in lengths:
        shape = (s["batch"], length, s["heads"], s["depth"])
        keys = jax.random.split(jax.random.key(length), 4)
        args = [jax.random.normal(kk, shape, jnp.bfloat16) for kk in keys]
        f = attention_contestants(length)[AUTO]

        def loss(q, k, v, g, f=f):
            return jnp.sum((f(q, k, v) * g).astype(jnp.float32))

        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        plain = grads.lower(*args).compile()
        with jax.set_mesh(mesh):
            placed = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in args]
            meshed = grads.lower(*placed).compile()
            mesh_path = attention_path(f, *placed[:3])
        for exe, a in ((plain, args), (meshed, placed)):
            jax.block_until_ready(exe(*a))
        ms, mesh_ms, ratio = _paired_ms(
            functools.partial(_call_ms, plain, *args),
            functools.partial(_call_ms, meshed, *placed),
            reps,
        )
        row = {
            "kind": "attention",
            "length": length,
            "path": attention_path(f, *args[:3]),
            "mesh_path": mesh_path,
            "ms": ms,
            "mesh_ms": mesh_ms,
            "ratio": ratio,
        }
        print(row, flush=True)
        yield row
    for step_row in step_rows(size, reps, ("bfloat16",), names=MESH_STEP_ROWS, mesh=mesh):
        yield {"kind": "step", **step_row}
    for model, shape in (models or {}).items():
        model_size = {**shape, "layers": 4}
        for step_row in step_rows(model_size, reps, ("bfloat16",), names=MESH_STEP_ROWS, mesh=mesh):
            yield {"kind": "step", "model": model, **step_row}


# --- driver ---------------------------------------------------------------------------


def _dtypes(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",")))
    if not names or any(n not in DTYPES for n in names):
        raise argparse.ArgumentTypeError(
            f"expected {' and/or '.join(DTYPES)} separated by commas, e.g. "
            f"bfloat16,float32; got {text!r}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the suite")
    parser.add_argument(
        "--step-dtypes",
        type=_dtypes,
        default=STEP_DTYPES,
        help="the train step's dtypes, comma-separated (default: bfloat16)",
    )
    parser.add_argument(
        "--parts",
        type=_parts,
        default=PARTS,
        help=f"the parts to run, comma-separated (default: {','.join(PARTS)})",
    )
    parser.add_argument(
        "--model-rows",
        type=_model_rows,
        default=tuple(MODEL_ROWS.values()),
        help=f"the models part's rows, comma-separated (default: {','.join(MODEL_ROWS)})",
    )
    parser.add_argument(
        "--model-shapes",
        type=_model_shapes,
        default=tuple(MODEL_SHAPES),
        help=f"the models part's shapes, comma-separated (default: {','.join(MODEL_SHAPES)})",
    )
    parser.add_argument(
        "--check-ways",
        type=_check_ways,
        default=tuple(CHECK_WAYS),
        help=f"how the checks draw, comma-separated (default: {','.join(CHECK_WAYS)}; "
        "'default' alone compiles a third of the programs)",
    )
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        help="write RESULTS.md's tpu section from these (each part from the last that ran it)",
    )
    args = parser.parse_args(argv)
    if args.reference:
        reference(args.reference)
        return 0
    if args.render:
        results = []
        for path in args.render:
            try:
                results.append(json.loads(path.read_text()))
            except (OSError, ValueError) as err:
                parser.error(f"--render must name tpu_results.json files this script wrote: {err}")
        write_section(Path(__file__).with_name("RESULTS.md"), SECTION, render(merged(results)))
        return 0
    if jax.default_backend() != "tpu" and not args.quick:
        parser.error(
            f"bench_tpu needs a TPU; jax's default backend is {jax.default_backend()!r} "
            "(--quick runs small sizes anywhere)"
        )
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "tpu_results.json"
    shape, size = (QUICK_SHAPE, QUICK_STEP) if args.quick else (SHAPE, STEP)
    result: dict[str, Any] = {
        "environment": environment("python -m benchmarks.bench_tpu"),
        "default_path": drawn_by(),
        "per_call_shape": list(shape),
        "step_size": size,
        "step_dtypes": list(args.step_dtypes),
        "model_shapes": (
            QUICK_MODEL_SHAPES
            if args.quick
            else {name: MODEL_SHAPES[name] for name in args.model_shapes}
        ),
        "anchor_cases": QUICK_ANCHOR_CASES if args.quick else ANCHOR_CASES,
        "short_lengths": QUICK_SHORT_LENGTHS if args.quick else SHORT_LENGTHS,
        "parts": list(args.parts),
    }

    def save() -> None:
        result["environment"]["wall_seconds"] = time.perf_counter() - start
        path.write_text(json.dumps(result, indent=1))

    reps = 3 if args.quick else REPEATS
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("checks", lambda: checks(args.out, args.check_ways)),
        ("per_call", lambda: per_call_rows(shape, reps)),
        (
            "attention",
            lambda: attention_rows(
                QUICK_ATTENTION_LENGTHS if args.quick else ATTENTION_LENGTHS,
                3 if args.quick else 10,
            ),
        ),
        ("step", lambda: step_rows(size, 3 if args.quick else 5, args.step_dtypes)),
        (
            "models",
            lambda: model_rows(
                result["model_shapes"],
                3 if args.quick else 5,
                args.model_rows,
            ),
        ),
        (
            "anchors",
            lambda: anchor_rows(result["anchor_cases"], 3 if args.quick else 10),
        ),
        ("short", lambda: short_rows(result["short_lengths"], 3 if args.quick else 10)),
        (
            "mesh",
            lambda: mesh_rows(
                QUICK_ATTENTION_LENGTHS if args.quick else MESH_ATTENTION_LENGTHS,
                size,
                3 if args.quick else 10,
                QUICK_MODEL_SHAPES
                if args.quick
                else {model: MODEL_SHAPES[model] for model in MESH_MODELS},
            ),
        ),
    ]
    for name, part in parts:
        if name not in args.parts:
            continue
        try:
            value = part()
            if isinstance(value, Iterator):
                result[name] = []
                for row in value:
                    result[name].append(row)
                    save()
            else:
                result[name] = value
        except Exception:  # noqa: BLE001 - a part that fails is reported, the rest still runs
            result[name + "_error"] = traceback.format_exc()[-3000:]
            print(result[name + "_error"], flush=True)
        save()
    return 0


PARTS = ("checks", "per_call", "attention", "step", "models", "anchors", "short", "mesh")
PART_KEYS = {
    "per_call": ("per_call_shape", "default_path"),
    "step": ("step_size", "step_dtypes"),
    "models": ("model_shapes",),
    "anchors": ("anchor_cases",),
    "short": ("short_lengths",),
}


def _parts(text: str) -> tuple[str, ...]:
    """``--parts``: a comma-separated subset of ``PARTS``."""
    names = tuple(dict.fromkeys(text.split(",")))
    if not names or not set(names) <= set(PARTS):
        raise argparse.ArgumentTypeError(
            f"expected some of {', '.join(PARTS)} separated by commas, got {text!r}"
        )
    return names


def _some_of(text: str, known: Any) -> tuple[str, ...]:
    """A comma-separated subset of ``known``'s names, in ``known``'s order."""
    names = set(text.split(","))
    if not names <= set(known):
        raise argparse.ArgumentTypeError(
            f"expected some of {', '.join(known)} separated by commas, got {text!r}"
        )
    return tuple(name for name in known if name in names)


def _check_ways(text: str) -> tuple[str, ...]:
    """``--check-ways``: some of ``CHECK_WAYS``' names."""
    return _some_of(text, CHECK_WAYS)


def _model_rows(text: str) -> tuple[str, ...]:
    """``--model-rows``: a comma-separated subset of ``MODEL_ROWS``' short names, "none"
    among them; the rows' names, in ``MODEL_ROWS``' order."""
    names = set(text.split(","))
    if not names <= set(MODEL_ROWS) or "none" not in names:
        raise argparse.ArgumentTypeError(
            f"expected some of {', '.join(MODEL_ROWS)} separated by commas, 'none' among "
            f"them (every row is timed against it), got {text!r}"
        )
    return tuple(row for short, row in MODEL_ROWS.items() if short in names)


def _model_shapes(text: str) -> tuple[str, ...]:
    """``--model-shapes``: some of ``MODEL_SHAPES``' names."""
    return _some_of(text, MODEL_SHAPES)


def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several runs' ``tpu_results.json``: each part (and its error) from
    the last run that ran it, the notes of the last file that has notes, and ``runs``:
    each run's environment and the parts it gave (a file ``merged`` wrote counts as its
    runs)."""
    out: dict[str, Any] = {}
    owner: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    for result in results:
        ran = result.get("parts") or [p for p in PARTS if p in result or p + "_error" in result]
        for run in result.get("runs") or [{"environment": result["environment"], "parts": ran}]:
            record = {"environment": run["environment"], "parts": list(run["parts"])}
            runs.append(record)
            for part in record["parts"]:
                owner[part] = record
                for key in (part, part + "_error"):
                    out.pop(key, None)
                    if key in result:
                        out[key] = result[key]
                for key in PART_KEYS.get(part, ()):
                    if key in result:
                        out[key] = result[key]
        if result.get("notes"):
            out["notes"] = result["notes"]
    for record in runs:
        record["parts"] = [p for p in record["parts"] if owner.get(p) is record]
    out["runs"] = [r for r in runs if r["parts"]]
    return out


# --- RESULTS.md -----------------------------------------------------------------------

TARGETS = {  # (dtype, pass): most dropmask's default may take of x * c's time, per call
    ("float32", "forward_ms"): 1.25,
    ("float32", "fwd_bwd_ms"): 1.3,
    ("bfloat16", "forward_ms"): 1.5,
    ("bfloat16", "fwd_bwd_ms"): 1.5,
}
FLAX_TARGET = 0.9  # most dropmask's default forward may take of Flax's fastest generator's
STEP_TARGET = 1.10  # most the swapped residual-only step may take of the step without dropout
COMPILE_TARGET = 0.25  # most compile time swapped residual-only adds / Flax residual-only adds
NOT_RUN = "not run"
PASSES = {"forward_ms": "forward", "fwd_bwd_ms": "fwd+bwd"}
CHECK_LABELS = {
    "default": "default path",
    "kernel": "TPU kernel, tpu_kernels()",
    "XLA": "XLA path, tpu_kernels(False)",
}


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _target(text: str, value: float | None, most: float) -> dict[str, str]:
    """A row of the targets' table: met or missed by ``value``, not run without it."""
    if value is None:
        return {"target": text, "measured": NOT_RUN, "verdict": NOT_RUN}
    verdict = "met" if value <= most else "missed"  # NaN: missed
    return {"target": text, "measured": f"{value:.3f}", "verdict": verdict}


def _label(row: dict[str, Any]) -> str:
    ways = [row.get("path"), row.get("attention_path") and f"attention: {row['attention_path']}"]
    ways = [w for w in ways if w]
    return row["name"] + (f" ({'; '.join(ways)})" if ways else "")


def _checks_lines(result: dict[str, Any]) -> list[str]:
    checks_ = {k: v for k, v in result.get("checks", {}).items() if isinstance(v, dict)}
    lines = []
    for way, label in CHECK_LABELS.items():
        same = {k: v[way] for k, v in checks_.items() if way in v}
        if not same:
            lines.append(f"Checks ({label}): {NOT_RUN}.\n")
            continue
        bad = [k for k, ok in same.items() if not ok]
        lines.append(
            f"Checks ({label}): {len(same) - len(bad)} of {len(same)} outputs equal a "
            "CPU process's bit for bit" + (f"; differ: {', '.join(bad)}" if bad else "") + ".\n"
        )
    return lines


def _per_call(result: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The per-call table and its targets."""
    table, targets = [], []
    for dtype in DTYPES:
        rows = {r["name"]: r for r in result.get("per_call", []) if r["dtype"] == dtype}
        ref = rows.get(X_C)
        flax = [rows[n] for n in FLAX_ROWS if n in rows]
        fastest = (
            {k: min(r[k] for r in flax) for k in PASSES} if len(flax) == len(FLAX_ROWS) else None
        )
        for name in PER_CALL_ROWS:
            r = rows.get(name)
            if r is None:
                table.append({"dtype": dtype, "name": name, "forward_ms": NOT_RUN})
                continue
            cells = {"dtype": dtype, "name": _label(r)}
            for k in PASSES:
                cells[k] = _num(r[k], ".3f")
                cells[k + "_x"] = _num(r[k] / ref[k] if ref else None, ".2f")
                cells[k + "_flax"] = _num(r[k] / fastest[k] if fastest else None, ".2f")
                cells["dispatch_" + k] = _num(r.get("dispatch_" + k), ".3f")
            table.append(cells)
        r = rows.get(DEFAULT)
        what = f"{dtype} per call, {_label(r) if r else DEFAULT}"
        for k in PASSES:
            most = TARGETS[(dtype, k)]
            value = r[k] / ref[k] if r and ref else None
            targets.append(_target(f"{what}: {PASSES[k]} / x * c <= {most}x", value, most))
        value = r["forward_ms"] / fastest["forward_ms"] if r and fastest else None
        targets.append(
            _target(f"{what}: forward / Flax's fastest <= {FLAX_TARGET}x", value, FLAX_TARGET)
        )
    shape = result.get("per_call_shape", list(SHAPE))
    text = (
        f"Per call at {shape}, rate {RATE}, ms: the slope of a compiled loop whose every "
        "call reads the same input with its own key, its output the loop's carry (no "
        "call's operand is the carry, so XLA copies nothing a call would not); one call: "
        f"the median of {DISPATCHES} calls of `jit(f)(x)`, dispatch included, for "
        "information. Flax's fastest: the least of its three key impls' times.\n\n"
        + markdown_table(
            table,
            [
                ("dtype", "dtype"),
                ("contestant", "name"),
                ("forward ms", "forward_ms"),
                ("/ x * c", "forward_ms_x"),
                ("/ Flax's fastest", "forward_ms_flax"),
                ("fwd+bwd ms", "fwd_bwd_ms"),
                ("/ x * c", "fwd_bwd_ms_x"),
                ("/ Flax's fastest", "fwd_bwd_ms_flax"),
                ("one call: forward ms", "dispatch_forward_ms"),
                ("fwd+bwd ms", "dispatch_fwd_bwd_ms"),
            ],
        )
    )
    return text, targets


def _steps(result: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The train step's table, its targets and the note on attention-weight dropout."""
    table, targets, shares = [], [], []
    for dtype in result.get("step_dtypes", list(STEP_DTYPES)):
        rows = {r["name"]: r for r in result.get("step", []) if r["dtype"] == dtype}
        zero = rows.get(NO_DROPOUT)
        for name in STEP_ROWS:
            r = rows.get(name)
            if r is None:
                table.append({"dtype": dtype, "name": name, "step_ms": NOT_RUN})
                continue
            added = r["compile_s"] - zero["compile_s"] if zero and name != NO_DROPOUT else None
            table.append(
                {
                    "dtype": dtype,
                    "name": _label(r),
                    "step_ms": _num(r.get("step_ms"), ".1f"),
                    "ratio": _num(r.get("ratio"), ".3f"),
                    "temp_mib": _num(r["temp_mib"], ".0f"),
                    "compile_s": _num(r["compile_s"], ".1f"),
                    "added": _num(added, ".1f"),
                }
            )
        swapped_, flax_ = rows.get(SWAPPED_RESIDUAL), rows.get(FLAX_RESIDUAL)
        value = swapped_.get("ratio") if swapped_ else None
        targets.append(
            _target(
                f"{dtype} step: {SWAPPED_RESIDUAL} / {NO_DROPOUT} <= {STEP_TARGET}x",
                value,
                STEP_TARGET,
            )
        )
        value = None
        if zero and swapped_ and flax_:
            added = flax_["compile_s"] - zero["compile_s"]
            value = (swapped_["compile_s"] - zero["compile_s"]) / added
        targets.append(
            _target(
                f"{dtype} step: compile time added, {SWAPPED_RESIDUAL} / {FLAX_RESIDUAL} "
                f"<= {COMPILE_TARGET}",
                value,
                COMPILE_TARGET,
            )
        )
        all_ = rows.get(SWAPPED_ALL)
        targets.append(
            _target(
                f"{dtype} step: {SWAPPED_ALL} / {NO_DROPOUT} <= {STEP_TARGET}x",
                all_.get("ratio") if all_ else None,
                STEP_TARGET,
            )
        )
        share = rows.get(FLAX_ATTENTION, {}).get("ratio")
        shares.append(f"{NOT_RUN if share is None else f'{share:.2f}x'} ({dtype})")
    s = result.get("step_size", STEP)
    text = (
        f"{s['layers']}-layer Flax Transformer train step [{s['batch']}, {s['length']}, "
        f"{s['width']}], {s['heads']} heads, MLP {s['mlp_dim']}, rate {RATE}; ms per step, "
        f"and each row's step over the step without dropout timed beside it:\n\n"
        + markdown_table(
            table,
            [
                ("dtype", "dtype"),
                ("step", "name"),
                ("ms", "step_ms"),
                ("/ no dropout", "ratio"),
                ("temporaries MiB", "temp_mib"),
                ("compile s", "compile_s"),
                ("compile s added", "added"),
            ],
        )
        + "\nflax residual-only: Flax's model with dropout on the residual and MLP branches "
        f"(rate {RATE}) and none on the attention weights; flax attention-only: on the "
        "attention weights only; flax full: both. swapped X: Flax's model X traced under "
        "`swap_dropout(attention=False)`, by dropmask's default path (in brackets); "
        "swapped X, attention too: under `swap_dropout(attention=True)`, its attention's "
        "path in brackets too.\n\n"
        "Under `swap_dropout(attention=False)` Flax's attention-weight dropout stays in the "
        f"model: {SWAPPED_FULL} still draws Flax's mask on the attention weights, and that "
        f"mask alone ({FLAX_ATTENTION}) takes {', '.join(shares)} the step without dropout. "
        f"{SWAPPED_RESIDUAL} against {FLAX_RESIDUAL} compares the dropout that "
        "`swap_dropout(attention=False)` replaces.\n"
    )
    return text, targets


ATTENTION_TARGETS = {  # (length, against): most dropmask's auto may take of it
    (4096, JAX_FLASH): 1.3,
    (4096, FLAX_DENSE): 1.0,
    (8192, JAX_FLASH): 1.3,
    (8192, FLAX_DENSE): 1.0,
    (32768, JAX_FLASH): 1.3,
}
TEMP_TARGET = 0.05  # most dropmask's temporaries may be of Flax's dense path's


def _attention(result: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The attention table and its targets."""
    rows = result.get("attention", [])
    table, targets = [], []
    for length in sorted({r["length"] for r in rows}):
        at = {r["name"]: r for r in rows if r["length"] == length}
        ours = at.get(AUTO)
        for r in at.values():
            table.append(
                {
                    "length": str(length),
                    "name": _label(r),
                    "ms": _num(r["fwd_bwd_ms"], ".2f"),
                    "x": _num(ours["fwd_bwd_ms"] / r["fwd_bwd_ms"] if ours else None, ".2f"),
                    "temp": _num(r["temp_mib"], ".1f"),
                }
            )
    for (length, against), most in ATTENTION_TARGETS.items():
        at = {r["name"]: r for r in rows if r["length"] == length}
        ours, theirs = at.get(AUTO), at.get(against)
        value = ours["fwd_bwd_ms"] / theirs["fwd_bwd_ms"] if ours and theirs else None
        targets.append(
            _target(f"attention, {length} tokens: time / {against} <= {most}x", value, most)
        )
        if against == FLAX_DENSE:
            value = ours["temp_mib"] / theirs["temp_mib"] if ours and theirs else None
            targets.append(
                _target(
                    f"attention, {length} tokens: temporaries / {against}'s <= {TEMP_TARGET}x",
                    value,
                    TEMP_TARGET,
                )
            )
    s = ATTENTION_SHAPE
    text = (
        f"Attention, bf16 [{s['batch']}, L, {s['heads']}, {s['depth']}], causal, dropout "
        f"{RATE} on the weights (JAX's kernel: none), forward + backward in one program: "
        "the median of 10 calls of the compiled program, ms; its temporaries by XLA's "
        "memory analysis; dropmask's time over each row's.\n\n"
        + (
            markdown_table(
                table,
                [
                    ("L", "length"),
                    ("contestant", "name"),
                    ("ms", "ms"),
                    ("dropmask / this", "x"),
                    ("temporaries MiB", "temp"),
                ],
            )
            if table
            else f"{NOT_RUN}.\n"
        )
    )
    return text, targets


# (case, dropmask's row): most its time may take of splash attention's best tiles' time
ANCHOR_TARGETS = {
    ("causal, depth 128", OURS_DROPOUT): 1.0,
    ("causal, depth 128", OURS_PLAIN): 0.95,
    ("causal, depth 64", OURS_DROPOUT): 1.1,
    ("full, depth 128", OURS_DROPOUT): 1.1,
    ("causal, depth 128, 8 query heads over 2", OURS_DROPOUT): 1.1,
}


def _anchors(result: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The anchors' table (each row against splash attention at its fastest tiles) and
    their targets: time, and temporaries no more than splash's."""
    rows = [r for r in result.get("anchors", []) if "fwd_bwd_ms" in r]
    if not result.get("anchors") and "anchors_error" not in result:
        return "", []
    table, targets = [], []
    cases = result.get("anchor_cases", ANCHOR_CASES)
    for case, (_, _, _, lengths) in cases.items():
        for length in lengths:
            at = [r for r in rows if r["case"] == case and r["length"] == length]
            splash = [r for r in at if r["name"].startswith("splash")]
            best = min(splash, key=lambda r: r["fwd_bwd_ms"]) if splash else None
            for r in at:
                table.append(
                    {
                        "case": case,
                        "length": str(length),
                        "name": _label(r),
                        "ms": _num(r["fwd_bwd_ms"], ".2f"),
                        "x": _num(r["fwd_bwd_ms"] / best["fwd_bwd_ms"] if best else None, ".3f"),
                        "temp": _num(r["temp_mib"], ".0f"),
                        "peak": _num(100 * r["peak_fraction"], ".0f"),
                    }
                )
            for (target_case, name), most in ANCHOR_TARGETS.items():
                if target_case != case:
                    continue
                ours = next((r for r in at if r["name"] == name), None)
                value = ours["fwd_bwd_ms"] / best["fwd_bwd_ms"] if ours and best else None
                targets.append(
                    _target(
                        f"{case}, {length} tokens: {name} / splash's best tiles <= {most}x",
                        value,
                        most,
                    )
                )
                if name == OURS_DROPOUT:
                    value = ours["temp_mib"] - best["temp_mib"] if ours and best else None
                    targets.append(
                        _target(
                            f"{case}, {length} tokens: {name}'s temporaries - splash's <= 0 MiB",
                            value,
                            0.0,
                        )
                    )
    text = (
        "### Against the public kernels at tuned tiles\n\n"
        f"bf16 [1, L, {ANCHOR_HEADS}, depth], forward + backward in one program, the median "
        "of 10 calls: dropmask (`auto`, with and without dropout), splash attention "
        "(`jax.experimental.pallas.ops.tpu.splash_attention`, fused backward kernel, every "
        "block the same tile) and JAX's flash attention (every block the same tile; equal "
        "heads only); time over splash's at its faster tiles, temporaries by XLA's memory "
        "analysis, and the share of a v5e's bf16 peak (197 TFLOP/s) the matrix FLOPs reach "
        "(3.5 times the forward's).\n\n"
        + markdown_table(
            table,
            [
                ("case", "case"),
                ("L", "length"),
                ("contestant", "name"),
                ("ms", "ms"),
                ("/ splash's best", "x"),
                ("temporaries MiB", "temp"),
                ("% of peak", "peak"),
            ],
        )
    )
    errors = [r for r in result.get("anchors", []) if "error" in r]
    for r in errors:
        text += f"\n{r['case']}, {r['length']} tokens, {r['name']}: did not run ({r['error']})\n"
    return text, targets


def _with_path(row: dict[str, Any]) -> str:
    """A short-attention row's contestant with the path it took, unless its name says it."""
    path = row.get("path")
    if path is None or row["name"].endswith(f"({path})"):
        return row["name"]
    return f"{row['name']} ({path})"


def _over_flax(row: dict[str, Any], flax: dict[str, Any] | None) -> float | None:
    """A short-attention row's time over Flax's: its paired ``ratio`` where the run timed
    in rounds, else the ratio of the medians (runs before the rounds)."""
    if flax is None:
        return None
    return row.get("ratio", row["fwd_bwd_ms"] / flax["fwd_bwd_ms"])


def _short(result: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The short-attention table (each row over Flax's dense attention with dropout at its
    dtype and length) and its targets: dropmask's ``auto`` no slower than Flax's."""
    rows = [r for r in result.get("short", []) if "fwd_bwd_ms" in r]
    if not result.get("short") and "short_error" not in result:
        return "", []
    table, targets = [], []
    lengths = result.get("short_lengths", SHORT_LENGTHS)
    for dtype, dtype_lengths in lengths.items():
        for length in dtype_lengths:
            at = [r for r in rows if r["dtype"] == dtype and r["length"] == length]
            flax = next((r for r in at if r["name"] == FLAX_DENSE), None)
            for r in at:
                table.append(
                    {
                        "dtype": dtype,
                        "length": str(length),
                        "name": _with_path(r),
                        "ms": _num(r["fwd_bwd_ms"], ".3f"),
                        "x": _num(_over_flax(r, flax), ".3f"),
                        "temp": _num(r["temp_mib"], ".1f"),
                        "compile": _num(r["compile_s"], ".1f"),
                    }
                )
            ours = next((r for r in at if r["name"] == SHORT_AUTO), None)
            value = _over_flax(ours, flax) if ours else None
            targets.append(
                _target(
                    f"short attention, {dtype}, {length} tokens: {SHORT_AUTO} / Flax's dense "
                    f"attention, dropout {RATE} <= {SHORT_TARGET}x",
                    value,
                    SHORT_TARGET,
                )
            )
    s = SHORT_SHAPE
    timing = (
        f"ms per call: {SHORT_CALLS} calls dispatched back to back, the median of rounds in "
        "which each contestant runs once in a rotating order; over Flax's dense attention "
        "with dropout: the median of the round-by-round ratios"
        if any("ratio" in r for r in rows)
        else "the median of 10 calls, ms; each row's time over Flax's dense attention with dropout"
    )
    text = (
        "### Short attention\n\n"
        f"[{s['batch']}, L, {s['heads']}, {s['depth']}], causal, dropout {RATE} on the "
        f"weights with a mask per head, forward + backward in one program: {timing}; "
        "temporaries by XLA's memory analysis; compile time. `auto` names the path it "
        "took.\n\n"
        + markdown_table(
            table,
            [
                ("dtype", "dtype"),
                ("L", "length"),
                ("contestant", "name"),
                ("ms", "ms"),
                ("/ Flax's", "x"),
                ("temporaries MiB", "temp"),
                ("compile s", "compile"),
            ],
        )
    )
    return text, targets


MODEL_TARGET = 1.10  # most a model shape's step, every site swapped, may take of the step without


def _models(result: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The model-shapes table and its targets (every site swapped, each model and dtype)."""
    rows = result.get("models", [])
    if not rows and "models_error" not in result:
        return "", []
    table, targets = [], []
    for r in rows:
        table.append(
            {
                "model": r["model"],
                "dtype": r["dtype"],
                "name": _label(r),
                "step_ms": _num(r.get("step_ms"), ".2f"),
                "ratio": _num(r.get("ratio"), ".3f"),
                "temp_mib": _num(r["temp_mib"], ".0f"),
                "compile_s": _num(r["compile_s"], ".1f"),
            }
        )
    shapes = result.get("model_shapes", MODEL_SHAPES)
    for model, size in shapes.items():
        for dtype in MODEL_DTYPES.get(model, STEP_DTYPES):
            ran = [r for r in rows if r["model"] == model and r["dtype"] == dtype]
            all_ = next((r for r in ran if r["name"] == SWAPPED_ALL), None)
            targets.append(
                _target(
                    f"{model} [{size['batch']}, {size['length']}, {size['width']}] {dtype}: "
                    f"{SWAPPED_ALL} / {NO_DROPOUT} <= {MODEL_TARGET}x",
                    all_.get("ratio") if all_ else None,
                    MODEL_TARGET,
                )
            )
    shapes_text = "; ".join(
        f"{m}: [{s['batch']}, {s['length']}, {s['width']}], {s['heads']} heads, MLP {s['mlp_dim']}"
        for m, s in shapes.items()
    )
    text = (
        "### Model shapes\n\n"
        f"The step part's 4-layer Flax Transformer at the shapes TPU models have ({shapes_text}); "
        "rows as in the step table, each timed beside the step without dropout:\n\n"
        + markdown_table(
            table,
            [
                ("model", "model"),
                ("dtype", "dtype"),
                ("step", "name"),
                ("ms", "step_ms"),
                ("/ no dropout", "ratio"),
                ("temporaries MiB", "temp_mib"),
                ("compile s", "compile_s"),
            ],
        )
    )
    return text, targets


MESH_TARGET = 1.03  # no row slower over a one-device mesh beyond noise


def _mesh(result: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The one-device mesh table, each row as it is and over the mesh, and its targets."""
    rows = result.get("mesh", [])
    table, targets = [], []
    for r in rows:
        if r["kind"] == "attention":
            what = f"attention fwd+bwd, {r['length']} tokens ({r['path']} / {r['mesh_path']})"
            ms, mesh_ms, ratio = r["ms"], r["mesh_ms"], r["ratio"]
        else:
            what = f"step {r['dtype']}, {r['name']}"
            if "model" in r:
                what = f"{r['model']} {what}"
            if "mesh_path" in r:
                what += f" ({r['path']} / {r['mesh_path']})"
            ms, mesh_ms, ratio = r["plain_ms"], r["mesh_ms"], r["mesh_ratio"]
        table.append(
            {
                "what": what,
                "ms": _num(ms, ".2f"),
                "mesh": _num(mesh_ms, ".2f"),
                "x": _num(ratio, ".3f"),
            }
        )
        targets.append(
            _target(f"one-device mesh / plain, {what} <= {MESH_TARGET}x", ratio, MESH_TARGET)
        )
    columns = [
        ("row", "what"),
        ("ms", "ms"),
        ("one-device mesh, ms", "mesh"),
        ("mesh / plain", "x"),
    ]
    text = (
        "On a one-device mesh of explicit axes (inputs placed by `NamedSharding`, the "
        "parameters replicated), timed in turn with the same program unsharded "
        "(medians; the ratio is the median of the pairs'):\n\n"
        + (markdown_table(table, columns) if table else f"{NOT_RUN}.\n")
    )
    if not rows:
        targets.append(_target(f"one-device mesh / plain <= {MESH_TARGET}x", None, MESH_TARGET))
    return text, targets


def render(result: dict[str, Any]) -> str:
    """RESULTS.md's TPU section from ``tpu_results.json``'s contents; a row the run did
    not reach, and a target that needs it, read "not run"."""
    runs = result.get("runs") or [{"environment": result["environment"], "parts": PARTS}]
    lines = ["## TPU", ""]
    for run in runs:
        if len(runs) > 1:
            lines.append(f"Run of parts {', '.join(run['parts'])}:\n")
        lines.append(environment_markdown(run["environment"]))
    lines.extend(_checks_lines(result))
    per_call, per_call_targets = _per_call(result)
    steps, step_targets = _steps(result)
    attention, attention_targets = _attention(result)
    mesh, mesh_targets = _mesh(result)
    models, model_targets = _models(result)
    anchors, anchor_targets = _anchors(result)
    short, short_targets = _short(result)
    lines.append(
        "Targets:\n\n"
        + markdown_table(
            per_call_targets
            + step_targets
            + model_targets
            + attention_targets
            + anchor_targets
            + short_targets
            + mesh_targets,
            [("target", "target"), ("measured", "measured"), ("verdict", "verdict")],
        )
    )
    lines.extend(
        [per_call, steps, *([models] if models else []), attention]
        + ([anchors] if anchors else [])
        + ([short] if short else [])
        + [mesh]
    )
    lines.extend(f"\n{note}" for note in result.get("notes", []))
    for key in (f"{part}_error" for part in PARTS):
        if key in result:
            lines.append(f"\n{key}: `{result[key].strip().splitlines()[-1]}`\n")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
