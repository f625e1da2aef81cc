"""A user's NNX model: one hidden layer with dropmask's drop-in NNX dropout."""

from __future__ import annotations

import jax
from flax import nnx

from dropmask import nnx as dnnx


class Classifier(nnx.Module):
    """Linear-ReLU-Dropout, then logits ``float32[batch, classes]``."""

    def __init__(self, features: int, hidden: int, classes: int, rate: float, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(features, hidden, rngs=rngs)
        self.dropout = dnnx.Dropout(rate, rngs=rngs)
        self.out = nnx.Linear(hidden, classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.dropout(nnx.relu(self.hidden(x))))
