"""Hyperparameters of the digits example: the default and a seconds-long test config.

As in Flax's examples, a config is an ``ml_collections.ConfigDict``; every entry can
be overridden on the command line, e.g. ``dropmask train digits --config.hidden=(64,)``.
"""

from __future__ import annotations

import ml_collections

from dropmask.training import base_config


def get_config() -> ml_collections.ConfigDict:
    """The demo's configuration: a wide MLP on few, partly mislabelled training images.

    With 200 training images (a fifth of their labels redrawn at random; the test
    labels stay clean) and far more capacity than they need, the run without dropout
    memorises the wrong labels, and the effect of the dropout rate on the held-out
    accuracy shows.

    Entries besides :func:`dropmask.training.base_config`'s:
      data_path: an ``.npz`` holding ``data: [n, 64]`` pixels in ``[0, 16]`` and
        ``target: [n]`` classes; empty for scikit-learn's bundled digits.
      data_seed: seeds the train/test split and the label noise, so that runs with
        different ``seed`` see the same data.
      train_size: training images, stratified by class; the rest are the test set.
      label_noise: fraction of training labels replaced by a uniformly random class.
      model: ``"mlp"`` (the default) or ``"conv"``, a small convolutional net
        (``models.ConvNet``) whose ``hidden`` are its convolutions' channels and whose
        ``rate`` is that of the dropout after each convolution (``digits_nnx``: the MLP only).
      hidden: widths of the hidden Dense layers (channels of the convolutions).
      block_size: with ``model="conv"``: 0 for ordinary dropout on the feature maps,
        else DropBlock with ``block_size x block_size`` blocks.
      input_rate: dropout rate on the input pixels (``rate`` is the hidden layers').
      rate_schedule: the hidden layers' rate over the run: ``"constant"``, or
        ``"early:STEP"``, ``"late:STEP"``, ``"warmdown:STEP"`` (early dropout, late
        dropout, a linear fall to 0; see ``dropmask.training.RateSchedule``).
      learning_rate: Adam's step size.
      batch_size: examples per step (a multiple of the devices used).
    """
    config = base_config()
    config.data_path = ""
    config.data_seed = 0
    config.train_size = 200
    config.label_noise = 0.2
    config.model = "mlp"
    config.hidden = (256, 256)
    config.block_size = 0
    config.rate = 0.5
    config.input_rate = 0.0
    config.rate_schedule = "constant"
    config.learning_rate = 1e-3
    config.batch_size = 40
    config.steps = 500
    config.log_every = 25
    config.eval_every = 50
    config.checkpoint_every = 250
    config.keep_checkpoints = 2
    return config


def get_tiny_config() -> ml_collections.ConfigDict:
    """A seconds-long configuration for tests: narrow, few steps, a larger step size."""
    config = get_config()
    config.train_size = 96
    config.label_noise = 0.0
    config.hidden = (32,)
    config.learning_rate = 1e-2
    config.batch_size = 24
    config.steps = 12
    config.log_every = 2
    config.eval_every = 4
    config.checkpoint_every = 4
    return config
