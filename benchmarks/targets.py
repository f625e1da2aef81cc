"""``make bench``: every speed and memory target of dropmask's dropout, in one table.

Each target is measured the way a user meets it, with the spread of paired repeats:

* Dropout at ``[4096, 4096]``, rate 0.1, per pass (the slope between a short and a
  long loop of passes inside one jit, ``_harness.Looped``), forward+backward with the
  two passes kept apart as the layers between them in a network keep them
  (``_contestants.vjp_apart``): dropmask against ``x * c`` (the memory-bound limit) and
  against ``flax.linen.Dropout``, each pair timed back to back.
* The residual ``jax.vjp`` keeps for dropout's backward pass, bytes per element.
* A Transformer encoder layer's train step (``bench_transformer_step``: Flax's WMT
  encoder block, ``[16, 256, 256]``, 8 heads, MLP 1024, SGD), with one baseline for
  every contestant, Flax's layer without dropout: dropmask's step with dropout (its
  default attention algorithm) against it in time, and the temporaries it adds
  against those Flax's dropout adds.
* A long causal step (``bench_attention``: the same layer, ``[2, 4096, 256]``, 8
  heads, dropout on the attention weights): dropmask's time and temporaries against
  Flax's, both with dropout; dropmask's step alone at 16384 tokens, whose
  temporaries must fit in this machine's memory (Flax's weights alone would not).
* The attention's forward+backward temporaries at 1024 and 4096 tokens: their ratio
  at most 5 (1.25x linear growth; quadratic is 16).
* Monte Carlo dropout (``bench_mc``): K samples of an MLP's prediction in one
  ``dropmask.uncertainty.sample`` call against K single forward passes with dropout
  on, paired per repeat.
* LayerDrop and token dropping (``bench_structured``): a train step at rate 0.5
  against the same step at rate 0 (LayerDrop: a stack of residual MLP blocks; token
  dropping: an encoder block on half the tokens), paired per repeat.
* Compile time (``bench_compile``): a Transformer encoder's train step at 12 and 24
  layers, Linen and NNX, each variant compiled in a fresh process: the XLA compile
  time and the trace+lower time that dropmask's dropout adds over the step without
  dropout, against what Flax's dropout adds (the best of the repeats of each). The
  same under ``nn.scan``, and each bundled example's step, are reported beside them.
* Flax-style code swapped without an edit (``bench_swap``): the encoder step's time and
  temporaries under ``swap_dropout(attention=True)``, and a 2048-token step's.
* Scanned layers (``bench_scan``): a train step through ``nn.scan``-ned Dense + Dropout
  layers against the same step without dropout, in time and temporaries.
* On a GPU only: dropout at ``x * c``'s bandwidth, and the train step against Flax's.

A speed target's measured value is the median of the paired repeats, with their
quartiles; where the quartiles lie on both sides of the threshold the verdict is
marked "within noise": this machine cannot tell the two apart. A failed target prints
FAIL; the command still exits 0 (it is a report) unless ``--strict``.

Usage: ``python -m benchmarks.run [--quick] [--strict] [--out benchmarks]``; the table
replaces the ``targets`` section of ``<out>/RESULTS.md``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import jax

from benchmarks import (
    _contestants,
    _harness,
    bench_attention,
    bench_compile,
    bench_mc,
    bench_scan,
    bench_structured,
    bench_swap,
    bench_transformer_step,
)
from benchmarks._harness import finite, quartiles

SECTION = "targets"


@dataclass(frozen=True)
class Size:
    """How large and how often: the target sizes, or ``--quick``'s."""

    dropout_shape: tuple[int, int]
    limit_pairs: int  # pairs against x * c (cheap loops)
    flax_pairs: int  # pairs against flax.linen.Dropout (slow loops)
    step: dict[str, int]  # bench_transformer_step.run's sizes
    long: dict[str, int]  # bench_attention.long_step's sizes, Flax against dropmask
    longest: int  # the length of dropmask's step alone (Flax's weights would not fit)
    growth: tuple[int, int]  # lengths of the attention's memory growth
    quick: bool = False
    mc: dict[str, int] = field(default_factory=lambda: dict(bench_mc.QUICK))  # bench_mc's
    layer_drop: dict[str, int] = field(  # bench_structured's
        default_factory=lambda: dict(bench_structured.LAYER_DROP_QUICK)
    )
    tokens: dict[str, int] = field(default_factory=lambda: dict(bench_structured.TOKENS_QUICK))
    # bench_compile's: encoder depths, APIs, repeats, scanned depth, examples.
    compile: dict[str, Any] = field(
        default_factory=lambda: {
            "layers": (2,),
            "apis": ("linen",),
            "repeats": 2,
            "scan_layers": 2,
            "examples": (),
        }
    )


