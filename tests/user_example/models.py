"""A user's model: one hidden layer with dropmask's drop-in dropout."""

from __future__ import annotations

import flax.linen as nn
import jax

from dropmask import linen as dl


class Classifier(nn.Module):
    """Dense-ReLU-Dropout, then logits ``float32[batch, classes]``."""

    hidden: int = 16
    classes: int = 3
    rate: float = 0.1

    @nn.compact
    def __call__(self, x: jax.Array, training: bool) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden)(x))
        x = dl.Dropout(rate=self.rate, deterministic=not training)(x)
        return nn.Dense(self.classes)(x)
