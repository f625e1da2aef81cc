"""Each claim about dropout's last line, its verdict, and the number behind it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from . import _measure as m

__all__ = [
    "DEPENDS",
    "DOCUMENTED",
    "HOLDS",
    "NOT",
    "Claim",
    "documented",
    "fact_claims",
    "timing_claims",
]

HOLDS, NOT, DEPENDS = "holds", "does not hold", "depends"
"""The three verdicts of a claim (it holds, it does not hold, it depends on the backend)."""

# The verdicts docs/select_vs_where.md states, by backend ("*": every backend). These
# are facts about JAX and XLA, not about dropmask: an upgrade that changes one makes
# `dropmask why` exit 1, so the document is corrected, instead of failing a unit test.
DOCUMENTED: dict[str, dict[str, str]] = {
    "*": {
        "where-is-select": HOLDS,
        "zero-promotes": NOT,
        "select-is-strict": HOLDS,
        "tiny-nonzero": NOT,
        "select-backward-skips": NOT,
        "select-guards-keep-zero": NOT,
        "where-guards-log-zero": NOT,
        "f16-overflow": HOLDS,
        "residual-bytes": HOLDS,
    },
    "cpu": {
        "multiply-converts-mask": DEPENDS,
        "multiply-leaks-nan": DEPENDS,
        "generator-apart": HOLDS,
    },
}


def documented(backend: str) -> dict[str, str]:
    """``{claim id: verdict}`` that the document states for ``backend``."""
    return {**DOCUMENTED["*"], **DOCUMENTED.get(backend, {})}


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim checked on this machine.

    Attributes:
      id: a stable slug, e.g. ``'where-is-select'``.
      claim: the claim in one sentence.
      verdict: ``'holds'``, ``'does not hold'`` or ``'depends'``.
      evidence: the measured number or fact behind the verdict, in words.
      data: the raw measurement (JSON-ready).

    Example:
      >>> from dropmask import why
      >>> claim = why.Claim("where-is-select", "where is select", why.HOLDS, "same HLO", [])
      >>> report = why.WhyReport("0.0", "cpu", "cpu", "x86_64", (claim,), seconds=0.1)
      >>> str(report).splitlines()[2:]  # its two lines in the table `dropmask why` prints
      ['holds  where is select  [where-is-select]', '       -> same HLO']
    """

    id: str
    claim: str
    verdict: str
    evidence: str
    data: Any


def _split(flags: dict[str, bool]) -> str:
    if all(flags.values()):
        return HOLDS
    return NOT if not any(flags.values()) else DEPENDS


def _where_is_select(study: list[dict[str, Any]]) -> Claim:
    rows = [r for r in study if r["form"] == "where"]
    same = sum(r["hlo same as select"] for r in rows)
    return Claim(
        "where-is-select",
        "jnp.where(mask, x / keep, 0) is a wrapper over lax.select: the same program",
        HOLDS if same == len(rows) else (NOT if same == 0 else DEPENDS),
        f"optimized HLO identical to select's in {same}/{len(rows)} cases (f32, bf16; fwd, "
        "fwd+bwd)",
        rows,
    )


def _zero_promotes(study: list[dict[str, Any]]) -> Claim:
    table = m.dtype_table()
    converts = max(r["jaxpr array converts"] for r in study if r["form"] == "where")
    kept = {d: table[d]["where"] == table[d]["select"] for d in table}
    return Claim(
        "zero-promotes",
        "where's Python 0 is float32, so f16/bf16 inputs are promoted and converted",
        NOT if all(kept.values()) and converts == 0 else HOLDS,
        f"where(mask, bf16, 0) -> {table['bf16']['where']}, f16 -> {table['f16']['where']}; "
        f"{converts} array-sized converts; only a typed zero promotes "
        f"(np.float32(0) -> {table['bf16']['where(np.float32(0))']})",
        table,
    )


def _select_is_strict() -> Claim:
    facts = m.select_is_strict()
    return Claim(
        "select-is-strict",
        "lax.select with zeros_like(x) guarantees the output's shape and dtype",
        HOLDS if facts["select rejects"] else NOT,
        f"select rejects a float32 zeros operand for bf16 x: {facts['select rejects']}; "
        f"where promotes instead: {facts['where promotes']}",
        facts,
    )


