"""Reading a traced program: its equations, those of nested jaxprs included."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax


def equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``) and of the jaxprs
    its equations hold (``cond`` branches, ``scan`` and ``shard_map`` bodies, ...)."""
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from equations(sub)
