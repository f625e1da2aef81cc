"""A Transformer encoder-decoder in Linen, masked and regularised with dropmask.

One frozen :class:`TransformerConfig` describes the model; training uses it as is
(``deterministic=False``), evaluation ``config.replace(deterministic=True)`` and
decoding ``config.replace(deterministic=True, decode=True)``, where each decoder
self-attention keeps a key/value cache and reads one token per call.

Attention runs on :func:`dropmask.dot_product_attention` by the algorithm the
``attention_algorithm`` field names (``"auto"``, ``"dense"`` or ``"blockwise"``: the
same function, the same dropped weights). Its masks are
structure, not arrays: segment ids keep the pairs packed into one row apart (padding
has segment 0 and attends to nothing) and the decoder's self-attention is causal;
both reach the attention function through ``functools.partial``, so no ``[q, k]``
mask is built. Decoding reads one token per call against Flax's key/value cache,
whose slots Flax masks with an array, on the dense path. Dropout comes in three
places: after the embeddings and each sublayer, after both Dense layers of
:class:`MlpBlock`, and on attention weights, one mask per batch row and head
(``broadcast_dropout=False``).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import dropmask
import dropmask.linen as dl


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of :class:`Transformer`; hashable, so it can be a static argument.

    Attributes:
      vocab_size: shared source/target vocabulary (embeddings tied with the output).
      emb_dim: model width.
      num_heads: attention heads; ``qkv_dim`` must be a multiple.
      num_layers: encoder layers, and as many decoder layers.
      qkv_dim: width of queries, keys and values over all heads.
      mlp_dim: hidden width of :class:`MlpBlock`.
      max_len: longest sequence; also the size of the decoding cache.
      dropout_rate: dropout after embeddings, sublayers and MLP Dense layers.
      attention_dropout_rate: dropout on attention weights.
      deterministic: no dropout (evaluation and decoding).
      decode: one target token per call, with a key/value cache.
      attention_algorithm: ``dot_product_attention``'s ``algorithm`` for attention
        over whole rows (``"blockwise"``, ``"dense"`` or ``"auto"``).
      attention_block: the blockwise path's tile size (``block_q`` and ``block_k``);
        None: the library's default.
      layer_drop: LayerDrop's rate: in training each encoder and decoder layer is
        skipped, for the whole batch, with this probability.
      pruned_encoder, pruned_decoder: indices of the layers removed at inference
        (they return their input; see ``dropmask.kept_layers``).
    """

    vocab_size: int
    emb_dim: int = 128
    num_heads: int = 4
    num_layers: int = 3
    qkv_dim: int = 128
    mlp_dim: int = 512
    max_len: int = 64
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    deterministic: bool = False
    decode: bool = False
    attention_algorithm: str = "auto"
    attention_block: int | None = None
    layer_drop: float = 0.0
    pruned_encoder: tuple[int, ...] = ()
    pruned_decoder: tuple[int, ...] = ()

    def replace(self, **changes: object) -> TransformerConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def sinusoid(positions: jax.Array, dim: int) -> jax.Array:
    """Fixed position encodings ``float32[..., dim]`` of integer ``positions``.

    Fixed rather than learned, so that every parameter is trained by every batch and
    positions restart per packed segment at no cost.
    """
    half = dim // 2
    scale = np.log(10000.0) / max(half - 1, 1)
    freqs = jnp.exp(-scale * jnp.arange(half, dtype=jnp.float32))
    angles = positions[..., None].astype(jnp.float32) * freqs.reshape(
        (1,) * positions.ndim + (half,)
    )
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class MlpBlock(nn.Module):
    """Dense -> ReLU -> dropout -> Dense -> dropout: ``[..., emb_dim] -> [..., emb_dim]``."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        y = nn.relu(nn.Dense(c.mlp_dim)(x))
        y = dl.Dropout(c.dropout_rate, deterministic=c.deterministic)(y)
        y = nn.Dense(x.shape[-1])(y)
        return dl.Dropout(c.dropout_rate, deterministic=c.deterministic)(y)


def _attention(
    config: TransformerConfig, decode: bool = False, **structure: object
) -> nn.MultiHeadDotProductAttention:
    """Flax's attention module on dropmask's function; ``structure``: its ``is_causal``
    and segment-id arguments, bound with the algorithm (none while decoding)."""
    attention_fn = dropmask.dot_product_attention
    if structure:
        block = config.attention_block
        attention_fn = functools.partial(
            attention_fn,
            algorithm=config.attention_algorithm,
            block_q=block,
            block_k=block,
            **structure,
        )
    return nn.MultiHeadDotProductAttention(
        num_heads=config.num_heads,
        qkv_features=config.qkv_dim,
        dropout_rate=config.attention_dropout_rate,
        broadcast_dropout=False,
        deterministic=config.deterministic,
        decode=decode,
        attention_fn=attention_fn,
    )


class EncoderLayer(nn.Module):
    """Pre-norm self-attention within each packed segment, and MLP, each added back
    after dropout."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, segments: jax.Array) -> jax.Array:
        c = self.config
        drop = functools.partial(dl.Dropout, c.dropout_rate, deterministic=c.deterministic)
        attend = _attention(c, q_segment_ids=segments, kv_segment_ids=segments)
        x = x + drop()(attend(nn.LayerNorm()(x)))
        return x + MlpBlock(c)(nn.LayerNorm()(x))