def _multiply_converts(study: list[dict[str, Any]]) -> Claim:
    rows = [r for r in study if r["form"] == "multiply" and r["mode"] == "fwd"]
    converted = {r["dtype"]: r["hlo select"] == 0 for r in rows}
    kept = [d for d, c in converted.items() if c]
    return Claim(
        "multiply-converts-mask",
        "mask * x turns the boolean mask into a float array and multiplies",
        _split(converted),
        f"jaxpr: {rows[0]['jaxpr array converts']} array-sized convert; compiled: multiply "
        f"kept in {kept or 'no dtype'}, rewritten into a select elsewhere",
        rows,
    )


def _tiny_nonzero() -> Claim:
    zero = m.ieee_zero()
    return Claim(
        "tiny-nonzero",
        "a huge x / keep times a dropped 0 may leave a tiny nonzero",
        NOT if all(zero.values()) else HOLDS,
        "finite * 0 is exactly 0 at +-max, smallest normal and subnormal in "
        + ", ".join(d for d, ok in zero.items() if ok),
        zero,
    )


def _multiply_leaks_nan() -> Claim:
    table = m.specials()
    clean = all(v["nan"] == 0 for k, v in table.items() if "multiply" not in k)
    leaks = {k: v["nan"] > 0 for k, v in table.items() if "multiply" in k}
    verdict = _split(leaks) if clean else NOT
    return Claim(
        "multiply-leaks-nan",
        "the multiply form turns inf/NaN at dropped positions into NaN; select gives 0",
        verdict,
        "NaN from multiply in: "
        + (", ".join(k.replace(" multiply", "") for k, v in leaks.items() if v) or "none")
        + f"; select/where NaN-free: {clean}",
        table,
    )


def _backward_skips() -> Claim:
    facts = m.backward_selects()
    full = all(s == facts["input size"] for s in facts["backward select sizes"])
    return Claim(
        "select-backward-skips",
        "select's backward pass skips the dropped elements and saves work",
        NOT if full else HOLDS,
        f"the backward jaxpr holds a select_n over {facts['backward select sizes']} of "
        f"{facts['input size']} elements: every element",
        facts,
    )


def _gradient(
    name: str, field: str, claim: str, edges: dict[str, dict[str, bool]]
) -> Callable[[], Claim]:
    def build() -> Claim:
        nan = edges["select"][field]
        return Claim(
            name,
            claim,
            NOT if nan else HOLDS,
            f"{field}: " + ", ".join(f"{k} {v[field]}" for k, v in edges.items()),
            edges,
        )

    return build


def _f16_overflow() -> Claim:
    facts = m.overflow_f16()
    keep = facts["first keep that overflows"]
    return Claim(
        "f16-overflow",
        "in float16, x / keep_prob can overflow to inf for a small keep_prob",
        HOLDS if keep is not None else NOT,
        f"f16 {facts['value']:g} / {keep} = inf (f16 max {facts['f16 max']:g}), in every form",
        facts,
    )


def _residuals() -> Claim:
    per = m.residual_bytes()
    flax, ours = per["bernoulli + select"], per["dropmask.dropout"]
    none = per["dropmask.dropout residual='none'"]
    return Claim(
        "residual-bytes",
        "bernoulli + select stores its mask for the backward pass; dropmask stores 1 bit per "
        "element, or none with residual='none'",
        HOLDS if flax >= 1 and ours <= 0.13 and none < 0.01 else NOT,
        f"vjp residuals: bernoulli + select {flax:.3f} B/element (its bool mask "
        f"{per['bernoulli + select: bool mask']:.0f} B, the rest a broadcast zeros array), "
        f"dropmask.dropout {ours:.4f} B/element (its packed keep-flags), with "
        f"residual='none' {none:.4f} B/element (its key words)",
        per,
    )