FULL = Size(
    (4096, 4096),
    limit_pairs=21,
    flax_pairs=7,
    step={"batch": 16, "length": 256, "width": 256, "heads": 8, "mlp_dim": 1024, "repeats": 9},
    long={"batch": 2, "length": 4096, "width": 256, "heads": 8, "mlp_dim": 1024, "repeats": 3},
    longest=16384,
    growth=(1024, 4096),
    mc=dict(bench_mc.FULL),
    layer_drop=dict(bench_structured.LAYER_DROP_FULL),
    tokens=dict(bench_structured.TOKENS_FULL),
    compile={
        "layers": (12, 24),
        "apis": ("linen", "nnx"),
        "repeats": 2,
        "scan_layers": 24,
        "examples": bench_compile.EXAMPLES,
    },
)
QUICK = Size(
    (1024, 1024),
    limit_pairs=5,
    flax_pairs=3,
    step={"batch": 2, "length": 64, "width": 64, "heads": 2, "mlp_dim": 128, "repeats": 5},
    long={"batch": 1, "length": 1024, "width": 64, "heads": 2, "mlp_dim": 128, "repeats": 3},
    longest=2048,
    growth=(1024, 2048),
    quick=True,
)


@dataclass
class Target:
    """One target: ``values`` (paired repeats, or one exact measurement) against ``bound``.

    ``at_most``: the target is ``median <= bound`` (else ``>=``). ``scale`` and ``unit``
    only format the numbers (``scale=100, unit="%"`` prints a share as percent).
    """

    name: str
    bound: float
    at_most: bool
    values: list[float]
    unit: str = "x"
    scale: float = 1.0
    note: str = ""
    extra_check: bool | None = None  # e.g. the output check; False fails the target
    backend_only: str | None = None  # the backend the bound is meant for
    fields: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Median, quartiles, verdict and whether the spread straddles the bound."""
        values = finite(self.values)
        if not values:
            return {"median": None, "q1": None, "q3": None, "status": "FAIL", "noise": False}
        q1, med, q3 = quartiles(values) if len(values) > 1 else (values[0],) * 3
        passed = med <= self.bound if self.at_most else med >= self.bound
        if self.extra_check is False:
            passed = False
        noise = len(values) > 1 and q1 <= self.bound <= q3
        status = "PASS" if passed else "FAIL"
        here = jax.default_backend()
        if self.backend_only is not None and here != self.backend_only:
            status = "n/a"
        return {"median": med, "q1": q1, "q3": q3, "status": status, "noise": noise}

    def row(self) -> dict[str, Any]:
        s = self.summary()

        def fmt(v: float) -> str:
            return f"{v * self.scale:.3g}{self.unit}"

        threshold = f"{'<=' if self.at_most else '>='} {fmt(self.bound)}"
        if s["median"] is None:
            measured = "no finite value"
        elif len(self.values) > 1:
            kept = len(finite(self.values))
            dropped = len(self.values) - kept
            measured = (
                f"{fmt(s['median'])} (quartiles {fmt(s['q1'])} to {fmt(s['q3'])}, "
                f"{kept} pairs{f', {dropped} discarded' if dropped else ''})"
            )
        else:
            measured = fmt(s["median"])
        status = s["status"] + (" (within noise)" if s["noise"] and s["status"] != "n/a" else "")
        notes = [self.note] if self.note else []
        if self.extra_check is False:
            notes.append("output check failed")
        if s["status"] == "n/a":
            notes.append(
                f"the bound is for {self.backend_only}, this ran on {jax.default_backend()}"
            )
        return {
            "target": f"{self.name} {threshold}",
            "measured": measured,
            "status": status,
            "note": "; ".join(notes),
            **{k: s[k] for k in ("median", "q1", "q3")},
        }


# --- measurements ---------------------------------------------------------------------


def _on_gpu() -> bool:
    """Whether to add the GPU-only rows."""
    return jax.default_backend() == "gpu"


def dropout_targets(size: Size) -> list[Target]:
    """Dropout per pass against the limit and against Flax; residual bytes."""
    ours, flax, limit = _contestants.contestants(full=False)[0]
    shape = size.dropout_shape
    label = f"{list(shape)} rate {_contestants.RATE}"
    out: list[Target] = []
    loops: dict[tuple[str, str, str], _harness.Looped] = {}

    def loop(c: _contestants.Contestant, dtype: str, mode: str) -> _harness.Looped:
        if (c.name, dtype, mode) not in loops:
            loops[(c.name, dtype, mode)] = _contestants.loop(c, shape, dtype, mode)
        return loops[(c.name, dtype, mode)]

    on_gpu = _on_gpu()
    print(f"  dropmask / x * c, f32 fwd+bwd {label} ...", flush=True)
    ok = _contestants.checked(ours, shape, "f32", "fwd+bwd")["ok"]
    ratios = _harness.paired_per_pass_ratios(
        loop(ours, "f32", "fwd+bwd"), loop(limit, "f32", "fwd+bwd"), repeats=size.limit_pairs
    )
    out.append(
        Target(
            f"f32 fwd+bwd (passes apart), {label}: time / x * c",
            1.25,
            True,
            ratios,
            extra_check=ok,
            backend_only="cpu",
        )
    )
    print(f"  generator alone / x * c, f32 fwd {label} ...", flush=True)
    x, _ = _contestants.inputs(shape, jax.numpy.float32)
    generator = _harness.looped(
        lambda passes: _contestants.looped_mask_words(shape, passes), (x, jax.random.key(0))
    )
    ratios = _harness.paired_per_pass_ratios(
        generator, loop(limit, "f32", "fwd"), repeats=size.limit_pairs
    )
    out.append(
        Target(
            f"f32 fwd, {label}: the generator alone (packed keep-words) / x * c",
            1.0,
            True,
            ratios,
            backend_only="cpu",
        )
    )
    for dtype in _contestants.DTYPES:
        for mode in _contestants.MODES:
            print(f"  flax.linen.Dropout / dropmask, {dtype} {mode} {label} ...", flush=True)
            ok = _contestants.checked(ours, shape, dtype, mode)["ok"]
            speedups = _harness.paired_per_pass_ratios(
                loop(flax, dtype, mode), loop(ours, dtype, mode), repeats=size.flax_pairs
            )
            out.append(
                Target(
                    f"{dtype} {mode}, {label}: speedup over flax.linen.Dropout",
                    8.0,
                    False,
                    speedups,
                    extra_check=ok,
                )
            )
            if on_gpu:
                # The fraction of x * c's bandwidth: limit time / dropmask time, paired.
                fractions = _harness.paired_per_pass_ratios(
                    loop(limit, dtype, mode), loop(ours, dtype, mode), repeats=size.limit_pairs
                )
                out.append(
                    Target(
                        f"GPU {dtype} {mode}, {label}: bandwidth / x * c's",
                        0.85,
                        False,
                        fractions,
                        unit="%",
                        scale=100,
                        extra_check=ok,
                        backend_only="gpu",
                    )
                )
    for dtype_name, dtype in _contestants.DTYPES.items():
        res = _contestants.residuals(ours, dtype)
        growing = ", ".join(res["growing_residuals"]) or "nothing that grows with x"
        out.append(
            Target(
                f"{dtype_name} dropout residual for the backward pass",
                0.13,
                True,
                [res["residual_bytes_per_element"]],
                unit=" B/element",
                note=f"keeps {growing} (+{res['residual_bytes_constant']:.0f} B constant)",
            )
        )
    return out


def _name(lib: str, rate: float) -> str:
    return bench_transformer_step.contestant_name((lib, rate))


def step_targets(size: Size) -> list[Target]:
    """The Transformer train step, f32 and bf16 (see ``bench_transformer_step``)."""
    out: list[Target] = []
    s = size.step
    label = f"[{s['batch']}, {s['length']}, {s['width']}], {s['heads']} heads, MLP {s['mlp_dim']}"
    on_gpu = _on_gpu()
    for dtype in _contestants.DTYPES:
        print(f"  Transformer train step, {dtype} {label} ...", flush=True)
        result = bench_transformer_step.run(dtype_name=dtype, **s)
        flax_row, ours_row = result["rows"]
        name = f"{dtype} Transformer step {label}"
        seconds = result["step_seconds"]
        baseline = seconds[_name(bench_transformer_step.FLAX, 0.0)]
        ours = seconds[_name(bench_transformer_step.DROPMASK, bench_transformer_step.RATE)]
        flax = seconds[_name(bench_transformer_step.FLAX, bench_transformer_step.RATE)]
        flax_ratio = quartiles([f / b for f, b in zip(flax, baseline, strict=True)])[1]
        base_temp = flax_row["baseline_temp_bytes"]
        ours_added = ours_row["temp_bytes"] - base_temp
        flax_added = flax_row["temp_bytes"] - base_temp
        out += [
            Target(
                f"{name}: dropmask's step with dropout / Flax's without",
                0.95,
                True,
                [o / b for o, b in zip(ours, baseline, strict=True)],
                note=f"Flax's with dropout: {flax_ratio:.3f}x (median)",
                backend_only="cpu",
            ),
            Target(
                f"{name}: temporaries dropmask's step with dropout adds / Flax's adds",
                0.05,
                True,
                [ours_added / flax_added if flax_added > 0 else math.nan],
                note=(
                    f"over Flax's layer without dropout ({base_temp / 2**20:.1f} MiB): "
                    f"dropmask {ours_added / 2**20:+.2f} MiB, Flax {flax_added / 2**20:+.2f} MiB"
                ),
            ),
        ]
        if on_gpu:
            out.append(
                Target(
                    f"GPU {name}: dropmask step time / Flax's",
                    1.0,
                    True,
                    [o / f for o, f in zip(ours, flax, strict=True)],
                    backend_only="gpu",
                )
            )
    return out


def mc_targets(size: Size) -> list[Target]:
    """K Monte Carlo dropout samples in one call against K single passes."""
    m = size.mc
    label = (
        f"MLP [{m['batch']}, {m['width']}] x {m['layers']} layers, K={m['samples']}, "
        f"chunk_size={m['chunk']}, rate {_contestants.RATE}"
    )
    print(f"  uncertainty.sample / K single passes, {label} ...", flush=True)
    ratios = bench_mc.run(
        m["batch"],
        m["width"],
        m["layers"],
        m["samples"],
        repeats=5 if size.quick else 11,
        chunk=m["chunk"],
    )
    return [Target(f"f32 {label}: K samples in one call / K single passes", 1.15, True, ratios)]


def structured_targets(size: Size) -> list[Target]:
    """LayerDrop and token dropping at rate 0.5 against the same step at rate 0."""
    repeats = 5 if size.quick else 11
    rate = bench_structured.RATE
    ld, tk = size.layer_drop, size.tokens
    ld_label = f"{ld['layers']} MLP blocks x + f(x) [{ld['batch']}, {ld['width']}]"
    tk_label = f"encoder block [{tk['batch']}, {tk['length']}, {tk['width']}]"
    print(f"  LayerDrop {rate} / rate 0, {ld_label} ...", flush=True)
    layer = bench_structured.run_layer_drop(repeats, extra=16, **ld)
    print(f"  token dropping {rate} / every token, {tk_label} ...", flush=True)
    tokens = bench_structured.run_tokens(repeats, **tk)
    return [
        Target(f"f32 train step, {ld_label}: LayerDrop {rate} / rate 0", 0.7, True, layer),
        Target(
            f"f32 train step, {tk_label}: token dropping {rate} / every token", 0.7, True, tokens
        ),
    ]


def compile_targets(size: Size) -> tuple[list[Target], str]:
    """Added compile and trace+lower time against Flax's (``bench_compile``), and the
    full compile table (scanned stack and examples included) for RESULTS.md."""
    c = size.compile
    out: list[Target] = []
    results = []
    for layers in c["layers"]:
        for api in c["apis"]:
            print(f"  compile time, {api} encoder, {layers} layers ...", flush=True)
            result = bench_compile.encoder_rows(layers, api, c["repeats"])
            results.append(result)
            label = f"{api} {layers}-layer encoder train step"
            for variant in bench_compile.VARIANTS[2:]:
                added = bench_compile.added_ratios(result, variant)
                each = ", ".join(f"{r:.2f}x" for r in added["per_repeat"])
                best = added["best"]
                out.append(
                    Target(
                        f"{label}: XLA compile time {variant} adds / Flax's dropout adds",
                        1.0,
                        True,
                        [added["ratio"]],
                        note=(
                            f"best of {c['repeats']}: none {best['none']:.2f} s, Flax "
                            f"{best['flax']:.2f} s, {variant} {best[variant]:.2f} s; "
                            f"per repeat {each}"
                        ),
                    )
                )
            lower = bench_compile.added_ratios(result, bench_compile.VARIANTS[-1], "lower_s")
            best = lower["best"]
            out.append(
                Target(
                    f"{label}: trace+lower time dropmask's layers and attention add / "
                    "Flax's dropout adds",
                    1.0,
                    True,
                    [lower["ratio"]],
                    note=(
                        f"best of {c['repeats']}: none {best['none']:.2f} s, Flax "
                        f"{best['flax']:.2f} s, dropmask {best[bench_compile.VARIANTS[-1]]:.2f} s"
                    ),
                )
            )
    print(f"  compile time, linen encoder under nn.scan, {c['scan_layers']} layers ...")
    variants = bench_compile.VARIANTS[:3]
    scanned = bench_compile.encoder_rows(
        c["scan_layers"], "linen", c["repeats"], scan=True, variants=variants
    )
    results.append(scanned)
    print(f"  compile time, linen encoder under nn.remat, {c['layers'][0]} layers ...")
    rematted = bench_compile.encoder_rows(
        c["layers"][0], "linen", c["repeats"], variants=variants, remat=True
    )
    results.append(rematted)
    print(f"  compile time, examples {', '.join(c['examples']) or '(none)'} ...", flush=True)
    examples = bench_compile.example_rows(c["examples"], c["repeats"])
    return out, bench_compile.markdown(results, examples)


def long_targets(size: Size) -> list[Target]:
    """The causal step at a long sequence against Flax, f32 and bf16, and dropmask's
    step alone at ``size.longest`` tokens (see ``bench_attention.long_step``)."""
    out: list[Target] = []
    s = size.long
    for dtype in _contestants.DTYPES:
        label = (
            f"[{s['batch']}, {s['length']}, {s['width']}], {s['heads']} heads, causal, "
            f"attention dropout {bench_attention.RATE}"
        )
        print(f"  long causal step, {dtype} {label} ...", flush=True)
        result = bench_attention.long_step(dtype_name=dtype, **s)
        seconds, temps = result["seconds"], result["temp_bytes"]
        ours, flax = seconds[bench_attention.DROPMASK], seconds[bench_attention.FLAX]
        ours_temp, flax_temp = temps[bench_attention.DROPMASK], temps[bench_attention.FLAX]
        path = f"dropmask's algorithm: {result['algorithm']!r}"
        out += [
            Target(
                f"{dtype} step {label}: dropmask's temporaries / Flax's",
                1 / 8,
                True,
                [ours_temp / flax_temp],
                note=(
                    f"dropmask {ours_temp / 2**20:.0f} MiB, Flax {flax_temp / 2**20:.0f} MiB; "
                    + path
                ),
            ),
            Target(
                f"{dtype} step {label}: dropmask's time / Flax's",
                0.4,
                True,
                [o / f for o, f in zip(ours, flax, strict=True)],
                note=(
                    f"dropmask {1e3 * quartiles(ours)[1]:.0f} ms, Flax "
                    f"{1e3 * quartiles(flax)[1]:.0f} ms (medians); " + path
                ),
                backend_only="cpu",
            ),
        ]
    dtype = "f32"
    longest = {**s, "length": size.longest}
    label = (
        f"[{s['batch']}, {size.longest}, {s['width']}], {s['heads']} heads, causal, "
        f"attention dropout {bench_attention.RATE}"
    )
    print(f"  long causal step, dropmask alone, {dtype} {label} ...", flush=True)
    result = bench_attention.long_step(dtype_name=dtype, with_flax=False, **longest)
    ours = result["seconds"][bench_attention.DROPMASK]
    ours_temp = result["temp_bytes"][bench_attention.DROPMASK]
    memory = physical_memory_bytes()
    out.append(
        Target(
            f"{dtype} step {label}: dropmask's temporaries, GiB",
            memory / 2**30,
            True,
            [ours_temp / 2**30],
            unit=" GiB",
            note=(
                f"the bound is this machine's memory; {1e3 * quartiles(ours)[1]:.0f} ms per "
                f"step (median of {len(ours)} calls); Flax not run: its weights alone would "
                f"be {flax_weights_bytes(s['batch'], s['heads'], size.longest) / 2**30:.0f} GiB; "
                f"dropmask's algorithm: {result['algorithm']!r}"
            ),
        )
    )
    return out


def physical_memory_bytes() -> int:
    """This machine's memory (the bound of a step that must fit in it)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def flax_weights_bytes(batch: int, heads: int, length: int) -> int:
    """Bytes of one f32 ``[batch, heads, length, length]`` array of attention weights."""
    return 4 * batch * heads * length * length


