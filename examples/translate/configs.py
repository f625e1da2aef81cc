"""Hyperparameters of the translate example: the default and a seconds-long test config.

Every entry can be overridden on the command line, e.g.
``dropmask train translate --config.num_layers=2``.
"""

from __future__ import annotations

import ml_collections

from dropmask.training import base_config


def get_config() -> ml_collections.ConfigDict:
    """The default: the generated English -> German corpus, a 3+3-layer Transformer.

    Entries besides :func:`dropmask.training.base_config`'s:
      src, tgt: aligned parallel text files (one sentence a line); empty: the
        generated corpus.
      data_seed: seeds the corpus, the held-out choice and the ``train_eval`` sample,
        so that runs with different ``seed`` see the same data.
      train_size: generated training pairs (unused with ``src``/``tgt``).
      eval_size: held-out pairs, whose source sentences never occur in training.
      vocab_size: upper bound on the SentencePiece vocabulary (a small corpus may
        yield fewer pieces).
      max_len: tokens per packed training row; also the longest decoded output.
      batch_size: packed rows per step (a multiple of the devices used).
      emb_dim, num_heads, num_layers, qkv_dim, mlp_dim: the Transformer's shape.
      rate: dropout after embeddings, sublayers and both MLP Dense layers, and on
        attention weights.
      layer_drop: LayerDrop's rate for every encoder and decoder layer (0: none).
      pruned_encoder, pruned_decoder: indices of layers removed at inference, e.g.
        ``dropmask.kept_layers``' complement; ``prune.py`` evaluates a run this way.
      attention_algorithm: ``dropmask.dot_product_attention``'s ``algorithm`` for
        attention over whole rows: ``"auto"`` (the dense path at these lengths),
        ``"dense"`` (the function through ``[q, k]`` weights) or ``"blockwise"`` (the
        same function in tiles, memory linear in ``max_len``; the variant
        ``--config.attention_algorithm=blockwise``).
      learning_rate: Adam's peak step size (gradients clipped to global norm 1).
      warmup_steps: steps of linear warmup; a cosine decay to 0 at ``decay_steps``
        follows.
      decay_steps: where the step size reaches 0; 0 means ``steps``.
      beam_size: hypotheses of the beam search that evaluation scores; 1 decodes
        greedily.
      beam_alpha: length-normalisation exponent of the beam search.
      eval_batch_size: sentences decoded at once in evaluation.
    """
    config = base_config()
    config.src = ""
    config.tgt = ""
    config.data_seed = 0
    config.train_size = 2000
    config.eval_size = 1000
    config.vocab_size = 600
    config.max_len = 64
    config.batch_size = 64
    config.emb_dim = 128
    config.num_heads = 4
    config.num_layers = 3
    config.qkv_dim = 128
    config.mlp_dim = 512
    config.rate = 0.1
    config.layer_drop = 0.0
    config.pruned_encoder = ()
    config.pruned_decoder = ()
    # At 64 tokens "auto" takes the dense path, and a blockwise step is one 64 x 64
    # tile: train steps cost the same within the machine's noise (README).
    config.attention_algorithm = "auto"
    config.learning_rate = 2e-3
    config.warmup_steps = 500
    config.decay_steps = 0
    config.beam_size = 4
    config.beam_alpha = 0.6
    config.eval_batch_size = 250
    # 1000 steps (100 epochs of the 2000 pairs), about 0.5 s each on 2 CPU cores, and
    # one evaluation at the end keep the run within its 15-minute budget with room
    # to spare (README). Checkpoints every 500 steps are for resuming; evaluating
    # them too (beam search over 2000 sentences) would add an evaluation each.
    config.steps = 1000
    config.log_every = 50
    config.eval_every = 1000
    config.checkpoint_every = 500
    config.evaluate_at_checkpoints = False
    config.keep_checkpoints = 2
    return config


def get_tiny_config() -> ml_collections.ConfigDict:
    """A seconds-long configuration for tests: a few hundred pairs, a one-layer model."""
    config = get_config()
    config.train_size = 300
    config.eval_size = 8
    config.vocab_size = 200
    config.max_len = 96
    config.batch_size = 4
    config.emb_dim = 16
    config.num_heads = 2
    config.num_layers = 1
    config.qkv_dim = 16
    config.mlp_dim = 32
    config.learning_rate = 3e-2
    config.warmup_steps = 0
    config.decay_steps = 24  # the resume test trains 12 steps, then resumes to 24
    config.beam_size = 2
    config.eval_batch_size = 8
    config.steps = 12
    config.log_every = 2
    config.eval_every = 6
    config.checkpoint_every = 6
    return config
