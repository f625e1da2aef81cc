"""Finds the dropout bugs that do not stop the loss from going down.

``audit_model`` (Linen) and ``audit_nnx_model`` (NNX) list a model's dropout sites,
attention weights included, and check evaluation and training; ``audit_step`` runs a
plain, jitted or pmapped train step for a few steps and checks that masks change
between steps and differ between layers and between the iterations of a scanned
layer. Each returns an :class:`AuditReport` whose findings carry a stable code (see
:data:`CODES`), the site's module path and a fix phrased in the model's own mode
switch (a call keyword, a config field or NNX's ``train()`` / ``eval()``).
``audit_nnx_step`` does the same for a step over a
:class:`dropmask.training.NnxTrainState`. ``audit_nnx`` is a deprecated alias of
``audit_nnx_model`` (the same function).
"""

from ._audit_report import CODES as CODES
from ._audit_report import AuditReport as AuditReport
from ._audit_report import Finding as Finding
from ._audit_report import Site as Site
from ._linen import audit_model as audit_model
from ._linen import audit_step as audit_step
from ._nnx import audit_nnx as audit_nnx
from ._nnx import audit_nnx_model as audit_nnx_model
from ._nnx import audit_nnx_step as audit_nnx_step
from ._target import AuditTarget as AuditTarget
from ._target import audit_target as audit_target
from ._target import target_from_example as target_from_example

__all__ = [
    "CODES",
    "AuditReport",
    "AuditTarget",
    "Finding",
    "Site",
    "audit_model",
    "audit_nnx",
    "audit_nnx_model",
    "audit_nnx_step",
    "audit_step",
    "audit_target",
    "target_from_example",
]
