"""What the Linen and NNX audits share: judging recorded calls of a model or a step.

Both model audits call the model twice in evaluation and twice in training, two keys
(or two stream positions) apart, recording each call under the phases ``eval0``,
``eval1``, ``train0`` and ``train1``; :func:`model_report` turns that recording into
an :class:`AuditReport`. Both step audits run the train step on a few batches, one
phase per step; :func:`step_report` judges those.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from .._checks import check_callable
from .._errors import DropmaskValueError, user_error
from . import _findings
from ._audit_report import AuditReport, Finding
from ._mode import Mode
from ._sites import Recorder

__all__ = ["checked_step", "model_report", "step_report", "trees_equal"]


def checked_step(train_step: Any, batches: Iterable[Any], *, caller: str) -> list[Any]:
    """The batches of a step audit as a list, once ``train_step`` is callable and there
    are at least two batches to compare masks between."""
    check_callable(
        train_step,
        caller=caller,
        name="train_step",
        what="callable as train_step(state, batch)",
        fix="Pass the step function itself.",
    )
    batches = list(batches)
    if len(batches) < 2:
        raise user_error(
            DropmaskValueError,
            "batches must hold at least 2 batches to compare masks between steps, got "
            f"{len(batches)}",
            "Pass e.g. [batch, batch, batch].",
            caller=caller,
        )
    return batches


def trees_equal(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` have the same leaves with equal values (NaN equals NaN)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(la, lb, strict=True)
    )


def model_report(rec: Recorder, eval_equal: bool, mode: Mode) -> AuditReport:
    """The findings of a model audit's four calls.

    Args:
      rec: the recording of the calls ``eval0``, ``eval1``, ``train0``, ``train1``.
      eval_equal: whether the two evaluation calls returned equal outputs.
      mode: how the model selects training and evaluation, to phrase the fixes.
    """
    rec.compact()
    evals = [rec.by_phase("eval0"), rec.by_phase("eval1")]
    train0, train1 = rec.by_phase("train0"), rec.by_phase("train1")
    trained = {n: s for n, s in rec.sites.items() if n in train0 or n in train1}
    if not rec.sites:
        missing = Finding(
            "no-dropout-sites",
            "",
            "no dropout layer and no module drawing from a PRNG stream was called. Add "
            "dropout, or check that the model is the one you train.",
        )
        return AuditReport((), (missing,))
    both = {n: train0.get(n, []) + train1.get(n, []) for n in trained}
    findings = [
        *_findings.eval_findings(rec.sites, rec.drew, ["eval0", "eval1"], evals, eval_equal, mode),
        *_findings.site_findings(trained, both, mode),
        *_findings.across_sites(trained, train0),
        *_findings.across_iterations(trained, [train0, train1]),
        *_findings.ignores_key(trained, train0, train1),
    ]
    sites = _findings.summarize(trained or rec.sites, both)
    return AuditReport(tuple(sites), tuple(dict.fromkeys(findings)))


def step_report(rec: Recorder, phases: list[str], mode: Mode) -> AuditReport:
    """The findings of a step audit: one recorded phase per train step, in order.

    Args:
      rec: the recording of the steps' model calls.
      phases: the phase of each step, in order.
      mode: how the step selects training, to phrase the fixes.
    """
    rec.compact()
    if not rec.sites:
        missing = Finding(
            "no-dropout-sites",
            "",
            f"the train step called no dropout layer. Check that it applies the model "
            f"{mode.training()} and that the model has dropout. Pass the plain, jitted or "
            "pmapped step itself, not a wrapper around a compiled one "
            "(step.lower(...).compile()): a compiled program cannot be observed.",
        )
        return AuditReport((), (missing,))
    steps = [rec.by_phase(p) for p in phases]
    merged: dict[str, list[Any]] = {}
    for by_site in steps:
        for name, obs in by_site.items():
            merged.setdefault(name, []).extend(obs)
    findings = _findings.site_findings(rec.sites, merged, mode)
    for by_site in steps:
        findings.extend(_findings.across_sites(rec.sites, by_site))
    findings.extend(_findings.across_iterations(rec.sites, steps))
    findings.extend(_findings.across_steps(rec.sites, steps, mode))
    sites = _findings.summarize(rec.sites, merged)
    return AuditReport(tuple(sites), tuple(dict.fromkeys(findings)))
