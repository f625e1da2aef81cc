"""What the Linen and NNX model audits share: judging four recorded calls of a model.

Both audits call the model twice in evaluation and twice in training, two keys (or
two stream positions) apart, recording each call under the phases ``eval0``,
``eval1``, ``train0`` and ``train1``; :func:`model_report` turns that recording into
an :class:`AuditReport`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import _findings
from ._audit_report import AuditReport, Finding
from ._mode import Mode
from ._sites import Recorder

__all__ = ["model_report", "trees_equal"]


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