class DecoderLayer(nn.Module):
    """Causal self-attention (cached when decoding), cross-attention, MLP."""

    config: TransformerConfig

    @nn.compact
    def __call__(
        self,
        y: jax.Array,
        encoded: jax.Array,
        target_segments: jax.Array,
        input_segments: jax.Array,
    ) -> jax.Array:
        c = self.config
        drop = functools.partial(dl.Dropout, c.dropout_rate, deterministic=c.deterministic)
        if c.decode:
            # One query against the cache, whose unwritten slots Flax masks itself.
            self_attend = _attention(c, decode=True)
        else:
            self_attend = _attention(
                c, is_causal=True, q_segment_ids=target_segments, kv_segment_ids=target_segments
            )
        y = y + drop()(self_attend(nn.LayerNorm()(y)))
        cross = _attention(c, q_segment_ids=target_segments, kv_segment_ids=input_segments)
        y = y + drop()(cross(nn.LayerNorm()(y), encoded))
        return y + MlpBlock(c)(nn.LayerNorm()(y))


class Transformer(nn.Module):
    """Encoder-decoder over packed or padded rows.

    Segment ids are ``int32[batch, len]`` (1, 2, ... per packed pair, 0 on padding);
    positions ``int32[batch, len]`` restart at 0 in each segment.
    """

    config: TransformerConfig

    def setup(self) -> None:
        c = self.config
        self.embed = nn.Embed(c.vocab_size, c.emb_dim, embedding_init=nn.initializers.normal(1.0))

        def layer_drop(layer: nn.Module, pruned: bool) -> dl.LayerDrop:
            return dl.LayerDrop(layer, c.layer_drop, deterministic=c.deterministic, pruned=pruned)

        self.encoder_layers = [
            layer_drop(EncoderLayer(c), i in c.pruned_encoder) for i in range(c.num_layers)
        ]
        self.decoder_layers = [
            layer_drop(DecoderLayer(c), i in c.pruned_decoder) for i in range(c.num_layers)
        ]
        self.encoder_norm = nn.LayerNorm()
        self.decoder_norm = nn.LayerNorm()
        self.embed_dropout = dl.Dropout(c.dropout_rate, deterministic=c.deterministic)

    def _embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        x = self.embed(tokens) + sinusoid(positions, self.config.emb_dim)
        return self.embed_dropout(x)

    def encode(
        self, inputs: jax.Array, inputs_position: jax.Array, inputs_segmentation: jax.Array
    ) -> jax.Array:
        """``int32[batch, src_len]`` tokens -> ``float32[batch, src_len, emb_dim]``."""
        x = self._embed(inputs, inputs_position)
        for layer in self.encoder_layers:
            x = layer(x, inputs_segmentation)
        return self.encoder_norm(x)

    def decode(
        self,
        encoded: jax.Array,
        inputs_segmentation: jax.Array,
        targets_in: jax.Array,
        targets_position: jax.Array,
        targets_segmentation: jax.Array,
    ) -> jax.Array:
        """Logits ``float32[batch, tgt_len, vocab]`` of the next token at each position.

        With ``config.decode``, ``targets_in`` is one token ``[batch, 1]`` at
        ``targets_position``, its segment ids 1, and self-attention reads the cache.
        """
        y = self._embed(targets_in, targets_position)
        for layer in self.decoder_layers:
            y = layer(y, encoded, targets_segmentation, inputs_segmentation)
        y = self.decoder_norm(y)
        return self.embed.attend(y) / jnp.sqrt(jnp.float32(self.config.emb_dim))

    def __call__(
        self,
        inputs: jax.Array,
        targets_in: jax.Array,
        inputs_segmentation: jax.Array,
        targets_segmentation: jax.Array,
        inputs_position: jax.Array,
        targets_position: jax.Array,
    ) -> jax.Array:
        """Teacher-forced logits ``float32[batch, tgt_len, vocab]``."""
        encoded = self.encode(inputs, inputs_position, inputs_segmentation)
        return self.decode(
            encoded, inputs_segmentation, targets_in, targets_position, targets_segmentation
        )
