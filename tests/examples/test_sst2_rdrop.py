"""The sst2 example with R-Drop: two dropout passes and the symmetric KL in the loss."""

import jax
import optax
import pytest
from examples.sst2 import configs, input_pipeline, train

import dropmask


@pytest.mark.slow
def test_r_drop_step_is_the_mean_of_two_passes_plus_the_kl_term():
    config = configs.get_tiny_config()
    config.r_drop = 2.0
    data = input_pipeline.load(config)
    _, params_key, dropout_key = jax.random.split(jax.random.key(0), 3)
    state = train.create_state(config, data, params_key, dropout_key)
    assert state.r_drop == 2.0
    batch = {
        k: jax.numpy.asarray(v)
        for k, v in input_pipeline.train_batch(config, data, jax.random.key(1), 0).items()
    }
    _, metrics = train.train_step(state, batch)

    def forward(key):
        variables = {"params": state.params}
        return state.apply_fn(
            variables, batch["tokens"], batch["length"], True, rngs={"dropout": key}
        )

    a, b = dropmask.r_drop_passes(forward, state.rngs("dropout")["dropout"])
    ce = optax.softmax_cross_entropy_with_integer_labels
    kl = dropmask.symmetric_kl(a, b)
    want = 0.5 * (ce(a, batch["label"]).mean() + ce(b, batch["label"]).mean()) + kl
    assert float(kl) > 0.0
    assert float(metrics["loss"]) == pytest.approx(float(want), rel=1e-5)
