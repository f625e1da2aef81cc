"""One train step's compiled temporaries at a long context: dropmask's attention against Flax's.

::

    python -m examples.lm.memory                  # context 4096, batch 1
    python -m examples.lm.memory --context 2048 --batch-size 2

The long config's model (``--config long``), parameters and step (the example's
``train_step``: forward, backward and AdamW update, dropout on at the config's rate),
with ``config.attention`` set to Flax's ``nnx.dot_product_attention`` or to
``dropmask.dot_product_attention`` on its dense and blockwise paths. Each step is
compiled (not run) and XLA's memory analysis of the compiled program gives its
temporaries: the buffers the step needs besides its arguments and outputs.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from dropmask.cli import OneLineParser
from dropmask.training import run_keys

from . import configs, input_pipeline
from .train import create_state, train_step

CONTESTANTS = {
    "flax (nnx.dot_product_attention)": {"attention": "flax"},
    "dropmask, dense": {"attention": "dropmask", "attention_algorithm": "dense"},
    "dropmask, blockwise": {"attention": "dropmask", "attention_algorithm": "blockwise"},
}


def temporaries(context: int, batch_size: int, **entries: object) -> int:
    """Bytes of compiled temporaries of one train step of the long config's model."""
    config = configs.get_long_config()
    config.update(context=context, batch_size=batch_size, **entries)
    _, params_key, dropout_key = run_keys(config.seed)
    state = create_state(config, None, params_key, dropout_key)  # type: ignore[arg-type]
    batch = {"tokens": jnp.zeros((batch_size, context + 1), jnp.int32)}
    analysis = train_step.lower(state, batch).compile().memory_analysis()
    if analysis is None:
        raise RuntimeError(f"XLA gives no memory analysis on {jax.devices()[0].platform}.")
    return int(analysis.temp_size_in_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m examples.lm.memory", description=__doc__)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=1)
    args = parser.parse_args(argv)
    if args.context < 2 or args.batch_size < 1:
        print(
            f"memory: error: --context must be >= 2 and --batch-size >= 1, got {args.context} "
            f"and {args.batch_size}. Change the flag.",
            file=sys.stderr,
        )
        return 2
    config = configs.get_long_config()
    print(
        f"one train step, context {args.context}, batch {args.batch_size}, width "
        f"{config.width}, {config.heads} heads, depth {config.depth}, rate {config.rate}, "
        f"vocab {input_pipeline.VOCAB_SIZE}; {jax.devices()[0].platform}, jax {jax.__version__}"
    )
    rows = [
        (name, temporaries(args.context, args.batch_size, **e)) for name, e in CONTESTANTS.items()
    ]
    flax = rows[0][1]
    print(f"{'attention':<34} {'temporaries':>12} {'vs flax':>8}")
    for name, size in rows:
        print(f"{name:<34} {size / 2**20:>8.1f} MiB {size / flax:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
