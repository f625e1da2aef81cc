"""Evaluates a finished translate run with encoder or decoder layers pruned (LayerDrop).

A model trained with LayerDrop (``--config.layer_drop``) can lose layers at inference
without retraining (Fan et al., 2019). This restores the run's latest checkpoint and
scores the held-out pairs three ways: every layer, and the layers
``dropmask.kept_layers(num_layers, rate)`` keeps in the encoder alone or in the decoder
alone::

    python -m examples.translate.prune --workdir runs/translate --rate 0.5
"""

from __future__ import annotations

import json
import pathlib
import sys

import dropmask
from dropmask import DropmaskError
from dropmask.cli import OneLineParser
from dropmask.training import restore_run

from . import train


def evaluate_pruned(run: pathlib.Path, rate: float) -> dict[str, dict[str, float]]:
    """Held-out metrics of the run in ``run``: ``{'none' | 'encoder' | 'decoder': metrics}``."""
    state, config, data = restore_run(run, train.example)
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
    """``python -m examples.translate.prune``: a mistake is one line on stderr, exit 2
    (bad arguments) or 1 (a run that cannot be read)."""
    parser = OneLineParser(
        prog="python -m examples.translate.prune", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--workdir", type=pathlib.Path, required=True)
    parser.add_argument("--rate", type=float, default=0.5, help="fraction of layers pruned")
    args = parser.parse_args(argv)
    try:
        # The arguments first: restoring the run is the slow part.
        dropmask.kept_layers(1, args.rate)
    except DropmaskError as error:
        return _fail(error, 2)
    try:
        results = evaluate_pruned(args.workdir, args.rate)
    except DropmaskError as error:
        return _fail(error, 1)
    for name, metrics in results.items():
        print(name, json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    return 0


def _fail(error: DropmaskError, status: int) -> int:
    print(f"translate prune: error: {str(error).rstrip('.')}.", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
