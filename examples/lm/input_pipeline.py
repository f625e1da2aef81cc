"""Python's own documentation as bytes: a held-out split by topic, windows per step.

``pydoc_data.topics`` ships with every Python install (it is what ``help('assert')``
prints): 79 topics, about 465,000 characters of English prose, grammar and examples,
so nothing is downloaded. Its text differs between Python versions; the loaded
corpus's size is recorded in each checkpoint's data position, so a resume on another
version is refused rather than silently continued on other data.

The model reads UTF-8 bytes (a vocabulary of 256, the same on every machine); held-out
bits per character are its bits per byte times the held-out text's bytes per
character (all but a handful of characters are ASCII).

Topics are held out whole, in the order of the CRC-32 of their names, until they
hold ``eval_fraction`` of the characters: never a slice of a topic, so that the
held-out text is not the continuation of a training passage. The batch of step
``s`` is ``batch_size`` windows of ``context + 1`` bytes starting at uniform
positions of the training text, drawn with ``fold_in(data_key, s)``: a pure function
of the key and the step, which is what makes resuming exact.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dropmask import DropmaskValueError
from dropmask.training import DataError, check_config

VOCAB_SIZE = 256
# Between topics: a blank line, as between the paragraphs within one.
SEPARATOR = b"\n\n"


@dataclasses.dataclass(frozen=True)
class Data:
    """The training and held-out text.

    Attributes:
      train: ``uint8[n]``, the training topics' bytes, joined.
      eval: ``uint8[m]``, the held-out topics' bytes, joined.
      train_topics: names of the training topics.
      eval_topics: names of the held-out topics.
      eval_chars_per_byte: characters over bytes of the held-out text.
    """

    train: np.ndarray
    eval: np.ndarray
    train_topics: tuple[str, ...]
    eval_topics: tuple[str, ...]
    eval_chars_per_byte: float


def held_out_topics(topics: dict[str, str], fraction: float) -> tuple[str, ...]:
    """The topics held out: in the order of the CRC-32 of their names, the first ones
    whose text together reaches ``fraction`` of all characters (the same topics on
    every machine for one Python version)."""
    total = sum(len(text) for text in topics.values())
    chosen: list[str] = []
    size = 0
    for name in sorted(topics, key=lambda n: (zlib.crc32(n.encode("utf-8")), n)):
        if size >= fraction * total:
            break
        chosen.append(name)
        size += len(topics[name])
    return tuple(sorted(chosen))


def load(config: ml_collections.ConfigDict) -> Data:
    """The topics of ``pydoc_data.topics``, split by topic into training and held-out text.

    Raises:
      DataError: ``pydoc_data`` is missing (some trimmed Python installs drop it),
        or the split leaves either side shorter than one window.
      DropmaskValueError: a config entry out of range (checked here, the first thing
        a run does with its config).
    """
    check_config(
        config,
        at_least={
            "context": 2,
            "batch_size": 1,
            "depth": 1,
            "heads": 1,
            "mlp_ratio": 1,
            "token_drop_ends": 0,
            "attention_block": 0,
            "eval_windows": 0,
        },
        in_range={"eval_fraction": (0.0, 1.0)},
        below={"token_drop": (0.0, 1.0)},
        positive=["learning_rate"],
        choices={
            "attention": ("dropmask", "flax"),
            "attention_algorithm": ("blockwise", "auto", "dense", "pallas"),
        },
    )
    if config.token_drop and config.depth <= 2 * config.token_drop_ends:
        raise DropmaskValueError(
            f"config.token_drop_ends must leave a block between the ends that drops tokens, "
            f"got token_drop_ends={config.token_drop_ends} with depth={config.depth}. Set "
            f"--config.token_drop_ends below depth / 2, or --config.token_drop=0."
        )
    if config.width % config.heads:
        raise DataError(
            f"config.width must be a multiple of config.heads, got width={config.width} and "
            f"heads={config.heads}. Change one of them."
        )
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise DataError(
            "lm: the text is Python's pydoc_data.topics, which this Python install lacks. "
            "Use a full CPython install (the python.org or distribution package)."
        ) from None
    names = sorted(topics)
    eval_names = held_out_topics(topics, config.eval_fraction)
    train_names = tuple(n for n in names if n not in eval_names)
    train_text = "\n\n".join(topics[n] for n in train_names)
    eval_text = "\n\n".join(topics[n] for n in eval_names)
    train = np.frombuffer(train_text.encode("utf-8"), np.uint8)
    held = np.frombuffer(eval_text.encode("utf-8"), np.uint8)
    for what, part in (("training", train), ("held-out", held)):
        if len(part) < config.context + 1:
            raise DataError(
                f"lm: the {what} text has {len(part)} bytes, fewer than one window of "
                f"context + 1 = {config.context + 1}. Lower config.context or change "
                f"config.eval_fraction={config.eval_fraction}."
            )
    return Data(train, held, train_names, eval_names, len(eval_text) / len(held))


@functools.partial(jax.jit, static_argnames=("batch_size", "limit"))
def _starts(data_key: jax.Array, step: jax.Array, batch_size: int, limit: int) -> jax.Array:
    return jax.random.randint(jax.random.fold_in(data_key, step), (batch_size,), 0, limit)


def train_batch(
    config: ml_collections.ConfigDict, data: Data, data_key: jax.Array, step: int
) -> dict[str, np.ndarray]:
    """``{'tokens': int32[batch_size, context + 1]}``: the windows of ``step``."""
    limit = len(data.train) - config.context
    starts = np.asarray(_starts(data_key, jnp.int32(step), config.batch_size, limit), np.int64)
    index: np.ndarray = starts[:, None] + np.arange(int(config.context) + 1)
    return {"tokens": data.train[index].astype(np.int32)}


def position(config: ml_collections.ConfigDict, data: Data, step: int) -> dict[str, int]:
    """What the batches of ``step`` depend on besides the key: the texts' sizes."""
    del config, step
    return {"train_bytes": len(data.train), "eval_bytes": len(data.eval)}


def windows(text: np.ndarray, context: int, limit: int = 0) -> np.ndarray:
    """``text`` cut into windows of ``context + 1`` bytes that overlap by one.

    Window ``i`` predicts bytes ``i * context + 1 .. (i + 1) * context`` from those
    before them in the window; the last, partial window is padded with ``-1`` labels
    (not scored). Together they score every byte but the first exactly once.

    Args:
      text: ``uint8[n]``.
      context: the model's context.
      limit: keep the first ``limit`` windows (0: all).

    Returns:
      ``int32[windows, context + 1]``; ``-1`` marks padding.
    """
    count = -(-(len(text) - 1) // context)
    if limit:
        count = min(count, limit)
    out = np.full((count, context + 1), -1, np.int32)
    for i in range(count):
        piece = text[i * context : i * context + context + 1]
        out[i, : len(piece)] = piece
    return out


def split_windows(config: ml_collections.ConfigDict, data: Data, split: str) -> np.ndarray:
    """The windows evaluated for ``split``: the held-out text (``'eval'``) or as many
    windows of the training text (``'train_eval'``), for the generalization gap."""
    held = windows(data.eval, config.context, config.eval_windows)
    if split == "eval":
        return held
    return windows(data.train, config.context, len(held))
