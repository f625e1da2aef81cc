"""Turning recorded drop patterns into findings, each with a stable code and a fix."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ._audit_report import Finding, Site
from ._mode import Mode
from ._sites import Observation, SiteInfo

__all__ = [
    "across_iterations",
    "across_sites",
    "across_steps",
    "eval_findings",
    "ignores_key",
    "site_findings",
    "summarize",
]

# Half-width of the acceptance interval in binomial standard deviations: a correct
# layer is flagged with probability below 1e-4 per site.
SIGMAS = 4.0
# Fewest independent decisions for two equal masks to be evidence of one shared key
# rather than chance (2**-16 at rate 0.5).
MIN_DECISIONS = 16


def _dropped(obs: Sequence[Observation]) -> tuple[int, int]:
    """(dropped, valid) element counts over observations with a pattern."""
    d = sum(int(o.dropped.sum()) for o in obs if o.dropped is not None)
    v = sum(int(o.valid.sum()) for o in obs if o.valid is not None)
    return d, v


def _decisions(info: SiteInfo, obs: Sequence[Observation]) -> int:
    """Independent draws behind the observed fraction: decisions x valid share x calls."""
    size = math.prod(info.input_shape) or 1
    per_call = math.prod(info.decision_shape) if info.decision_shape else 1
    _, valid = _dropped(obs)
    calls = sum(o.dropped is not None for o in obs)
    return max(1, round(per_call * valid / size)) if calls else 0


def summarize(sites: Mapping[str, SiteInfo], obs: Mapping[str, list[Observation]]) -> list[Site]:
    """One :class:`Site` row per recorded site, with its realised drop fraction."""
    rows = []
    for name, info in sites.items():
        seen = obs.get(name, [])
        dropped, valid = _dropped(seen)
        fraction = dropped / valid if valid and info.kind not in ("other", "gaussian") else None
        rows.append(
            Site(
                name,
                info.kind,
                info.module,
                info.rate,
                info.input_shape,
                info.broadcast_dims,
                fraction,
                _decisions(info, seen),
            )
        )
    return rows


def site_findings(
    sites: Mapping[str, SiteInfo], obs: Mapping[str, list[Observation]], mode: Mode
) -> list[Finding]:
    """Per-site checks in training: never drops, rate outside its interval, shared masks."""
    out = []
    for name, info in sites.items():
        seen = [o for o in obs.get(name, []) if o.dropped is not None]
        if info.kind in ("other", "gaussian") or not seen:
            out.extend(_shared(info, seen))
            continue
        # A mask repeated across vmap members or loop iterations is one draw (the
        # repeat has its own finding): counted once, the rate's interval stays honest.
        distinct = _distinct(seen)
        dropped, valid = _dropped(distinct)
        rate, n = info.rate, _decisions(info, distinct)
        if rate is not None and rate > 0 and dropped == 0 and valid:
            out.append(
                Finding(
                    "train-never-drops",
                    name,
                    f"rate={rate:g} but no element was dropped in training ({valid} inputs): "
                    f"the layer is deterministic in training. Build it with {mode.wiring()}, "
                    f"and let the train step apply the model {mode.training()}.",
                )
            )
        elif rate is not None and 0 < rate < 1 and valid:
            out.extend(_rate(info, dropped / valid, n))
        out.extend(_shared(info, seen))
    return out


def _distinct(seen: Sequence[Observation]) -> list[Observation]:
    """``seen`` without the observations whose dropped pattern repeats an earlier one."""
    out: list[Observation] = []
    patterns: list[np.ndarray] = []
    for o in seen:
        d = o.dropped
        if d is None or not any(p.shape == d.shape and np.array_equal(p, d) for p in patterns):
            out.append(o)
            if d is not None:
                patterns.append(d)
    return out


def _shared(info: SiteInfo, seen: Sequence[Observation]) -> list[Finding]:
    return (
        _attention_shared(info, seen) if info.kind == "attention" else _batch_broadcast(info, seen)
    )


def _equal_along(seen: Sequence[Observation], axis: int) -> bool:
    """Every observed pattern drops some but not all elements, identically along ``axis``."""

    def equal(a: np.ndarray) -> bool:
        first = np.take(a, [0], axis=axis)
        return bool((a == first).all())

    return bool(seen) and all(
        o.dropped is not None
        and o.dropped.shape[axis] > 1
        and o.dropped.any()
        and not o.dropped.all()
        and equal(o.dropped)
        and (o.valid is None or equal(o.valid))
        for o in seen
    )


def _attention_shared(info: SiteInfo, seen: Sequence[Observation]) -> list[Finding]:
    """Attention-weight dropout whose mask is one for every example or every head."""
    ndim = len(info.input_shape)
    if ndim < 3:
        return []
    axes = {"example": 0, "head": ndim - 3} if ndim > 3 else {"head": 0}
    shared = [
        name
        for name, axis in axes.items()
        if info.input_shape[axis] > 1 and (axis in info.broadcast_dims or _equal_along(seen, axis))
    ]
    if not shared:
        return []
    return [
        Finding(
            "attention-dropout-shared",
            info.path,
            f"one attention-weight mask serves every {' and every '.join(shared)} (weights "
            f"{info.input_shape}, broadcast_dims={info.broadcast_dims}): they all drop the same "
            "query-key pairs, as with Flax's default broadcast_dropout=True. "
            "Pass broadcast_dropout=False to the attention layer.",
        )
    ]


def _rate(info: SiteInfo, fraction: float, n: int) -> list[Finding]:
    rate = info.rate or 0.0
    half = SIGMAS * math.sqrt(rate * (1 - rate) / n) + 1.0 / n
    if abs(fraction - rate) <= half:
        return []
    hint = (
        " It is close to 1 - rate: the layer treats rate as the keep probability; "
        "dropout's rate is the probability of dropping."
        if abs(fraction - (1 - rate)) <= half
        else " Check that the configured rate is the one the layer uses."
    )
    return [
        Finding(
            "rate-mismatch",
            info.path,
            f"configured rate {rate:g}, but {fraction:.3f} of the inputs were dropped, outside "
            f"[{max(0.0, rate - half):.3f}, {min(1.0, rate + half):.3f}] ({SIGMAS:g} sigma over "
            f"{n} decisions).{hint}",
        )
    ]


def _batch_broadcast(info: SiteInfo, seen: Sequence[Observation]) -> list[Finding]:
    if len(info.input_shape) < 2 or info.kind == "drop_path" or info.input_shape[0] < 2:
        return []
    static = 0 in info.broadcast_dims
    rows_equal = bool(seen) and all(
        o.dropped is not None
        and o.dropped.any()
        and not o.dropped.all()
        and (o.dropped == o.dropped[:1]).all()
        and (o.valid is None or (o.valid == o.valid[:1]).all())
        for o in seen
    )
    if not (static or rows_equal):
        return []
    return [
        Finding(
            "broadcast-batch-axis",
            info.path,
            f"the mask is shared along axis 0 (input {info.input_shape}, broadcast_dims="
            f"{info.broadcast_dims}), so every example drops the same units. Broadcast over "
            "non-batch axes only, e.g. broadcast_dims=(1,) for [batch, time, features].",
        )
    ]


def _same(a: Observation, b: Observation) -> bool:
    """Equal drop decisions wherever both calls had a valid (nonzero) input."""
    if a.dropped is None or b.dropped is None or a.dropped.shape != b.dropped.shape:
        return False
    both = a.valid & b.valid if a.valid is not None and b.valid is not None else True
    da, db = a.dropped & both, b.dropped & both
    return bool(da.any()) and not bool(da.all()) and bool((da == db).all())


def _any_same(a: Sequence[Observation], b: Sequence[Observation]) -> bool:
    """Some execution in ``a`` drew the mask of some execution in ``b``.

    Executions of one site arrive in no fixed order (devices of a ``pmap``, iterations
    of a scan), so masks are matched as sets; a chance match needs ``MIN_DECISIONS``
    equal draws.
    """
    return any(_same(x, y) for x in a for y in b)


def _informative(info: SiteInfo) -> bool:
    return math.prod(info.decision_shape) >= MIN_DECISIONS and info.kind != "other"


def across_sites(
    sites: Mapping[str, SiteInfo], obs: Mapping[str, list[Observation]]
) -> list[Finding]:
    """Two sites with equal masks (or the same explicit key) in one call: a shared key."""
    names = [n for n in sites if obs.get(n)]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            oa, ob = obs[a][0], obs[b][0]
            same_key = oa.key is not None and ob.key is not None and np.array_equal(oa.key, ob.key)
            both = _informative(sites[a]) and _informative(sites[b])
            shared = same_key or (both and _any_same(obs[a], obs[b]))
            if shared and _base(a) == _base(b):
                out.append(_iteration_finding(b, f"{a} and {b}"))
            elif shared:
                out.append(
                    Finding(
                        "same-mask-across-sites",
                        b,
                        f"draws the same mask as {a}: both layers get one key. Let each layer "
                        "draw from the named stream (self.make_rng('dropout') / rngs=...) "
                        "instead of passing one key to several layers, or split the key.",
                    )
                )
    return out


def _base(site: str) -> str:
    """The module path of a site: ``'Block_0/Dropout_0'`` for ``'Block_0/Dropout_0#2'``."""
    return site.split("#")[0]


def _iteration_finding(path: str, where: str, *, carried_key: bool = False) -> Finding:
    if carried_key:
        cause = (
            "the key it is given at call time (rngs=key) is the same in every iteration: "
            "one key carried through the scan unsplit. Scan over split keys instead "
            "(xs=jax.random.split(key, length)), or fold the iteration in "
            "(jax.random.fold_in(key, i))."
        )
    else:
        cause = (
            "the dropout stream is not split per iteration. With nn.scan pass "
            "split_rngs={'params': True, 'dropout': True}; with nnx.scan, a module "
            "broadcast into the scan (in_axes=None) draws one key and counter in every "
            "iteration and its counter's advance is dropped: pass it as nnx.Carry (its "
            "stream then advances per iteration) or split its stream per iteration "
            "(nnx.split_rngs(splits=length, only='dropout') with nnx.StateAxes"
            "({'dropout': 0, ...: None})); in a Python loop draw a new key per call "
            "(self.make_rng('dropout'))."
        )
    return Finding(
        "same-mask-across-iterations",
        path,
        f"draws the same mask in every iteration ({where}) of a loop or scan over one "
        f"layer: {cause}",
    )


def _vmap_finding(path: str, members: int) -> Finding:
    return Finding(
        "same-mask-across-vmap",
        path,
        f"draws the same mask for every member of a vmap batch ({members} members): its "
        "stream is broadcast into the vmap, so each member draws from one key and counter. "
        "With nnx.vmap split the stream over the batch: nnx.split_rngs(splits=batch, "
        "only='dropout') around nnx.vmap(in_axes=(nnx.StateAxes({'dropout': 0, ...: "
        "None}), 0)), or call the model on the whole batch without vmap; with nn.vmap "
        "pass split_rngs={'params': False, 'dropout': True}; with jax.vmap pass one key "
        "per member (jax.random.split(key, batch)).",
    )


def _same_key(seen: Sequence[Observation]) -> bool:
    """Every execution was given the same explicit key (a key carried unsplit)."""
    keys = [o.key for o in seen if o.key is not None]
    return len(keys) == len(seen) > 0 and all(np.array_equal(keys[0], k) for k in keys)


def across_iterations(
    sites: Mapping[str, SiteInfo], calls: Sequence[Mapping[str, list[Observation]]]
) -> list[Finding]:
    """A site executed several times in one call with equal masks: the iterations of a
    scanned layer, or the members of a vmap batch (``SiteInfo.vmapped``)."""
    out = []
    for name, info in sites.items():
        if not _informative(info):
            continue
        for by_site in calls:
            seen = by_site.get(name, [])
            if any(_same(a, b) for i, a in enumerate(seen) for b in seen[i + 1 :]):
                if info.vmapped:
                    out.append(_vmap_finding(name, len(seen)))
                else:
                    where = f"{len(seen)} executions in one call"
                    out.append(_iteration_finding(name, where, carried_key=_same_key(seen)))
                break
    return out


# How a train step derives a fresh key per step, as each front end spells it.
_FRESH_KEY = {
    "nnx": (
        "Rebuild the model inside the train step from the state's current step "
        "(NnxTrainState.model(params) re-keys its dropout streams by state.step), or "
        "carry the model's stream state from step to step (nnx.split / nnx.merge) "
        "instead of rebuilding it from the same keys."
    ),
}
_FRESH_KEY_LINEN = (
    "Derive a fresh key per step inside the train step: rngs={'dropout': "
    "jax.random.fold_in(state.key, state.step)}."
)


def across_steps(
    sites: Mapping[str, SiteInfo],
    steps: Sequence[Mapping[str, list[Observation]]],
    mode: Mode,
) -> list[Finding]:
    """A site whose mask at step t equals its mask at step t + 1: the key never changes.
    The fix is phrased for ``mode``'s front end."""
    fix = _FRESH_KEY.get(mode.kind, _FRESH_KEY_LINEN)
    out = []
    for name, info in sites.items():
        if not _informative(info):
            continue
        for before, after in zip(steps, steps[1:], strict=False):
            if _any_same(before.get(name, []), after.get(name, [])):
                out.append(
                    Finding(
                        "same-mask-across-steps",
                        name,
                        f"draws the same mask at consecutive train steps. {fix}",
                    )
                )
                break
    return out


