"""Out-of-distribution detection on digits by Monte Carlo dropout's mutual information.

Run after ``dropmask train digits --compare-rates ... --mc-samples K`` (or any run with
checkpoints)::

    python -m dropmask.examples.digits.ood --workdir runs/mc_digits/rate_0.5 --plot digits_mc.png

For every ``seed_S/`` run under ``--workdir`` (or the run itself), the final checkpoint
is restored and its held-out images are scored against three sets it never saw:
``shifted`` (each test image moved 2 pixels right, zeros shifted in), ``inverted``
(``1 - pixel``) and ``noise`` (uniform pixels). Each score ranks inputs by
uncertainty; its AUROC (scikit-learn) is the chance that a random outside image scores
higher than a random held-out digit. Scores: the deterministic model's predictive
entropy and ``1 - max p``; with K dropout samples, the predictive entropy and the mutual
information (BALD). The table is mean ± std over the runs; ``--json`` keeps every run.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dropmask import uncertainty
from dropmask._optional import require
from dropmask.cli import OneLineParser
from dropmask.examples.digits import train
from dropmask.training import restore_run

SHIFT = 2  # pixels


def outside_sets(images: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """The three out-of-distribution sets, each ``float32[n, 64]`` in ``[0, 1]``."""
    square = images.reshape(-1, 8, 8)
    shifted = np.zeros_like(square)
    shifted[:, :, SHIFT:] = square[:, :, :-SHIFT]
    noise = np.random.default_rng(seed).uniform(0.0, 1.0, images.shape).astype(np.float32)
    return {
        "shifted": shifted.reshape(images.shape),
        "inverted": (1.0 - images).astype(np.float32),
        "noise": noise,
    }


def scores(state: Any, images: np.ndarray, key: jax.Array, samples: int) -> dict[str, np.ndarray]:
    """Per image: the uncertainty scores compared (higher: less sure)."""
    logits = train.classifier.logits(state, (jnp.asarray(images),), None, 0)
    sampled = train.classifier.logits(state, (jnp.asarray(images),), key, samples)
    single = logits[None]
    return {
        "entropy": np.asarray(uncertainty.predictive_entropy(single)),
        "1 - max p": 1.0 - np.asarray(jax.nn.softmax(logits).max(-1)),
        "MC entropy": np.asarray(uncertainty.predictive_entropy(sampled)),
        "MC mutual information": np.asarray(uncertainty.mutual_information(sampled)),
    }


def evaluate_run(run: pathlib.Path, samples: int) -> dict[str, Any]:
    """AUROC of every score against every outside set, for one run."""
    roc_auc_score = require("sklearn.metrics", caller="ood").roc_auc_score
    state, config, data = restore_run(run, train.example)
    key = jax.random.fold_in(jax.random.key(config.seed), 0x00D)
    inside = scores(state, data.test.image, key, samples)
    auroc: dict[str, dict[str, float]] = {}
    for name, images in outside_sets(data.test.image, config.data_seed).items():
        outside = scores(state, images, key, samples)
        truth = np.r_[np.zeros(len(data.test)), np.ones(len(images))]
        auroc[name] = {
            score: float(roc_auc_score(truth, np.r_[inside[score], outside[score]]))
            for score in inside
        }
    return {"run": str(run), "seed": int(config.seed), "auroc": auroc}


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: one row per outside set, one column per score, mean ± std over runs."""
    sets = list(results[0]["auroc"])
    names = list(results[0]["auroc"][sets[0]])
    lines = [
        "| outside set | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for s in sets:
        cells = []
        for n in names:
            values = np.array([r["auroc"][s][n] for r in results])
            std = values.std(ddof=1) if len(values) > 1 else 0.0
            cells.append(f"{values.mean():.3f} ± {std:.3f}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(run: pathlib.Path, samples: int, path: pathlib.Path) -> None:
    """Reliability diagrams (deterministic, K samples) and mutual information histograms."""
    Figure = require("matplotlib.figure", caller="ood").Figure  # noqa: N806
    state, config, data = restore_run(run, train.example)
    key = jax.random.fold_in(jax.random.key(config.seed), 0x00D)
    images, labels = jnp.asarray(data.test.image), jnp.asarray(data.test.label)
    logits = train.classifier.logits(state, (images,), None, 0)
    sampled = train.classifier.logits(state, (images,), key, samples)
    fig = Figure(figsize=(12.6, 3.8), layout="constrained")
    det_ax, mc_ax, mi_ax = fig.subplots(1, 3)
    uncertainty.reliability_diagram(logits, labels, ax=det_ax, label="dropout off")
    det_ax.set_title("held-out digits, dropout off")
    mc_log_p = uncertainty.predictive_log_probs(sampled)
    uncertainty.reliability_diagram(mc_log_p, labels, ax=mc_ax, label=f"K={samples}")
    mc_ax.set_title(f"held-out digits, mean of {samples} dropout samples")
    sets = {"held-out digits": data.test.image, **outside_sets(data.test.image, config.data_seed)}
    bins = np.linspace(0.0, np.log(10.0), 40)
    for name, x in sets.items():
        mi = uncertainty.mutual_information(
            train.classifier.logits(state, (jnp.asarray(x),), key, samples)
        )
        mi_ax.hist(np.asarray(mi), bins=bins, histtype="step", density=True, label=name)
    mi_ax.set(xlabel="mutual information (nats)", ylabel="density", xlim=(0, 1.2))
    mi_ax.set_title(f"mutual information, seed {config.seed}")
    mi_ax.legend()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m dropmask.examples.digits.ood", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--workdir", required=True, help="a run, or a rate_R/ of seed_S/ runs")
    parser.add_argument("--samples", type=int, default=50, help="dropout samples K (50)")
    parser.add_argument("--json", help="write every run's AUROCs here")
    parser.add_argument("--plot", help="write the first run's diagrams here (PNG)")
    args = parser.parse_args(argv)
    if args.samples < 1:
        print(f"ood: error: --samples must be >= 1 (dropout samples), got {args.samples}.",
              file=sys.stderr)  # fmt: skip
        return 2
    workdir = pathlib.Path(args.workdir)
    runs = sorted(workdir.glob("seed_*")) or [workdir]
    missing = [r for r in runs if not (r / "summary.json").is_file()]
    if missing:
        print(f"ood: error: no finished run in {missing[0]} (no summary.json).", file=sys.stderr)
        return 2
    results = [evaluate_run(run, args.samples) for run in runs]
    print(f"AUROC, held-out digits against each outside set, K={args.samples}, {len(runs)} runs")
    print(table(results))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(runs[0], args.samples, pathlib.Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
