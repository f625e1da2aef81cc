"""Trains one MLP on digits without and with dropout, the Flax dropout guide's way.

Run ``python -m examples.digits.train [--out runs/digits]``. The workflow is the
guide's, with ``dropmask.linen.Dropout`` in place of ``flax.linen.Dropout``:

1. split one root key into main (data order), params and dropout keys;
2. ``init`` with ``training=False`` (no dropout key needed for shapes);
3. keep the dropout key in a ``TrainState`` and fold the step number into it inside
   the jitted ``train_step``, so every step draws fresh masks;
4. ``apply(..., training=True, rngs={'dropout': key})`` to train, and plain
   ``apply(..., training=False)`` to evaluate.

Both runs share the root key, so they start from the same parameters and see the
same batches; only the dropout rates differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from tqdm import tqdm

from dropmask.training import TrainState

from . import configs, input_pipeline, report
from .models import MLP


@dataclasses.dataclass
class History:
    """Learning curves of one run, evaluated deterministically on both full splits.

    Attributes:
      name: the run's label, e.g. ``'dropout 0.5'``.
      rate: hidden-layer dropout rate.
      input_rate: input dropout rate.
      epoch: epochs completed at each evaluation (0 is before training).
      train_loss, train_accuracy, test_loss, test_accuracy: one value per evaluation.
      seconds: wall time of the run, compilation included.
    """

    name: str
    rate: float
    input_rate: float
    epoch: list[int] = dataclasses.field(default_factory=list)
    train_loss: list[float] = dataclasses.field(default_factory=list)
    train_accuracy: list[float] = dataclasses.field(default_factory=list)
    test_loss: list[float] = dataclasses.field(default_factory=list)
    test_accuracy: list[float] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def create_train_state(
    model: MLP, params_key: jax.Array, dropout_key: jax.Array, sample: jax.Array, lr: float
) -> TrainState:
    """Initialises ``model`` on ``sample: float32[batch, 64]`` and wraps it with Adam.

    ``init`` runs with ``training=False``: it only needs parameter shapes, so no
    dropout key is involved and ``params_key`` feeds the ``'params'`` stream alone.
    """
    variables = model.init(params_key, sample, training=False)
    return TrainState.create(
        apply_fn=model.apply, params=variables["params"], tx=optax.adam(lr), key=dropout_key
    )


@jax.jit
def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, jax.Array]:
    """One Adam step on ``batch = {'image': f32[b, 64], 'label': i32[b]}`` with dropout on.

    Returns:
      ``(new_state, loss)``, the mean cross-entropy of the batch under this step's masks.
    """
    # state.key never changes; folding in the step gives each step its own masks,
    # and re-running a step from the same state reproduces them (== state.step_key()).
    dropout_train_key = jax.random.fold_in(state.key, state.step)

    def loss_fn(params: dict) -> jax.Array:
        logits = state.apply_fn(
            {"params": params},
            batch["image"],
            training=True,
            rngs={"dropout": dropout_train_key},
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


@jax.jit
def eval_step(state: TrainState, image: jax.Array, label: jax.Array) -> dict[str, jax.Array]:
    """Deterministic loss and accuracy on ``image: f32[n, 64]``, ``label: i32[n]``.

    ``training=False`` turns every dropout layer off, so no ``rngs`` are passed.
    """
    logits = state.apply_fn({"params": state.params}, image, training=False)
    return {
        "loss": optax.softmax_cross_entropy_with_integer_labels(logits, label).mean(),
        "accuracy": jnp.mean(jnp.argmax(logits, axis=-1) == label),
    }


def _evaluate(
    history: History,
    epoch: int,
    state: TrainState,
    train: input_pipeline.Split,
    test: input_pipeline.Split,
) -> None:
    for prefix, split in (("train", train), ("test", test)):
        metrics = eval_step(state, split.image, split.label)
        getattr(history, f"{prefix}_loss").append(float(metrics["loss"]))
        getattr(history, f"{prefix}_accuracy").append(float(metrics["accuracy"]))
    history.epoch.append(epoch)


def train_and_evaluate(
    config: configs.Config,
    history: History,
    train: input_pipeline.Split,
    test: input_pipeline.Split,
    root_key: jax.Array,
    *,
    progress: bool = True,
) -> TrainState:
    """Trains a fresh MLP with ``history.rate`` / ``history.input_rate``; fills ``history``.

    Returns:
      The final train state.
    """
    start = time.perf_counter()
    main_key, params_key, dropout_key = jax.random.split(root_key, 3)
    model = MLP(hidden=config.hidden, rate=history.rate, input_rate=history.input_rate)
    state = create_train_state(
        model, params_key, dropout_key, jnp.asarray(train.image[:1]), config.learning_rate
    )
    _evaluate(history, 0, state, train, test)
    bar = tqdm(range(1, config.epochs + 1), desc=history.name, unit="epoch", disable=not progress)
    for epoch in bar:
        epoch_key = jax.random.fold_in(main_key, epoch)
        for batch in input_pipeline.batches(train, config.batch_size, epoch_key):
            state, loss = train_step(state, batch)
        if epoch % config.eval_every == 0 or epoch == config.epochs:
            _evaluate(history, epoch, state, train, test)
            bar.set_postfix(
                batch_loss=f"{float(loss):.3f}", test_acc=f"{history.test_accuracy[-1]:.3f}"
            )
    history.seconds = time.perf_counter() - start
    return state


def run(
    config: configs.Config, out_dir: pathlib.Path | str, *, progress: bool = True
) -> list[History]:
    """Trains without and with dropout, writes ``metrics.json`` and ``curves.png``.

    Args:
      config: hyperparameters; ``config.rate`` and ``config.input_rate`` are the
        dropout run's rates (the baseline uses 0 for both).
      out_dir: created if missing.
      progress: show a tqdm bar per run.

    Returns:
      One :class:`History` per run, baseline first.
    """
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, test = input_pipeline.load(
        config.train_size, seed=config.seed, label_noise=config.label_noise
    )
    root_key = jax.random.key(config.seed)
    histories = [
        History("no dropout", rate=0.0, input_rate=0.0),
        History(f"dropout {config.rate:g}", rate=config.rate, input_rate=config.input_rate),
    ]
    for history in histories:
        train_and_evaluate(config, history, train, test, root_key, progress=progress)
    report.save_json(config, histories, out_dir / "metrics.json")
    report.plot(histories, out_dir / "curves.png")
    return histories


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = configs.default()
    parser = argparse.ArgumentParser(
        prog="python -m examples.digits.train", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", default="runs/digits", help="output directory")
    parser.add_argument("--tiny", action="store_true", help="the seconds-long test config")
    parser.add_argument("--rate", type=float, help=f"hidden dropout rate ({defaults.rate})")
    parser.add_argument("--input-rate", type=float, help=f"input rate ({defaults.input_rate})")
    parser.add_argument("--epochs", type=int, help=f"epochs ({defaults.epochs})")
    parser.add_argument("--train-size", type=int, help=f"train images ({defaults.train_size})")
    parser.add_argument("--label-noise", type=float, help="fraction of train labels randomised (0)")
    parser.add_argument("--seed", type=int, help="root seed (0)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[History]:
    """Command-line entry point; returns the histories it printed."""
    args = _parse_args(argv)
    config = configs.tiny() if args.tiny else configs.default()
    overrides = {
        field: getattr(args, field)
        for field in ("rate", "input_rate", "epochs", "train_size", "label_noise", "seed")
        if getattr(args, field) is not None
    }
    config = dataclasses.replace(config, **overrides)
    histories = run(config, args.out, progress=not args.no_progress)
    print(report.table(histories))
    out = pathlib.Path(args.out)
    print(f"Wrote {out / 'metrics.json'} and {out / 'curves.png'}")
    return histories


if __name__ == "__main__":
    main()
