"""The report of ``dropmask why``: each claim measured, with its verdict."""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from typing import Any

import jax

from .._errors import DropmaskValueError, user_error
from ._claims import DEPENDS, HOLDS, NOT, Claim, documented, fact_claims, timing_claims
from ._measure import forms

__all__ = ["DEPENDS", "HOLDS", "NOT", "Claim", "WhyReport", "check_claims", "forms"]


@dataclasses.dataclass(frozen=True)
class WhyReport:
    """Verdicts for every claim, with the JAX version and backend they hold on.

    Attributes:
      jax_version: ``jax.__version__``.
      backend: ``jax.default_backend()``, e.g. ``'cpu'``.
      device: the first device's kind, e.g. ``'cpu'`` or ``'NVIDIA H200'``.
      machine: ``platform.machine()`` and processor.
      claims: one :class:`Claim` each.
      seconds: wall time of the measurements.

    Example:
      >>> from dropmask import why
      >>> claim = why.Claim("f16-overflow", "x / keep overflows float16", why.NOT, "no inf", [])
      >>> report = why.WhyReport("0.0", "cpu", "cpu", "x86_64", (claim,), seconds=0.1)
      >>> report.differences()  # docs/select_vs_where.md says it holds: (documented, measured)
      {'f16-overflow': ('holds', 'does not hold')}
    """

    jax_version: str
    backend: str
    device: str
    machine: str
    claims: tuple[Claim, ...]
    seconds: float

    def verdicts(self) -> dict[str, str]:
        """``{claim id: verdict}``."""
        return {c.id: c.verdict for c in self.claims}

    def differences(self) -> dict[str, tuple[str, str]]:
        """``{claim id: (documented, measured)}`` where the verdict is not the documented one.

        Empty when every measured claim agrees with docs/select_vs_where.md.
        """
        expected = documented(self.backend)
        return {
            c.id: (expected[c.id], c.verdict)
            for c in self.claims
            if c.id in expected and c.verdict != expected[c.id]
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with every claim's raw data."""
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def __str__(self) -> str:
        lines = [
            f"dropmask why: jax {self.jax_version}, {self.backend} ({self.device}, "
            f"{self.machine}), {self.seconds:.1f} s",
            "",
        ]
        width = max(len(c.verdict) for c in self.claims) if self.claims else 0
        for c in self.claims:
            lines.append(f"{c.verdict.ljust(width)}  {c.claim}  [{c.id}]")
            lines.append(f"{' ' * width}  -> {c.evidence}")
        for claim_id, (expected, measured) in self.differences().items():
            lines.append(
                f"CHANGED: {claim_id} {measured!r}, documented {expected!r}: JAX or XLA changed;"
                " update docs/select_vs_where.md and DOCUMENTED in dropmask/why/_claims.py"
            )
        return "\n".join(lines)


def check_claims(*, timing: bool = True, size: int = 1 << 20, repeats: int = 15) -> WhyReport:
    """Measures every claim on the default backend and returns the verdicts.

    Args:
      timing: also run the speed claims (a few seconds on 2 CPU cores).
      size: elements per array in the speed claims (float32 ``[size]``).
      repeats: timed calls per contestant; medians are reported.

    Returns:
      A :class:`WhyReport`; ``str(report)`` is the table ``dropmask why`` prints.

    Raises:
      DropmaskValueError: ``size`` or ``repeats`` below 1.

    Example:
      >>> from dropmask import why
      >>> report = why.check_claims(timing=False)  # the facts, without the speed claims
      >>> report.verdicts()["where-is-select"]
      'holds'
    """
    if size < 1 or repeats < 1:
        raise user_error(
            DropmaskValueError,
            f"size and repeats must be >= 1, got size={size}, repeats={repeats}",
            "The defaults are size=2**20, repeats=15.",
            caller=None,
        )
    start = time.perf_counter()
    claims = fact_claims()
    if timing:
        claims += timing_claims(size, repeats)
    return WhyReport(
        jax.__version__,
        jax.default_backend(),
        jax.devices()[0].device_kind,
        f"{platform.machine()} {platform.processor()}".strip(),
        tuple(claims),
        round(time.perf_counter() - start, 2),
    )
