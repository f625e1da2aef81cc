"""The train step's time with and without token dropping, paired in one process.

::

    python -m examples.lm.token_speed                          # depth 6, token_drop 0.5
    python -m examples.lm.token_speed --depth 3 --token-drop 0.25 --repeats 5

Two arms of the example's compiled ``train_step`` (forward, backward and AdamW update,
dropout on): the default model at ``--depth`` with ``config.token_drop = 0`` and at
``--token-drop``. Each repeat runs ``--steps`` steps of one arm, then of the other,
swapping which goes first every repeat, so that a slower or faster spell of a shared
machine falls on both arms alike. It prints each arm's median time per step and the
median (and quartiles) of the per-repeat ratios. The timings mean something only on a
machine that runs nothing else.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dropmask.cli import OneLineParser
from dropmask.training import NnxTrainState, run_keys

from . import configs, input_pipeline
from .models import token_drop_blocks
from .train import create_state, train_step


def arm(depth: int, token_drop: float, context: int) -> ml_collections.ConfigDict:
    """The default config at ``depth``, ``token_drop`` and ``context``."""
    config = configs.get_config()
    config.update(depth=depth, token_drop=token_drop, context=context)
    return config


def time_steps(
    state: NnxTrainState, batch: dict[str, jax.Array], steps: int
) -> tuple[NnxTrainState, float]:
    """Runs ``steps`` train steps from ``state``; the new state and seconds per step."""
    start = time.perf_counter()
    for _ in range(steps):
        state, _ = train_step(state, batch)
    jax.block_until_ready(state)
    return state, (time.perf_counter() - start) / steps


def _flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags, in a few words; None when nothing is."""
    if args.depth < 3:
        return f"--depth must be >= 3 (a block between the first and the last), got {args.depth}"
    if not 0.0 < args.token_drop < 1.0:
        return f"--token-drop must be in (0, 1), got {args.token_drop}"
    if args.context < 2:
        return f"--context must be >= 2, got {args.context}"
    if args.repeats < 1 or args.steps < 1:
        return f"--repeats and --steps must be >= 1, got {args.repeats} and {args.steps}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m examples.lm.token_speed", description=__doc__)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--token-drop", type=float, default=0.5)
    parser.add_argument("--context", type=int, default=configs.get_config().context)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps per arm per repeat")
    args = parser.parse_args(argv)
    problem = _flag_problem(args)
    if problem:
        print(f"token_speed: {problem}. Change the flag.", file=sys.stderr)
        return 2
    rates = (0.0, args.token_drop)
    arms = [arm(args.depth, rate, args.context) for rate in rates]
    names = [f"token_drop {rate:g}" for rate in rates]
    data = input_pipeline.load(arms[1])
    config = arms[1]
    print(
        f"train step, context {config.context}, batch {config.batch_size}, width "
        f"{config.width}, depth {args.depth}, rate {config.rate}, blocks dropping tokens "
        f"{len(token_drop_blocks(config))}; {jax.devices()[0].platform}, jax {jax.__version__}"
    )
    tokens = input_pipeline.train_batch(config, data, jax.random.key(0), 0)["tokens"]
    batch = {"tokens": jnp.asarray(tokens)}
    _, params_key, dropout_key = run_keys(config.seed)
    states = []
    for name, c in zip(names, arms, strict=True):
        start = time.perf_counter()
        state, _ = time_steps(create_state(c, data, params_key, dropout_key), batch, 1)
        print(f"{name}: first step (compilation included) {time.perf_counter() - start:.1f} s")
        states.append(state)
    seconds: list[list[float]] = [[], []]
    for repeat in range(args.repeats):
        order = (0, 1) if repeat % 2 == 0 else (1, 0)
        for i in order:
            states[i], per_step = time_steps(states[i], batch, args.steps)
            seconds[i].append(per_step)
    ratios = np.asarray(seconds[1]) / np.asarray(seconds[0])
    for name, times in zip(names, seconds, strict=True):
        print(f"{name}: {statistics.median(times):.3f} s per step (median of {args.repeats})")
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    print(
        f"ratio {names[1]} / {names[0]}: {median:.3f} (median of {args.repeats} paired "
        f"repeats, quartiles {q1:.3f} to {q3:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
