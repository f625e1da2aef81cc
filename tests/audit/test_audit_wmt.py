"""dropmask.audit on a WMT-style Transformer and its pmapped, donating train step.

The model selects its mode by a config field, scans its encoder layers with
``nn.scan`` and uses Flax's ``MultiHeadDotProductAttention`` with weight dropout, as
Flax's WMT example does; the step is ``jax.pmap``-ed over the 8 fake CPU devices with
``pmean`` over gradients and ``donate_argnums=(0,)``. Each test injects one bug.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import jax_utils, struct

from dropmask.audit import audit_model, audit_step
from dropmask.training import TrainState

# A whole Transformer, its pmapped step and its training: the end-to-end group.
pytestmark = pytest.mark.slow


@struct.dataclass
class TransformerConfig:
    vocab_size: int = 16
    emb_dim: int = 16
    num_heads: int = 2
    num_layers: int = 2
    mlp_dim: int = 32
    dropout_rate: float = 0.3
    attention_dropout_rate: float = 0.3
    deterministic: bool = False
    # Flax's default is True: one weight mask for every example and head.
    broadcast_dropout: bool = False
    # Whether nn.scan splits the 'dropout' stream over the stacked layers.
    split_dropout: bool = True
    # The MLP's dropout ignores the config and stays on in evaluation.
    mlp_always_drops: bool = False


class MlpBlock(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        h = nn.relu(nn.Dense(c.mlp_dim)(x))
        deterministic = False if c.mlp_always_drops else c.deterministic
        h = nn.Dropout(c.dropout_rate, deterministic=deterministic)(h)
        return nn.Dense(x.shape[-1])(h)


class EncoderLayer(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, x, mask):
        c = self.config
        y = nn.MultiHeadDotProductAttention(
            num_heads=c.num_heads,
            dropout_rate=c.attention_dropout_rate,
            broadcast_dropout=c.broadcast_dropout,
            deterministic=c.deterministic,
        )(nn.LayerNorm()(x), mask=mask)
        x = x + nn.Dropout(c.dropout_rate, deterministic=c.deterministic)(y)
        return x + MlpBlock(c)(nn.LayerNorm()(x)), None


class Transformer(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs, targets):
        c = self.config
        embed = nn.Embed(c.vocab_size, c.emb_dim)
        layers = nn.scan(
            EncoderLayer,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": c.split_dropout},
            in_axes=nn.broadcast,
            length=c.num_layers,
        )(c, name="encoder")
        encoded, _ = layers(embed(inputs), nn.make_attention_mask(inputs > 0, inputs > 0))
        y = embed(targets)
        y = y + nn.MultiHeadDotProductAttention(
            num_heads=c.num_heads,
            dropout_rate=c.attention_dropout_rate,
            broadcast_dropout=c.broadcast_dropout,
            deterministic=c.deterministic,
            name="cross",
        )(y, encoded)
        y = nn.Dropout(c.dropout_rate, deterministic=c.deterministic)(y)
        return embed.attend(nn.LayerNorm()(y))


DEVICES = jax.local_device_count()
BATCH = 2 * DEVICES
RNG = np.random.default_rng(0)
INPUTS = jnp.asarray(RNG.integers(1, 16, (BATCH, 8)), jnp.int32)
TARGETS = jnp.asarray(RNG.integers(1, 16, (BATCH, 8)), jnp.int32)


def pmapped_step(config: TransformerConfig, fold: bool = True):
    """A data-parallel step: per-device keys, gradients averaged with pmean, state donated."""

    def train_step(state, batch):
        key = jax.random.fold_in(state.key, jax.lax.axis_index("batch"))
        key = jax.random.fold_in(key, state.step) if fold else key

        def loss_fn(params):
            logits = Transformer(config).apply(
                {"params": params}, batch["inputs"], batch["targets"], rngs={"dropout": key}
            )
            onehot = jax.nn.one_hot(batch["targets"], config.vocab_size)
            return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        grads = jax.lax.pmean(grads, axis_name="batch")
        return state.apply_gradients(grads=grads), jax.lax.pmean(loss, axis_name="batch")

    return jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))


def _variables(config: TransformerConfig):
    model = Transformer(config.replace(deterministic=True))
    return model.init(jax.random.key(0), INPUTS, TARGETS)


def _replicated_state(config: TransformerConfig):
    params = _variables(config)["params"]
    state = TrainState.create(
        apply_fn=Transformer(config).apply, params=params, tx=optax.sgd(0.1), key=jax.random.key(1)
    )
    return jax_utils.replicate(state)


def _batches(n: int = 2):
    shard = {
        "inputs": INPUTS.reshape(DEVICES, -1, 8),
        "targets": TARGETS.reshape(DEVICES, -1, 8),
    }
    return [shard] * n


def _audit_model(config: TransformerConfig):
    # No train or eval keyword arguments: the config selects the mode.
    return audit_model(
        Transformer(config),
        _variables(config),
        INPUTS,
        TARGETS,
        eval_model=Transformer(config.replace(deterministic=True)),
    )


def test_clean_transformer_audits_clean_with_eval_model_alone():
    report = _audit_model(TransformerConfig())
    assert report.ok, str(report)
    kinds = {s.path: s.kind for s in report.sites}
    assert kinds["cross"] == "attention"
    attention = [s for s in report.sites if s.kind == "attention"]
    assert len(attention) == 2
    for site in attention:
        assert site.drop_fraction is not None
        bound = 4 * np.sqrt(0.3 * 0.7 / site.decisions) + 0.01
        assert abs(site.drop_fraction - 0.3) < bound, str(report)


def test_clean_pmapped_step_audits_clean_and_keeps_the_callers_state():
    config = TransformerConfig()
    state = _replicated_state(config)
    report = audit_step(pmapped_step(config), state, _batches())
    assert report.ok, str(report)
    assert {s.kind for s in report.sites} == {"attention", "dropout"}
    # The step donates its state: the audit must have passed a copy.
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    assert int(state.step[0]) == 0


def test_the_same_step_audits_again_and_after_training_compiled_it():
    config = TransformerConfig(broadcast_dropout=True)
    step = pmapped_step(config)
    state = _replicated_state(config)
    first = audit_step(step, state, _batches())
    trained, _ = step(jax.tree.map(jnp.copy, state), _batches(1)[0])  # compiles the step
    second = audit_step(step, trained, _batches())
    for report in (first, second):
        assert "attention-dropout-shared" in report.codes, str(report)
        assert len(report.sites) == len(first.sites) > 0


@pytest.mark.parametrize(
    ("bug", "code"),
    [
        ({"broadcast_dropout": True}, "attention-dropout-shared"),
        ({"split_dropout": False}, "same-mask-across-iterations"),
    ],
)
def test_injected_model_bugs_are_caught_in_the_model_and_the_step(bug, code):
    config = TransformerConfig(**bug)
    for report in (
        _audit_model(config),
        audit_step(pmapped_step(config), _replicated_state(config), _batches()),
    ):
        assert code in report.codes, str(report)
        assert all(f.path.startswith(("encoder", "cross")) for f in report.findings)


def test_step_without_a_fresh_key_per_step_is_caught():
    config = TransformerConfig()
    report = audit_step(pmapped_step(config, fold=False), _replicated_state(config), _batches())
    assert report.codes == {"same-mask-across-steps"}, str(report)


def test_dropout_left_on_in_evaluation_gets_a_config_fix():
    report = _audit_model(TransformerConfig(mlp_always_drops=True))
    assert report.codes == {"eval-not-deterministic"}, str(report)
    (finding,) = report.findings
    assert finding.path == "encoder/MlpBlock_0/Dropout_0"
    assert "deterministic=self.config.deterministic" in finding.message
    assert "training" not in finding.message and "deterministic=False" not in finding.message
