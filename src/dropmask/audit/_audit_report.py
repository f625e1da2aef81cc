"""What an audit returns: the dropout sites it saw and the findings, as a table or JSON."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["CODES", "AuditReport", "Finding", "Site", "SiteFields"]

# Stable codes: scripts may match on them, so a code is never renamed or reused.
CODES: dict[str, str] = {
    "eval-not-deterministic": "a dropout site draws randomness or changes its input in eval",
    "train-never-drops": "a site with rate > 0 drops nothing in training",
    "same-mask-across-steps": "a site draws the same mask at consecutive train steps",
    "mask-ignores-key": "a site draws the same mask whatever dropout key it is given",
    "same-mask-across-sites": "two sites draw the same mask in one step (one shared key)",
    "rate-mismatch": "the realised drop fraction is outside the configured rate's interval",
    "broadcast-batch-axis": "a mask is shared along the batch axis (broadcast_dims has 0)",
    "no-dropout-sites": "the model has no dropout site to audit",
    "attention-dropout-shared": "one attention-weight mask serves every example or head",
    "same-mask-across-iterations": "a scanned or looped layer draws one mask in every iteration",
    "same-mask-across-vmap": "every member of a vmap batch draws one mask (a broadcast stream)",
}
"""Every finding code the audit reports, with what it means; a code is never renamed."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem at one dropout site.

    Attributes:
      code: a key of :data:`CODES`, stable across releases.
      path: the module path of the site, e.g. ``'Dense_0/Dropout_1'`` (``''`` for the
        model as a whole).
      message: what is wrong and how to fix it.

    Example:
      >>> import jax.numpy as jnp, flax.linen as nn
      >>> from dropmask.audit import audit_model
      >>> class Leaky(nn.Module):  # drops in evaluation too
      ...     @nn.compact
      ...     def __call__(self, x, training: bool):
      ...         return nn.Dropout(0.5, deterministic=False)(x)
      >>> finding = audit_model(Leaky(), {}, jnp.ones((8, 16))).findings[0]
      >>> finding.code, finding.path
      ('eval-not-deterministic', 'Dropout_0')
    """

    code: str
    path: str
    message: str


@dataclasses.dataclass(frozen=True)
class SiteFields:
    """What a dropout site is, known when its call is traced: the first fields of the
    report's :class:`Site` and of the recorder's ``SiteInfo``."""

    path: str
    kind: str
    module: str
    rate: float | None
    input_shape: tuple[int, ...]
    broadcast_dims: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Site(SiteFields):
    """One dropout site as the audit saw it in training mode.

    Attributes:
      path: module path (a module called twice appears as ``path#1``).
      kind: ``'dropout'``, ``'word'``, ``'drop_path'``, ``'gaussian'``, ``'alpha'``,
        ``'attention'`` (Flax attention's weight dropout, measured on the weights),
        ``'custom'`` (a module that drew from a PRNG stream) or ``'other'`` (drew, but
        its output is not a masked copy of its input).
      module: the module's class name.
      rate: the configured rate when it is a static number, else None.
      input_shape: shape of the masked input (of the weights
        ``[batch..., heads, q, kv]`` for attention).
      broadcast_dims: axes sharing one mask value.
      drop_fraction: realised fraction of nonzero inputs dropped (None if unmeasured).
      decisions: independent keep/drop decisions behind ``drop_fraction``.

    Example:
      >>> import jax.numpy as jnp, flax.linen as nn
      >>> from dropmask.audit import audit_model
      >>> site = audit_model(nn.Dropout(0.5), {}, jnp.ones((8, 16))).sites[0]
      >>> site.kind, site.rate, site.input_shape
      ('dropout', 0.5, (8, 16))
    """

    drop_fraction: float | None
    decisions: int


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """The result of an audit: ``ok`` when there is no finding.

    Attributes:
      sites: every dropout site seen, in call order.
      findings: problems, each with a stable code, a path and a fix.

    Example:
      >>> import jax.numpy as jnp, flax.linen as nn
      >>> from dropmask.audit import audit_model
      >>> report = audit_model(nn.Dropout(0.5), {}, jnp.ones((8, 16)))
      >>> report.ok, [site.path for site in report.sites], report.codes
      (True, ['Dropout'], set())
    """

    sites: tuple[Site, ...] = ()
    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the audit found nothing wrong."""
        return not self.findings

    @property
    def codes(self) -> set[str]:
        """The set of finding codes, for quick checks (``'rate-mismatch' in r.codes``)."""
        return {f.code for f in self.findings}

    def merged(self, other: AuditReport) -> AuditReport:
        """Both reports' sites (first one's wins per path) and findings, deduplicated."""
        paths = {s.path for s in self.sites}
        sites = self.sites + tuple(s for s in other.sites if s.path not in paths)
        findings = tuple(dict.fromkeys(self.findings + other.findings))
        return AuditReport(sites, findings)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{'ok', 'sites', 'findings'}``."""
        return {
            "ok": self.ok,
            "sites": [dataclasses.asdict(s) for s in self.sites],
            "findings": [dataclasses.asdict(f) for f in self.findings],
        }

    def to_json(self, indent: int | None = 1) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        rows = [
            (
                s.path,
                s.kind,
                "-" if s.rate is None else f"{s.rate:g}",
                "x".join(map(str, s.input_shape)) or "()",
                ",".join(map(str, s.broadcast_dims)) or "-",
                "-" if s.drop_fraction is None else f"{s.drop_fraction:.3f}",
                str(s.decisions),
            )
            for s in self.sites
        ]
        head = ("site", "kind", "rate", "input", "bcast", "dropped", "decisions")
        lines = _table(head, rows)
        if self.ok:
            lines.append("OK: no finding.")
        else:
            lines.append(f"{len(self.findings)} finding(s):")
            for f in self.findings:
                lines.append(f"  [{f.code}] {f.path or '(model)'}: {f.message}")
        return "\n".join(lines)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    if not rows:
        return ["(no dropout site seen)"]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    return [fmt(head), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]