def ignores_key(
    sites: Mapping[str, SiteInfo],
    first: Mapping[str, list[Observation]],
    second: Mapping[str, list[Observation]],
) -> list[Finding]:
    """A site whose mask is the same under two different dropout keys."""
    out = []
    for name, info in sites.items():
        if _informative(info) and first.get(name) and second.get(name):
            if _any_same(first[name], second[name]):
                out.append(
                    Finding(
                        "mask-ignores-key",
                        name,
                        "draws the same mask under two different dropout keys: it uses a fixed "
                        "key. Draw it with self.make_rng('dropout') (Linen) or from the "
                        "module's rngs stream (NNX).",
                    )
                )
    return out


def eval_findings(
    sites: Mapping[str, SiteInfo],
    drew: Mapping[tuple[str, str], bool],
    phases: Sequence[str],
    obs: Sequence[Mapping[str, list[Observation]]],
    outputs_equal: bool,
    mode: Mode,
) -> list[Finding]:
    """Sites that draw or drop in evaluation, and evaluation outputs that differ by key.

    A module that is not a dropout layer (kind ``"other"``, e.g. a recurrent wrapper
    that hands per-step keys to its cell) may take keys in evaluation without using
    them; it is flagged only through the outputs, when they differ by key.
    """
    out = []
    for name, info in sites.items():
        drop = any(
            o.dropped is not None and bool(o.dropped.any()) for ph in obs for o in ph.get(name, [])
        )
        drew_key = info.kind != "other" and any(drew.get((phase, name), False) for phase in phases)
        if drop or drew_key:
            out.append(
                Finding(
                    "eval-not-deterministic",
                    name,
                    "draws random numbers or drops elements in evaluation (model "
                    f"{mode.evaluation()}). Build it with {mode.wiring()}.",
                )
            )
    if not out and not outputs_equal:
        out.append(
            Finding(
                "eval-not-deterministic",
                "",
                f"two evaluation calls (model {mode.evaluation()}) with different dropout "
                "keys gave different outputs. Build every random layer with "
                f"{mode.wiring()}.",
            )
        )
    return out
