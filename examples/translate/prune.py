"""Evaluates a finished translate run with encoder or decoder layers pruned (LayerDrop).

A model trained with LayerDrop (``--config.layer_drop``) can lose layers at inference
without retraining (Fan et al., 2019). This restores the run's latest checkpoint and
scores the held-out pairs three ways: every layer, and the layers
``dropmask.kept_layers(num_layers, rate)`` keeps in the encoder alone or in the decoder
alone::

    python -m examples.translate.prune --workdir runs/translate --rate 0.5
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import ml_collections

import dropmask
from dropmask.training import Checkpointer

from . import input_pipeline, train


def evaluate_pruned(run: pathlib.Path, rate: float) -> dict[str, dict[str, float]]:
    """Held-out metrics of the run in ``run``: ``{'none' | 'encoder' | 'decoder': metrics}``."""
    config = ml_collections.ConfigDict(json.loads((run / "summary.json").read_text())["config"])
    data = input_pipeline.load(config)
    _, params_key, dropout_key = jax.random.split(jax.random.key(config.seed), 3)
    state = train.example.build_state(config, data, params_key, dropout_key)
    checkpointer = Checkpointer(run / "checkpoints", keep=config.keep_checkpoints)
    try:
        state, _ = checkpointer.restore(state, config=config.to_dict())
    finally:
        checkpointer.close()
    kept = dropmask.kept_layers(int(config.num_layers), rate)
    pruned = tuple(i for i in range(int(config.num_layers)) if i not in kept)
    out = {}
    for name, entry in (
        ("none", None),
        ("encoder", "pruned_encoder"),
        ("decoder", "pruned_decoder"),
    ):
        variant = config.copy_and_resolve_references()
        if entry is not None:
            variant[entry] = pruned
        out[name] = train.evaluate(state, variant, data, "eval")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workdir", type=pathlib.Path, required=True)
    parser.add_argument("--rate", type=float, default=0.5, help="fraction of layers pruned")
    args = parser.parse_args(argv)
    results = evaluate_pruned(args.workdir, args.rate)
    for name, metrics in results.items():
        print(name, json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
