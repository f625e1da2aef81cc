"""The demo's model: an MLP with dropmask's drop-in ``Dropout``."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax

from dropmask import linen as dl


class MLP(nn.Module):
    """Dense-ReLU-Dropout blocks and a linear classifier, as in the Flax dropout guide.

    Attributes:
      hidden: widths of the hidden layers.
      num_classes: number of output logits.
      rate: dropout rate after each hidden layer; 0 gives the plain MLP.
      input_rate: dropout rate on the inputs (Srivastava et al. use ~0.2).
    """

    hidden: Sequence[int] = (512, 512)
    num_classes: int = 10
    rate: float = 0.5
    input_rate: float = 0.2

    @nn.compact
    def __call__(self, x: jax.Array, training: bool, rate: jax.Array | None = None) -> jax.Array:
        """Maps ``x: float32[batch, features]`` to logits ``float32[batch, num_classes]``.

        ``training=True`` turns dropout on (and needs a ``'dropout'`` key in
        ``rngs``); ``training=False`` is deterministic and needs no key. ``rate``: the
        hidden layers' rate for this call (a run-time value, e.g. from a schedule), in
        place of ``self.rate``.
        """
        hidden_rate = self.rate if rate is None else rate
        x = dl.Dropout(rate=self.input_rate, deterministic=not training)(x)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
            x = dl.Dropout(rate=hidden_rate, deterministic=not training)(x)
        return nn.Dense(self.num_classes)(x)
