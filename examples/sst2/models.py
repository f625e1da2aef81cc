"""A sentence classifier: word dropout, embedding dropout, a bidirectional masked LSTM."""

from __future__ import annotations

import flax.linen as nn
import jax

import dropmask
from dropmask import linen as dl

from .input_pipeline import UNK


class TextClassifier(nn.Module):
    """Embeds tokens, runs a BiLSTM over the valid ones and pools them into 2 logits.

    ``WordDropout`` replaces whole tokens by ``<unk>`` (so the model cannot lean on
    any one word), ``Dropout`` acts on the embeddings and on the pooled features.
    Padding never reaches the result: ``MaskedRNN`` holds the carry through it, the
    backward LSTM reverses only the valid prefix, and the mean pools valid steps only.

    Attributes:
      vocab_size: number of token ids (``<pad>`` 0, ``<unk>`` 1).
      embed_dim, hidden: widths of the embedding and of each LSTM direction.
      rate: dropout on the embeddings and the pooled features.
      word_rate: probability of replacing a token by ``<unk>``.
    """

    vocab_size: int
    embed_dim: int = 64
    hidden: int = 64
    rate: float = 0.3
    word_rate: float = 0.1

    @nn.compact
    def __call__(self, tokens: jax.Array, length: jax.Array, training: bool) -> jax.Array:
        """Logits ``float32[b, 2]`` for ``tokens: int32[b, t]`` of ``length: int32[b]``."""
        tokens = dl.WordDropout(self.word_rate, unk_id=UNK, deterministic=not training)(tokens)
        x = nn.Embed(self.vocab_size, self.embed_dim)(tokens)
        x = dl.Dropout(self.rate, deterministic=not training)(x)
        bi = dl.Bidirectional(
            dl.MaskedRNN(nn.LSTMCell(self.hidden)), dl.MaskedRNN(nn.LSTMCell(self.hidden))
        )
        y = bi(x, lengths=length)
        valid = dropmask.sequence_mask(length, tokens.shape[1])
        pooled = dropmask.masked_mean(y, valid[..., None], axis=1)
        pooled = dl.Dropout(self.rate, deterministic=not training)(pooled)
        return nn.Dense(2)(pooled)