def _generator_apart() -> Claim:
    facts = m.generator_programs()
    fwd = [facts[f"forward generators, residual={r!r}"] for r in ("mask", "none")]
    bwd = [facts[f"backward generators, residual={r!r}"] for r in ("mask", "none")]
    holds = fwd == [1, 1] and bwd == [0, 1] and facts["forward programs equal"]
    return Claim(
        "generator-apart",
        "XLA keeps dropmask's generator in its own computation (fused into the consumer it "
        "would run once per element its words serve); both residual modes compile to one "
        "forward program, and only residual='none' draws again in the backward pass",
        HOLDS if holds else NOT,
        f"generator computations: forward {fwd[0]} (residual='mask'), {fwd[1]} ('none'); backward "
        f"jitted apart {bwd[0]}, {bwd[1]}; forward programs equal: "
        f"{facts['forward programs equal']}",
        facts,
    )


def fact_claims() -> list[Claim]:
    """The claims decided by compiled programs, dtypes and values (no timing)."""
    study, edges = m.hlo_study(), m.gradient_edges()
    builders: list[Callable[[], Claim]] = [
        lambda: _where_is_select(study),
        lambda: _zero_promotes(study),
        _select_is_strict,
        lambda: _multiply_converts(study),
        _tiny_nonzero,
        _multiply_leaks_nan,
        _backward_skips,
        _gradient(
            "select-guards-keep-zero",
            "keep=0 grad NaN",
            "select keeps gradients finite at keep_prob == 0 (rate 1)",
            edges,
        ),
        _gradient(
            "where-guards-log-zero",
            "log(0) at dropped: grad NaN",
            "select/where stop a NaN gradient from log(0) at dropped positions",
            edges,
        ),
        _f16_overflow,
        _residuals,
        _generator_apart,
    ]
    return [build() for build in builders]


# Below this ratio a time difference is not called "slower", however quiet the machine.
NOISE = 1.15


def _ratio_claim(cid: str, claim: str, times: dict, num: str, den: str, modes: list[str]) -> Claim:
    """``num`` is slower where its time ratio to ``den`` passes both ``NOISE`` and the
    ratio between two copies of ``den``'s own program (the measured noise)."""
    ratios = {mode: times[mode][num] / times[mode][den] for mode in modes}
    control = {mode: times[mode]["select (again)"] / times[mode][den] for mode in modes}
    floor = max([NOISE, *control.values(), *(1 / c for c in control.values())])
    slower = {mode: r >= floor for mode, r in ratios.items()}
    return Claim(
        cid,
        claim,
        _split(slower),
        f"{num} / {den} time: "
        + ", ".join(f"{mode} {r:.2f}x" for mode, r in ratios.items())
        + f" (slower from {floor:.2f}x: two copies of one program differ by up to that)",
        {
            "ratios": {mode: round(r, 3) for mode, r in ratios.items()},
            "noise": round(floor, 3),
        },
    )


def timing_claims(n: int, repeats: int) -> list[Claim]:
    """The speed claims, from median jitted-call times at ``n`` elements."""
    times = m.timings(n, repeats)
    modes = list(times)
    ours = {
        mode: times[mode]["dropmask.dropout"] / times[mode]["bernoulli + select"] for mode in modes
    }
    cond = m.cond_study()
    skip = cond["scalar where ms"] / cond["scalar cond ms"]
    vmapped = cond["vmap cond ms"] / cond["vmap where ms"]
    return [
        _ratio_claim(
            "where-slower", "where is slower than select", times, "where", "select", modes
        ),
        _ratio_claim(
            "multiply-slower",
            "mask * x / keep is slower than select",
            times,
            "multiply",
            "select",
            modes,
        ),
        Claim(
            "dropmask-faster",
            "dropmask.dropout is faster than bernoulli + select (masks drawn inside)",
            _split({k: r < 1 for k, r in ours.items()}),
            "dropmask / bernoulli+select time: "
            + ", ".join(f"{k} {r:.2f}x" for k, r in ours.items()),
            {"ratios": {k: round(r, 3) for k, r in ours.items()}, "ms": times},
        ),
        Claim(
            "mask-beats-cond",
            "masking (compute both, then select) is faster than lax.cond",
            DEPENDS if skip > 1 and not cond["vmap cond keeps a cond"] else HOLDS,
            f"one scalar predicate: cond skips the expensive branch, where is {skip:.1f}x "
            f"slower; per-example predicate under vmap: cond becomes a select of both branches "
            f"(cond in jaxpr: {cond['vmap cond keeps a cond']}), cond / where {vmapped:.2f}x",
            cond,
        ),
    ]
