"""Hyperparameters of the lm example: the default run, two named configs, a test config.

``dropmask train lm`` trains :func:`get_config`; ``--config long`` starts from
:func:`get_long_config` and ``--config small_data`` from :func:`get_small_data_config`.
Every entry can be overridden on the command line on top, e.g. ``dropmask train lm
--config long --config.depth=2 --config.context=2048``.
"""

from __future__ import annotations

import ml_collections

from dropmask.training import base_config


def get_config() -> ml_collections.ConfigDict:
    """The default run: a byte-level Transformer that learns the text in minutes on 2 CPU cores.

    Context 128, batch 32 (4,096 bytes a step), width 128, 4 blocks, 1,500 steps: about
    15 passes over the training text, which held-out bits per character still reward
    (see the README for the run, its time and the choices tried).

    Entries besides :func:`dropmask.training.base_config`'s:
      eval_fraction: the share of ``pydoc_data.topics``' characters held out, as
        whole topics taken in the order of the CRC-32 of their names.
      context: tokens (bytes) per training window; the model sees at most this many.
      batch_size: windows per step (a multiple of the devices used).
      width: the model width; ``heads`` attention heads of ``width // heads``.
      depth: Transformer blocks.
      mlp_ratio: the MLP's hidden width over ``width``.
      rate: dropout on the embeddings, on each residual branch and on the attention
        weights (the one knob ``--rate`` and ``--compare-rates`` set).
      attention: ``'dropmask'`` (``dropmask.dot_product_attention``) or ``'flax'``
        (``flax.nnx.dot_product_attention``), the same model otherwise.
      attention_algorithm: dropmask's ``algorithm`` (``'auto'``, ``'dense'``,
        ``'blockwise'``); ``attention_block`` its tile size (0: its default). At
        context 128 the dense path; the long config takes the blockwise one.
      token_drop: random layerwise token dropping (Random-LTD): in training, the
        blocks between the first and last ``token_drop_ends`` each see a random
        ``1 - token_drop`` of each window's tokens, drawn afresh per block and step;
        the other tokens skip that block. In ``[0, 1)``; 0 (the default) is off and
        builds the model without it. Evaluation and sampling see every token.
      token_drop_ends: blocks at each end of the stack that always see every token
        (Random-LTD's choice is 1: the first and the last); ``depth`` must leave at
        least one block between them when ``token_drop > 0``.
      learning_rate: AdamW's peak step size, after ``warmup_steps`` of linear warmup
        from a tenth of it, then a cosine decay to a tenth of it at ``steps``.
      weight_decay: AdamW's decoupled weight decay.
      eval_windows: held-out windows evaluated (0: all of them).
    """
    config = base_config()
    config.eval_fraction = 0.1
    config.context = 128
    config.batch_size = 32
    config.width = 128
    config.heads = 4
    config.depth = 4
    config.mlp_ratio = 4
    config.rate = 0.1
    config.attention = "dropmask"
    config.attention_algorithm = "dense"
    config.attention_block = 0
    config.token_drop = 0.0
    config.token_drop_ends = 1
    config.learning_rate = 5e-3
    config.warmup_steps = 50
    config.weight_decay = 0.01
    config.eval_windows = 0
    config.steps = 1500
    config.log_every = 50
    config.eval_every = 500
    config.checkpoint_every = 500
    config.keep_checkpoints = 2
    return config


def get_long_config() -> ml_collections.ConfigDict:
    """Context 1024 on the blockwise attention path, which never holds ``[q, k]``.

    Batch 8 (8,192 bytes a step), 3 blocks, 300 steps; attention weights dropped per
    tile from the key. At context 1024 the blockwise path's step took 2.6 s against
    the dense path's 5.7 s (2 busy CPU cores). The README's memory table compiles this
    model at 4096 tokens.
    """
    config = get_config()
    config.context = 1024
    config.batch_size = 8
    config.depth = 3
    config.attention_algorithm = "blockwise"
    config.learning_rate = 3e-3
    config.warmup_steps = 20
    config.steps = 300
    config.log_every = 10
    config.eval_every = 100
    config.checkpoint_every = 100
    return config


def get_small_data_config() -> ml_collections.ConfigDict:
    """Where dropout matters: a tenth of the text to train on, for long enough to overfit it.

    ``eval_fraction = 0.9`` holds out whole topics until they hold 90% of the
    characters, so the model trains on the other 15 topics (42,621 bytes on Python
    3.11) for 1,200 steps of 16 windows of 128 bytes, about 58 passes;
    ``eval_windows = 200`` scores the first 200 held-out windows (25,600 bytes) and as
    many training windows, every 100 steps, for the curves.
    """
    config = get_config()
    config.eval_fraction = 0.9
    config.eval_windows = 200
    config.batch_size = 16
    config.steps = 1200
    config.log_every = 20
    config.eval_every = 100
    config.checkpoint_every = 600
    return config


def get_tiny_config() -> ml_collections.ConfigDict:
    """A seconds-long configuration for tests and ``dropmask audit``."""
    config = get_config()
    config.context = 64
    config.batch_size = 8
    config.width = 32
    config.heads = 2
    config.depth = 2
    config.learning_rate = 1e-2
    config.warmup_steps = 2
    config.eval_windows = 8
    config.steps = 8
    config.log_every = 1
    config.eval_every = 4
    config.checkpoint_every = 4
    return config


CONFIGS = {"long": get_long_config, "small_data": get_small_data_config}
