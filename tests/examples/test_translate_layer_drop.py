"""The translate example with LayerDrop: training skips layers, evaluation prunes them."""

import numpy as np
import pytest
from examples.translate import configs, prune, train

import dropmask
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
    # Above half, one of the two layers is kept, never none.
    assert all(np.isfinite(m["loss"]) for m in prune.evaluate_pruned(tmp_path, 0.75).values())


@pytest.mark.parametrize("entry", ["pruned_encoder", "pruned_decoder"])
@pytest.mark.parametrize("indices", [(0, 1), (2,), (-1,)])
def test_pruning_every_layer_or_one_out_of_range_is_refused(entry, indices):
    config = configs.get_tiny_config()
    config.num_layers = 2
    config[entry] = indices
    with pytest.raises(dropmask.DropmaskValueError, match=f"translate: config.{entry} must"):
        train._layers(config, entry)