def growth_targets(size: Size) -> list[Target]:
    """The blockwise attention's fwd+bwd temporaries at two lengths (``bench_attention``).

    Measured on ``algorithm="blockwise"``, the path whose memory is meant to grow
    linearly; the default path's and the dense path's growth are in the note (the
    default may take the dense path at the shorter length).
    """
    out: list[Target] = []
    short, long = size.growth
    for dtype in _contestants.DTYPES:
        print(f"  attention memory growth, {dtype} {short} -> {long} tokens ...", flush=True)
        ours = [
            bench_attention.attention_temp_bytes(n, dtype, algorithm="blockwise")
            for n in (short, long)
        ]
        note = f"{ours[0] / 2**20:.1f} MiB -> {ours[1] / 2**20:.1f} MiB"
        others = [(None, "the default"), ("dense", "algorithm='dense'")]
        for algorithm, name in others:
            temps = [
                bench_attention.attention_temp_bytes(n, dtype, algorithm=algorithm)
                for n in (short, long)
            ]
            note += f"; {name}: {temps[1] / temps[0]:.1f}x"
        out.append(
            Target(
                f"{dtype} blockwise attention fwd+bwd temporaries, [2, n, 8, 32], causal, "
                f"dropout {bench_attention.RATE}: n = {long} / n = {short}",
                1.25 * long / short,
                True,
                [ours[1] / ours[0]],
                note=note,
            )
        )
    return out


