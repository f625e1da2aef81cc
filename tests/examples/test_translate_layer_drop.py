"""The translate example with LayerDrop: training skips layers, evaluation prunes them."""

import numpy as np
import pytest
from examples.translate import configs, prune, train

from dropmask.training import train as run_training


@pytest.mark.slow
def test_layer_drop_trains_and_pruned_layers_change_the_evaluation(tmp_path):
    config = configs.get_tiny_config()
    config.num_layers, config.layer_drop = 2, 0.5
    run = run_training(train.example, config, tmp_path, devices=1, progress=False)
    assert np.isfinite(run.losses).all()
    results = prune.evaluate_pruned(tmp_path, 0.5)
    assert set(results) == {"none", "encoder", "decoder"}
    assert results["none"]["loss"] != results["encoder"]["loss"] != results["decoder"]["loss"]
