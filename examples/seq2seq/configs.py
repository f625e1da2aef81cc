"""Hyperparameters of the seq2seq example: the default and a seconds-long test config.

Every entry can be overridden on the command line, e.g.
``dropmask train seq2seq --config.hidden=128``.
"""

from __future__ import annotations

import ml_collections

from dropmask.training import base_config


def get_config() -> ml_collections.ConfigDict:
    """The default: 3-digit addition, an LSTM encoder-decoder of width 256.

    Entries besides :func:`dropmask.training.base_config`'s:
      max_digits: largest number of digits of an operand.
      data_seed: seeds the held-out problems, so that runs with different ``seed``
        are scored on the same problems.
      eval_size: held-out problems (never in a training batch), also the size of
        the sample of training problems scored as ``train_eval``.
      embed_dim, hidden: widths of the embedding and of both LSTMs.
      rate: dropout between layers.
      zoneout_cell, zoneout_hidden: zoneout of both LSTMs' cell state ``c`` and
        hidden state ``h``: the probability that a unit keeps its previous value at
        a training step (0: off).
      weight_dropout: dropout rate on both LSTMs' recurrent kernels, one mask per
        training step (0: off).
      learning_rate: Adam's peak step size (gradients clipped to global norm 1).
      warmup_steps: steps of linear warmup to ``learning_rate``; a cosine decay to 0
        at ``decay_steps`` follows.
      decay_steps: where the step size reaches 0; 0 means ``steps``. Set it when a
        run is to be resumed with a larger ``--steps``, so that the schedule of the
        steps already taken stays the same.
      batch_size: problems per step (a multiple of the devices used).
    """
    config = base_config()
    config.max_digits = 3
    config.data_seed = 0
    config.eval_size = 1000
    config.embed_dim = 32
    config.hidden = 256
    config.rate = 0.1
    config.zoneout_cell = 0.0
    config.zoneout_hidden = 0.0
    config.weight_dropout = 0.0
    config.learning_rate = 3e-3
    config.warmup_steps = 200
    config.decay_steps = 0
    config.batch_size = 128
    config.steps = 10000
    config.log_every = 100
    config.eval_every = 2000
    config.checkpoint_every = 2000
    config.keep_checkpoints = 2
    return config


def get_tiny_config() -> ml_collections.ConfigDict:
    """A seconds-long configuration for tests: 2-digit sums, narrow, few steps."""
    config = get_config()
    config.max_digits = 2
    config.eval_size = 64
    config.embed_dim = 8
    config.hidden = 16
    config.learning_rate = 3e-2
    config.warmup_steps = 0
    config.decay_steps = 24  # the resume test trains 12 steps, then resumes to 24
    config.batch_size = 16
    config.steps = 12
    config.log_every = 2
    config.eval_every = 4
    config.checkpoint_every = 4
    return config
