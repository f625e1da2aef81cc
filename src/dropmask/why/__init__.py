"""``dropmask why``: why dropout ends in ``lax.select``, measured on this machine.

Flax's dropout ends in ``lax.select(mask, x / keep_prob, zeros_like(x))``. Common
explanations of that choice, set against ``jnp.where(mask, x / keep_prob, 0)`` and
``mask * x / keep_prob``, make claims about dtype promotion, numerical stability,
autodiff cost and speed. :func:`check_claims` measures each claim with the installed
JAX on the default backend and returns a verdict with the number behind it.
"""

from ._check import WhyReport as WhyReport
from ._check import check_claims as check_claims
from ._claims import DEPENDS as DEPENDS
from ._claims import HOLDS as HOLDS
from ._claims import NOT as NOT
from ._claims import Claim as Claim
from ._measure import forms as forms

__all__ = ["DEPENDS", "HOLDS", "NOT", "Claim", "WhyReport", "check_claims", "forms"]
