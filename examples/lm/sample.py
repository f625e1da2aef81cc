"""Text from a trained lm run: greedy or temperature sampling from a prompt.

::

    python -m examples.lm.sample --workdir runs/lm --prompt "The with statement"
    python -m examples.lm.sample --workdir runs/lm --prompt "A list" --temperature 0.8

:func:`generate` is the function behind the command; :func:`restore` rebuilds the
state of a run's checkpoint (the latest, or ``--step``).
"""

from __future__ import annotations

import functools
import math
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dropmask import DropmaskError, DropmaskValueError
from dropmask.cli import OneLineParser
from dropmask.training import NnxTrainState, restore_run

from .train import example


def restore(workdir: str | pathlib.Path, step: int | None = None) -> NnxTrainState:
    """The state of checkpoint ``step`` (default: the latest) of the run in ``workdir``.

    Raises:
      DropmaskValueError: ``workdir`` holds no checkpoints.
      CheckpointError: the run has no such checkpoint.
    """
    state, _, _ = restore_run(workdir, example, step=step)
    return state


@functools.partial(jax.jit, static_argnames=("greedy",))
def _next_byte(
    state: NnxTrainState,
    window: jax.Array,
    last: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    greedy: bool,
) -> jax.Array:
    logits = state.model(training=False)(window[None])[0, last]
    if greedy:
        return jnp.argmax(logits)
    return jax.random.categorical(key, logits / temperature)


def _bucket(length: int, context: int) -> int:
    """The window the model reads: the next power of two from 64 up to ``context``, so
    that a few shapes are compiled, not one per length."""
    size = 64
    while size < length:
        size *= 2
    return min(size, context)


def check_request(prompt: str, length: int, temperature: float, key: Any) -> None:
    """Raises :class:`DropmaskValueError` unless :func:`generate` can serve these
    arguments; checked before a checkpoint is restored."""
    if not prompt:
        raise DropmaskValueError("generate: prompt must be at least one character, got ''.")
    if length < 1:
        raise DropmaskValueError(f"generate: length must be >= 1, got {length}.")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise DropmaskValueError(
            f"generate: temperature must be a finite number >= 0 (0: greedy), got {temperature}."
        )
    if temperature > 0 and key is None:
        raise DropmaskValueError(
            "generate: sampling at temperature > 0 needs key=jax.random.key(SEED)."
        )


def generate(
    state: NnxTrainState,
    prompt: str,
    length: int,
    *,
    temperature: float = 0.0,
    key: jax.Array | None = None,
) -> str:
    """``length`` bytes after ``prompt``, each from the model with dropout off.

    Temperature 0 takes the most likely byte (greedy); above 0, byte ``i`` is drawn
    from ``softmax(logits / temperature)`` with ``fold_in(key, i)``. The model reads
    the last ``context`` bytes. Bytes that do not decode as UTF-8 are shown as U+FFFD.

    Args:
      state: a trained state (:func:`restore`).
      prompt: the text to continue; at least one character.
      length: how many bytes to add, at least 1.
      temperature: 0 for greedy decoding, else the sampling temperature.
      key: the sampling key; required when ``temperature > 0``.

    Returns:
      The prompt and its continuation.

    Raises:
      DropmaskValueError: an empty prompt, ``length < 1``, a temperature below 0 or
        not finite, or no key for sampling.
    """
    check_request(prompt, length, temperature, key)
    context = int(state.params["positions"]["embedding"].shape[0])
    out = list(prompt.encode("utf-8"))
    key = jax.random.key(0) if key is None else key
    for i in range(length):
        recent = out[-context:]
        size = _bucket(len(recent), context)
        window = np.zeros(size, np.int32)
        window[: len(recent)] = recent
        byte = _next_byte(
            state,
            jnp.asarray(window),
            jnp.int32(len(recent) - 1),
            jax.random.fold_in(key, i),
            jnp.float32(max(temperature, 1e-6)),
            temperature == 0,
        )
        out.append(int(byte))
    return bytes(out).decode("utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m examples.lm.sample", description=__doc__)
    parser.add_argument("--workdir", required=True, help="a dropmask train lm run directory")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--length", type=int, default=300, help="bytes to add (300)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (0)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling key's seed (0)")
    parser.add_argument("--step", type=int, help="the checkpoint (the latest)")
    args = parser.parse_args(argv)
    try:
        check_request(args.prompt, args.length, args.temperature, jax.random.key(args.seed))
        state = restore(args.workdir, args.step)
        text = generate(
            state,
            args.prompt,
            args.length,
            temperature=args.temperature,
            key=jax.random.key(args.seed),
        )
    except DropmaskError as error:
        print(f"lm sample: error: {str(error).rstrip('.')}.", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
