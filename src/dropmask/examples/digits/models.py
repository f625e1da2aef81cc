"""The demo's models: an MLP with dropmask's drop-in ``Dropout``, and a small conv net with
``Dropout`` or ``DropBlock`` on its feature maps."""

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


class ConvNet(nn.Module):
    """3x3 convolutions on the 8x8 images, each followed by dropout or DropBlock, and a
    linear classifier on the flattened maps.

    Attributes:
      channels: output channels of each convolution.
      num_classes: number of output logits.
      rate: the rate of the dropout (or DropBlock) after each convolution.
      block_size: 0 for ordinary dropout of single units; else DropBlock with blocks
        of ``block_size x block_size`` (shared by all channels), at the same ``rate``
        (the expected fraction of units dropped).
    """

    channels: Sequence[int] = (32, 32)
    num_classes: int = 10
    rate: float = 0.1
    block_size: int = 0

    @nn.compact
    def __call__(self, x: jax.Array, training: bool, rate: jax.Array | None = None) -> jax.Array:
        """Maps ``x: float32[batch, 64]`` to logits; ``training`` and ``rate`` as in MLP."""
        hidden_rate = self.rate if rate is None else rate
        h = x.reshape(x.shape[0], 8, 8, 1)
        for width in self.channels:
            h = nn.relu(nn.Conv(width, (3, 3))(h))
            if self.block_size:
                h = dl.DropBlock(
                    hidden_rate, block_size=self.block_size, deterministic=not training
                )(h)
            else:
                h = dl.Dropout(rate=hidden_rate, deterministic=not training)(h)
        return nn.Dense(self.num_classes)(h.reshape(h.shape[0], -1))
