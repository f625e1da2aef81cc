"""Text from a trained lm run: greedy, temperature and top-k sampling from a prompt.

::

    dropmask sample lm --workdir runs/lm --prompt "The with statement"
    dropmask sample lm --workdir runs/lm --prompt "A list" --temperature 0.8 --top-k 20

(``python -m examples.lm.sample ...`` is the same command.) :func:`generate` is the
function behind it, the example's ``sample`` hook.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dropmask import DropmaskValueError
from dropmask.training import NnxTrainState


@functools.partial(jax.jit, static_argnames=("greedy",))
def _next_byte(
    state: NnxTrainState,
    window: jax.Array,
    last: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    greedy: bool,
) -> jax.Array:
    logits = state.model(training=False)(window[None])[0, last]
    if greedy:
        return jnp.argmax(logits)
    # The k-th largest logit is the threshold (top_k 0 or >= 256: none); a byte that
    # ties with it is kept too.
    vocab = logits.shape[-1]
    ordered = jnp.sort(logits)
    kth = ordered[vocab - jnp.clip(top_k, 1, vocab)]
    kth = jnp.where((top_k > 0) & (top_k < vocab), kth, -jnp.inf)
    # Scaled from the largest logit, the most likely bytes stay at 0 whatever the
    # temperature: a huge one (logits / T below float32's smallest, or T past its
    # largest) leaves the kept bytes equally likely, a tiny one the most likely
    # bytes alone, and neither makes an infinity meet a zero (NaN).
    below = logits - ordered[-1]
    scaled = jnp.where(below == 0, 0.0, below / temperature)
    return jax.random.categorical(key, jnp.where(logits >= kth, scaled, -jnp.inf))


def _float32(value: float) -> jax.Array:
    """``value`` in float32, infinite past its largest finite value (no overflow warning)."""
    with np.errstate(over="ignore"):
        return jnp.asarray(np.float32(value))


def _bucket(length: int, context: int) -> int:
    """The window the model reads: the next power of two from 64 up to ``context``, so
    that a few shapes are compiled, not one per length."""
    size = 64
    while size < length:
        size *= 2
    return min(size, context)


def check_request(prompt: str, length: int, temperature: float, top_k: int, key: Any) -> None:
    """Raises :class:`DropmaskValueError` unless :func:`generate` can serve these
    arguments."""
    if not isinstance(prompt, str) or not prompt:
        raise DropmaskValueError(
            f"generate: prompt must be at least one character, got {prompt!r}."
        )
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise DropmaskValueError(
            f"generate: prompt must be UTF-8 text, got {prompt!r}. Decode its bytes as UTF-8."
        ) from None
    if length < 1:
        raise DropmaskValueError(f"generate: length must be >= 1, got {length}.")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise DropmaskValueError(
            f"generate: temperature must be a finite number >= 0 (0: greedy), got {temperature}."
        )
    if not (isinstance(top_k, int) and top_k >= 0):
        raise DropmaskValueError(
            f"generate: top_k must be an int >= 0 (0: every byte), got {top_k!r}."
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
    top_k: int = 0,
    key: jax.Array | None = None,
) -> str:
    """``length`` bytes after ``prompt``, each from the model with dropout off.

    Temperature 0 takes the most likely byte (greedy); above 0, byte ``i`` is drawn
    from ``softmax(logits / temperature)`` over the ``top_k`` most likely bytes (0:
    all 256) with ``fold_in(key, i)``: one key, one text. Any finite temperature is
    honoured: so large that ``logits / temperature`` underflows, the kept bytes are
    equally likely (at ``top_k`` 1, greedy); so small that it overflows, the most
    likely byte is taken. The model reads
    the last ``context`` bytes. Bytes that do not decode as UTF-8 are shown as U+FFFD.

    Args:
      state: a trained state (:func:`restore`).
      prompt: the text to continue; at least one character.
      length: how many bytes to add, at least 1.
      temperature: 0 for greedy decoding, else the sampling temperature.
      top_k: sample among this many most likely bytes; 0 for all of them.
      key: the sampling key; required when ``temperature > 0``.

    Returns:
      The prompt and its continuation.

    Raises:
      DropmaskValueError: an empty or non-UTF-8 prompt, ``length < 1``, a
        temperature below 0 or not finite, ``top_k < 0``, or no key for sampling.
    """
    check_request(prompt, length, temperature, top_k, key)
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
            _float32(temperature),
            jnp.int32(top_k),
            temperature == 0,
        )
        out.append(int(byte))
    return bytes(out).decode("utf-8", errors="replace")


def sample_hook(
    state: NnxTrainState,
    config: ml_collections.ConfigDict,
    prompt: str,
    length: int,
    temperature: float,
    top_k: int,
    key: jax.Array,
) -> str:
    """The example's ``sample`` hook (``dropmask sample lm``): :func:`generate`."""
    del config
    return generate(state, prompt, length, temperature=temperature, top_k=top_k, key=key)


if __name__ == "__main__":
    from dropmask.cli import main

    sys.exit(main(["sample", "lm", *sys.argv[1:]]))
