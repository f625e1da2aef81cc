"""Trains the digits MLP written in Flax NNX, on the same shared loop as the Linen one.

Run ``dropmask train digits_nnx``. Data, configs and everything the loop does
(devices, checkpoints, exact resume, logging, ``--compare-rates``, ``--mc-samples``)
are those of ``dropmask train digits``; only the model's API differs:

1. the loop splits one root key into data, params and dropout keys, as for Linen;
2. the model is built with ``nnx.Rngs(params=params_key, dropout=dropout_key)`` and
   kept in a :class:`dropmask.training.NnxTrainState` (``nnx.split``: graph
   definition, parameters, streams, other variables) with ``key=dropout_key``;
3. inside the jitted ``train_step``, ``state.model(params)`` rebuilds the model in
   training mode with each dropout stream keyed by the step, so every step draws
   fresh masks and a resumed step draws the same ones;
4. evaluation rebuilds it with ``training=False`` (``model.eval()``), as
   ``dropmask.training.ClassifierEval`` does for an ``NnxTrainState``.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import ml_collections
import optax
from flax import nnx

from dropmask import DropmaskValueError
from dropmask.training import ClassifierEval, NnxTrainState

from ..digits import input_pipeline
from ..digits import train as digits
from .models import MLP


def create_state(
    config: ml_collections.ConfigDict,
    data: input_pipeline.Data,
    params_key: jax.Array,
    dropout_key: jax.Array,
) -> NnxTrainState:
    """Builds the MLP from ``params_key`` and wraps it with Adam and ``key=dropout_key``.

    Raises:
      DropmaskValueError: ``model`` other than ``"mlp"`` or a ``block_size`` (the NNX
        twin has no convolutional model; ``dropmask train digits`` has).
    """
    for name, only in (("model", "mlp"), ("block_size", 0)):
        if config[name] != only:
            raise DropmaskValueError(
                f"digits_nnx: config.{name} must be {only!r} (the NNX example trains the "
                f"MLP only), got {config[name]!r}. Use dropmask train digits "
                f"--config.model=conv for the convolutional net."
            )
    model = MLP(
        input_pipeline.NUM_PIXELS,
        tuple(config.hidden),
        input_pipeline.NUM_CLASSES,
        rate=config.rate,
        input_rate=config.input_rate,
        rngs=nnx.Rngs(params=params_key, dropout=dropout_key),
    )
    return NnxTrainState.create(model=model, tx=optax.adam(config.learning_rate), key=dropout_key)


@jax.jit
def train_step(
    state: NnxTrainState, batch: dict[str, jax.Array]
) -> tuple[NnxTrainState, dict[str, jax.Array]]:
    """One Adam step on ``batch = {'image': f32[b, 64], 'label': i32[b]}``, dropout on.

    With ``config.rate_schedule`` other than ``"constant"`` the loop adds ``'rate'``,
    this step's hidden dropout rate, as for the Linen model.

    Returns:
      ``(new_state, {'loss', 'accuracy'})`` under this step's masks.
    """

    rate = {"rate": batch["rate"]} if "rate" in batch else {}

    def logits_fn(params: nnx.State) -> jax.Array:
        return state.model(params)(batch["image"], **rate)

    return digits.cross_entropy_step(state, batch, logits_fn)


# NNX selects the mode with .train() / .eval(), not a call argument: no mode keywords.
classifier = ClassifierEval(
    split_batch=input_pipeline.split_batch,
    model_inputs=digits.model_inputs,
    train_kwargs={},
    eval_kwargs={},
)


# Everything but the model's API is digits' own: data, configs, best metric, hooks.
example = dataclasses.replace(
    digits.example,
    name="digits_nnx",
    create_state=create_state,
    train_step=train_step,
    evaluate=classifier.evaluate,
    predict=classifier.predict,
    train_kwargs={},
    eval_kwargs={},
)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["train", "digits_nnx", *sys.argv[1:]]))
