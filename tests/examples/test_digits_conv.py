"""The digits example's convolutional model, with dropout or DropBlock on its maps."""

import jax
import numpy as np
import pytest
from tests.covering import covering

from dropmask import DropmaskValueError
from dropmask.examples.digits import configs, input_pipeline, train


# Fast: DropBlock on the maps; with dropout there (slow), the conv model runs in
# tests/examples/test_config_entries.py's digits-model case.
@pytest.mark.parametrize("block_size", covering([0, 3], [3]))
def test_conv_model_learns_with_dropout_or_drop_block(block_size):
    config = configs.get_tiny_config()
    config.model, config.hidden, config.block_size, config.rate = "conv", (8, 8), block_size, 0.2
    data = input_pipeline.load(config)
    _, params_key, dropout_key = jax.random.split(jax.random.key(0), 3)
    state = train.create_state(config, data, params_key, dropout_key)
    losses = []
    for step in range(30):
        batch = input_pipeline.train_batch(config, data, jax.random.key(1), step)
        state, metrics = train.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    assert set(train.classifier.evaluate(state, config, data, "eval")) == {"loss", "accuracy"}


def test_unknown_model_is_refused_in_one_line():
    config = configs.get_tiny_config()
    config.model = "resnet"
    with pytest.raises(DropmaskValueError, match="config.model must be 'mlp' or 'conv'"):
        input_pipeline.load(config)
