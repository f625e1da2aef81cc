"""The NNX twin of the digits MLP, with dropmask's drop-in ``nnx.Dropout``."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx

from dropmask import nnx as dnnx


class MLP(nnx.Module):
    """Linear-ReLU-Dropout blocks and a linear classifier, as ``digits.models.MLP``.

    The mode is NNX's: ``model.train()`` turns dropout on, ``model.eval()`` off. The
    dropout layers hold their own fork of ``rngs``' ``'dropout'`` stream;
    ``dropmask.training.NnxTrainState`` re-keys those streams every step.

    Args:
      features: input width.
      hidden: widths of the hidden layers.
      num_classes: number of output logits.
      rate: dropout rate after each hidden layer.
      input_rate: dropout rate on the inputs.
      rngs: ``nnx.Rngs`` with ``'params'`` and ``'dropout'`` streams.
    """

    def __init__(
        self,
        features: int,
        hidden: Sequence[int],
        num_classes: int,
        rate: float,
        input_rate: float,
        *,
        rngs: nnx.Rngs,
    ):
        widths = [features, *hidden]
        self.input_dropout = dnnx.Dropout(input_rate, rngs=rngs)
        self.hidden = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths, widths[1:], strict=False)]
        )
        self.dropout = nnx.List([dnnx.Dropout(rate, rngs=rngs) for _ in hidden])
        self.out = nnx.Linear(widths[-1], num_classes, rngs=rngs)

    def __call__(self, x: jax.Array, rate: jax.Array | None = None) -> jax.Array:
        """Maps ``x: float32[batch, features]`` to logits ``float32[batch, num_classes]``.

        ``rate``: the hidden layers' rate for this call (a run-time value, e.g. from a
        schedule), in place of the one they were built with.
        """
        x = self.input_dropout(x)
        for linear, dropout in zip(self.hidden, self.dropout, strict=True):
            x = dropout(nnx.relu(linear(x))) if rate is None else _at_rate(dropout, linear(x), rate)
        return self.out(x)


def _at_rate(dropout: dnnx.Dropout, x: jax.Array, rate: jax.Array) -> jax.Array:
    """``dropout(relu(x))`` at ``rate`` for this call only (the layer keeps its own)."""
    built = dropout.rate
    dropout.rate = rate
    try:
        return dropout(nnx.relu(x))
    finally:
        dropout.rate = built
