"""Hyperparameters of the sst2 example: the default and a seconds-long test config."""

from __future__ import annotations

import ml_collections

from dropmask.training import base_config


def get_config() -> ml_collections.ConfigDict:
    """The default: the generated corpus, a BiLSTM of width 64.

    Entries besides :func:`dropmask.training.base_config`'s:
      data_dir: a directory with GLUE SST-2's ``train.tsv`` and ``dev.tsv``; empty
        for the generated corpus.
      data_seed: seeds the generated corpus.
      train_size, dev_size: sentences in the generated splits.
      embed_dim, hidden: widths of the embedding and of each LSTM direction.
      rate: dropout on embeddings and pooled features.
      word_rate: probability of replacing a token by ``<unk>`` in training.
      r_drop: R-Drop's alpha, the weight of the symmetric KL between two dropout
        passes (0: one pass, no R-Drop).
      learning_rate: Adam's step size.
      batch_size: sentences per step (a multiple of the devices used).
    """
    config = base_config()
    config.data_dir = ""
    config.data_seed = 0
    config.train_size = 2000
    config.dev_size = 1000
    config.embed_dim = 64
    config.hidden = 64
    config.rate = 0.3
    config.word_rate = 0.1
    config.r_drop = 0.0
    config.learning_rate = 3e-3
    config.batch_size = 64
    config.steps = 1500
    config.log_every = 50
    config.eval_every = 250
    config.checkpoint_every = 500
    config.keep_checkpoints = 2
    return config


def get_tiny_config() -> ml_collections.ConfigDict:
    """A seconds-long configuration for tests."""
    config = get_config()
    config.train_size = 192
    config.dev_size = 64
    config.embed_dim = 8
    config.hidden = 8
    config.learning_rate = 3e-2
    config.batch_size = 16
    config.steps = 12
    config.log_every = 2
    config.eval_every = 4
    config.checkpoint_every = 4
    return config