def run(size: Size) -> tuple[list[Target], str]:
    """Measures every target at ``size``; also returns the full compile-time table."""
    compile_rows, compile_table = compile_targets(size)
    # The long-sequence rows last: after Flax's 4096-token step (6 GiB of temporaries)
    # has run in this process, the same paired step measured 7-8 % slower against its
    # baseline (bench_swap's swapped step / Flax's without dropout: 0.94x and 0.955x
    # before it, 1.026x and 1.021x after it, medians of two runs of 9 pairs each).
    measured = (
        dropout_targets(size)
        + step_targets(size)
        + mc_targets(size)
        + structured_targets(size)
        + compile_rows
        + bench_swap.targets(size.quick)
        + bench_scan.targets(size.quick)
        + long_targets(size)
        + growth_targets(size)
    )
    return measured, compile_table


def markdown(targets: list[Target], size: Size) -> str:
    """The one table: target / measured / status / note, and what it means."""
    rows = [t.row() for t in targets]
    lines = [
        "Speed values are medians of paired repeats (quartiles beside them); "
        '"within noise": the quartiles lie on both sides of the bound. Dropout times are '
        "per pass (slope of a short and a long loop of passes in one jit); "
        "forward+backward keeps the passes apart as the layers between them in a network "
        "do. Step times: paired per repeat, each contestant's step timed back to back with "
        "the one it is divided by.",
        "",
    ]
    if size.quick:
        lines += ["**--quick: smaller sizes than the targets'; for checking the suite.**", ""]
    if jax.default_backend() != "gpu":
        lines += [f"GPU rows skipped: JAX's backend here is {jax.default_backend()!r}.", ""]
    table = _harness.markdown_table(
        rows,
        [("target", "target"), ("measured", "measured"), ("status", "status"), ("note", "note")],
    )
    return "\n".join(lines) + "\n" + table


def failed(targets: list[Target]) -> list[str]:
    """Names of the targets that FAIL here."""
    return [t.name for t in targets if t.summary()["status"] == "FAIL"]
