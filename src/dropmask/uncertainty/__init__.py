"""Monte Carlo dropout: sample predictions with dropout on, and score their uncertainty.

``sample`` (a plain ``f(x, key)``), ``sample_linen`` and ``sample_nnx`` draw K
predictions, sample ``i`` with ``jax.random.fold_in(key, i)``, in chunks of
``chunk_size``. The summaries (predictive mean, variance, entropy, expected entropy,
mutual information) read K samples of logits ``[K, ..., classes]``; the scores (NLL,
Brier score, expected calibration error, reliability diagram) read one distribution
per example ``[..., classes]``, with a mask for padding. See ``docs/uncertainty.md``.
"""

from ._calibration import Reliability as Reliability
from ._calibration import brier_score as brier_score
from ._calibration import expected_calibration_error as expected_calibration_error
from ._calibration import nll as nll
from ._calibration import reliability as reliability
from ._calibration import reliability_diagram as reliability_diagram
from ._sample import sample as sample
from ._sample import sample_keys as sample_keys
from ._sample import sample_linen as sample_linen
from ._sample import sample_nnx as sample_nnx
from ._summaries import expected_entropy as expected_entropy
from ._summaries import mutual_information as mutual_information
from ._summaries import predictive_entropy as predictive_entropy
from ._summaries import predictive_log_probs as predictive_log_probs
from ._summaries import predictive_mean as predictive_mean
from ._summaries import predictive_variance as predictive_variance
from ._summaries import regression_moments as regression_moments

__all__ = [
    "Reliability",
    "brier_score",
    "expected_calibration_error",
    "expected_entropy",
    "mutual_information",
    "nll",
    "predictive_entropy",
    "predictive_log_probs",
    "predictive_mean",
    "predictive_variance",
    "regression_moments",
    "reliability",
    "reliability_diagram",
    "sample",
    "sample_keys",
    "sample_linen",
    "sample_nnx",
]
