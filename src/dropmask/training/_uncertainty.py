"""Evaluation with Monte Carlo dropout beside the deterministic one (``config.mc_samples``).

With ``mc_samples = K > 0`` and an example that has a ``predict`` hook, every
evaluation of the ``'eval'`` split adds, for the deterministic prediction, ``nll`` and
``ece`` (expected calibration error, 15 equal-width bins) and, for the mean of ``K``
predictions with dropout on, ``mc_accuracy``, ``mc_nll`` and ``mc_ece``. The samples
at step ``s`` use ``stream_key(jax.random.key(config.seed), s, 'mc')``, so re-running an
evaluation (a resumed run) reproduces it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
import ml_collections

from .. import uncertainty
from .._checks import check_int_at_least
from .._errors import DropmaskValueError, user_error
from ._keys import stream_key

if TYPE_CHECKING:
    from .._workflow import Example

__all__ = ["SPLIT", "check", "metrics"]

# The split evaluated with samples: the held-out data, where calibration matters.
SPLIT = "eval"


def num_samples(config: ml_collections.ConfigDict) -> int:
    """``config.mc_samples`` (0 when the entry is absent).

    Raises:
      DropmaskValueError: not an int ``>= 0``.
    """
    return check_int_at_least(
        config.get("mc_samples", 0),
        0,
        caller="train",
        name="config.mc_samples",
        why=" (0: no Monte Carlo evaluation)",
        fix=" Set it with --mc-samples K.",
    )


def check(example: Example, config: ml_collections.ConfigDict) -> None:
    """Refuses ``mc_samples > 0`` for an example without a ``predict`` hook, before any work.

    Raises:
      DropmaskValueError: a bad ``mc_samples``, or no hook to sample with.
    """
    if num_samples(config) and example.predict is None:
        raise user_error(
            DropmaskValueError,
            f"example {example.name!r} has no predict hook, so it cannot be evaluated with Monte "
            "Carlo dropout",
            "Drop --mc-samples, or give its Example a predict=(state, config, data, split, key, "
            "num_samples) -> (logits, labels).",
            caller=None,
        )


def _scores(log_p: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    return {
        "accuracy": jnp.mean(jnp.argmax(log_p, axis=-1) == labels),
        "nll": uncertainty.nll(log_p, labels),
        "ece": uncertainty.expected_calibration_error(log_p, labels),
    }


_scores_jit = jax.jit(_scores)


def metrics(
    example: Example,
    state: Any,
    config: ml_collections.ConfigDict,
    data: Any,
    split: str,
    step: int,
) -> dict[str, float]:
    """The calibration metrics of ``split`` at ``step``; empty when none are asked for."""
    k = num_samples(config)
    if not k or example.predict is None or split != SPLIT:
        return {}
    logits, labels = example.predict(state, config, data, split, None, 0)
    deterministic = _scores_jit(jnp.asarray(logits), jnp.asarray(labels))
    # config.seed was checked by the loop's Schedule before training.
    key = stream_key(jax.random.key(cast(int, config.seed)), step, "mc")
    samples, labels = example.predict(state, config, data, split, key, k)
    sampled = _scores_jit(uncertainty.predictive_log_probs(samples), jnp.asarray(labels))
    out = {"nll": deterministic["nll"], "ece": deterministic["ece"]}
    out.update({f"mc_{name}": value for name, value in sampled.items()})
    return {name: float(value) for name, value in out.items()}
