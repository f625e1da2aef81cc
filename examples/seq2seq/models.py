"""An LSTM encoder-decoder for addition, on ``dropmask.linen.MaskedRNN``."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dropmask import linen as dl

from .input_pipeline import GO


class Seq2seq(nn.Module):
    """Reads ``"a+b"`` with an LSTM and writes ``a + b`` with another, digit by digit.

    The encoder runs over the right-padded query with ``MaskedRNN``, so its final
    carry is each query's own, whatever its length; that carry starts the decoder.
    Training feeds the decoder the true previous token (teacher forcing); decoding
    feeds it its own prediction, greedy or sampled from the ``'lstm'`` stream.
    Dropout (``'dropout'`` stream) acts between layers: on the embedded characters
    and on the decoder's outputs before the projection to the vocabulary. Inside both
    LSTMs, optionally, the recurrent regularizers of ``MaskedRNN``: zoneout of the
    carry and weight dropout on the recurrent kernels.

    Attributes:
      vocab_size: number of token ids.
      embed_dim: width of the character embedding.
      hidden: width of both LSTMs.
      rate: dropout rate between layers.
      zoneout: ``(cell_rate, hidden_rate)``, zoneout of both LSTMs' ``(c, h)`` carry.
      weight_dropout: dropout rate on both LSTMs' recurrent kernels.
    """

    vocab_size: int
    embed_dim: int = 32
    hidden: int = 256
    rate: float = 0.1
    zoneout: tuple[float, float] = (0.0, 0.0)
    weight_dropout: float = 0.0

    def setup(self) -> None:
        self.embed = nn.Embed(self.vocab_size, self.embed_dim)
        recurrent = {"zoneout": self.zoneout, "weight_dropout": self.weight_dropout}
        self.encoder = dl.MaskedRNN(nn.LSTMCell(self.hidden), return_carry=True, **recurrent)
        self.decoder_cell = nn.LSTMCell(self.hidden)
        # The teacher-forced pass and step-by-step decoding share this one decoder.
        self.decoder = dl.MaskedRNN(self.decoder_cell, **recurrent)
        self.dropout = dl.Dropout(self.rate)
        self.project = nn.Dense(self.vocab_size)

    def encode(self, query: jax.Array, query_length: jax.Array, training: bool) -> tuple:
        """The encoder's final carry for ``query: int32[b, q]`` of ``query_length: [b]``."""
        x = self.dropout(self.embed(query), deterministic=not training)
        carry, _ = self.encoder(x, lengths=query_length, deterministic=not training)
        return carry

    def __call__(
        self,
        query: jax.Array,
        query_length: jax.Array,
        answer: jax.Array,
        answer_length: jax.Array,
        training: bool,
    ) -> jax.Array:
        """Teacher-forced logits ``float32[b, a, vocab]`` for ``answer: int32[b, a]``.

        Position ``t`` predicts ``answer[:, t]`` from ``<go>, answer[:, :t]``.
        """
        carry = self.encode(query, query_length, training)
        previous = jnp.concatenate([jnp.full_like(answer[:, :1], GO), answer[:, :-1]], axis=1)
        x = self.dropout(self.embed(previous), deterministic=not training)
        y = self.decoder(x, lengths=answer_length, initial_carry=carry, deterministic=not training)
        return self.project(self.dropout(y, deterministic=not training))

    def generate(
        self, query: jax.Array, query_length: jax.Array, steps: int, sample: bool = False
    ) -> jax.Array:
        """``steps`` tokens ``int32[b, steps]`` decoded without dropout.

        ``sample=False`` takes the most likely token at each step; ``sample=True``
        draws it from the predicted distribution with keys of the ``'lstm'`` stream.
        """
        carry = self.encode(query, query_length, training=False)
        token = jnp.full(query.shape[:1], GO, jnp.int32)
        tokens = []
        for _ in range(steps):  # a few steps: unrolled
            # One step of the decoder, so that zoneout's evaluation rule applies here too.
            carry, y = self.decoder(
                self.embed(token)[:, None],
                initial_carry=carry,
                return_carry=True,
                deterministic=True,
            )
            logits = self.project(y[:, 0])
            if sample:
                token = jax.random.categorical(self.make_rng("lstm"), logits).astype(jnp.int32)
            else:
                token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            tokens.append(token)
        return jnp.stack(tokens, axis=1)
