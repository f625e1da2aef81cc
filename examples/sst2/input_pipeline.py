"""Sentences and labels: the GLUE SST-2 files, or a generated corpus where order matters.

With ``config.data_dir`` set, ``train.tsv`` and ``dev.tsv`` there are read in the GLUE
SST-2 layout (a header ``sentence<TAB>label``, then one sentence and a 0/1 label per
line). Without it, a corpus is generated from ``data_seed``: short reviews whose
sentiment depends on word order ("good but boring" is negative, "boring but good"
positive, "not bad" positive), so that a bag of words cannot solve it. Its held-out
split holds sentences that never occur in training, built from pairings of words and
constructions that training never shows (see :func:`generate`).

The batch of step ``s`` depends only on the data, the data key and ``s``: epochs
are shuffled by :func:`dropmask.training.epoch_batch`. Each batch is
padded to the smallest of a few bucket lengths that fits it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import jax
import ml_collections
import numpy as np

import dropmask
from dropmask.training import DataError, check_config, epoch_batch, epoch_position

PAD, UNK = 0, 1
GLUE_URL = "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"
_TOKEN = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")

_POSITIVE = (
    "good",
    "great",
    "fun",
    "moving",
    "clever",
    "charming",
    "brilliant",
    "delightful",
    "witty",
    "gripping",
    "superb",
    "touching",
    "smart",
    "lovely",
    "fresh",
    "stunning",
)
_NEGATIVE = (
    "bad",
    "dull",
    "boring",
    "awful",
    "weak",
    "clumsy",
    "tedious",
    "bland",
    "silly",
    "messy",
    "flat",
    "stale",
    "shallow",
    "lame",
    "sloppy",
    "tired",
)
_SUBJECTS = (
    "the movie",
    "the film",
    "the plot",
    "the acting",
    "this story",
    "the cast",
    "the script",
    "the ending",
    "the music",
    "the pacing",
)
_ADVERBS = ("", "very ", "really ", "quite ", "truly ")


def tokenize(sentence: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``sentence``."""
    return _TOKEN.findall(sentence.lower())


@dataclasses.dataclass(frozen=True)
class Split:
    """Token ids of one split: ``tokens[i]`` is an ``int32[length_i]`` array."""

    tokens: list[np.ndarray]
    label: np.ndarray  # int32[n], 1 positive

    def __len__(self) -> int:
        return len(self.label)


@dataclasses.dataclass(frozen=True)
class Data:
    """Both splits, the vocabulary (``<pad>`` 0, ``<unk>`` 1) and the bucket lengths."""

    train: Split
    dev: Split
    vocab: tuple[str, ...]
    buckets: tuple[int, ...]


def _review(rng: np.random.Generator) -> tuple[str, int, set[tuple[int, str]]]:
    """A generated review, its label and its ``(template, adjective)`` pairs.

    The templates make order matter: negation flips an adjective, and in a contrast
    the clause after "but" decides.
    """
    subject = _SUBJECTS[rng.integers(len(_SUBJECTS))]
    good = bool(rng.integers(2))
    kind = int(rng.integers(5))
    used: set[tuple[int, str]] = set()

    def adjective(positive: bool) -> str:
        words = _POSITIVE if positive else _NEGATIVE
        word = words[rng.integers(len(words))]
        used.add((kind, word))
        return _ADVERBS[rng.integers(len(_ADVERBS))] + word

    if kind == 0:  # plain
        text, label = f"{subject} is {adjective(good)}", good
    elif kind == 1:  # negation flips
        text, label = f"{subject} is not {adjective(not good)}", good
    elif kind == 2:  # contrast: the clause after "but" decides
        text, label = f"{subject} is {adjective(not good)} but {adjective(good)}", good
    elif kind == 3:  # concession: the main clause decides
        text, label = f"although {subject} is {adjective(not good)} , it is {adjective(good)}", good
    else:  # negation inside a contrast
        text, label = f"{subject} is not {adjective(good)} but {adjective(not good)}", not good
    return text, int(label), used


def generate(seed: int, train_size: int, dev_size: int) -> tuple[list, list]:
    """``(train, dev)`` lists of ``(sentence, label)`` that test composition.

    Every adjective occurs plainly in training ("the plot is dull"), but for each
    of the four compositional templates (negation, contrast, concession, negated
    contrast) half of the adjectives, drawn from ``seed``, never occur in it in
    training. Every dev sentence uses at least one such unseen pairing, so the model
    must apply "not" and "but" to words it has seen only in other constructions.
    """
    words = _POSITIVE + _NEGATIVE
    pick = np.random.default_rng([seed, 3])
    held = {
        (kind, words[i])
        for kind in range(1, 5)
        for i in pick.permutation(len(words))[: len(words) // 2]
    }
    rng = np.random.default_rng([seed, 2])
    train: dict[str, int] = {}
    dev: dict[str, int] = {}
    while len(train) < train_size or len(dev) < dev_size:
        sentence, label, used = _review(rng)
        target = dev if used & held else train
        if len(target) < (dev_size if target is dev else train_size):
            target.setdefault(sentence, label)
    return list(train.items()), list(dev.items())


def read_tsv(path: pathlib.Path) -> list[tuple[str, int]]:
    """``(sentence, label)`` rows of a GLUE SST-2 ``.tsv`` file.

    Raises:
      DataError: a missing or empty file, bytes that are not UTF-8, a wrong header,
        or a row without a 0/1 label, naming the file and line.
    """
    if not path.is_file():
        raise DataError(f"{path}: no such file. The SST-2 layout is described at {GLUE_URL}.")
    raw = path.read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{path}:{line}: byte {error.start} (0x{raw[error.start]:02x}) is not UTF-8, the "
            f"encoding of SST-2 files. Convert the file, e.g. iconv -f latin1 -t utf-8."
        ) from None
    if not lines:
        raise DataError(f"{path}: the file is empty; expected a header 'sentence\\tlabel'.")
    if lines[0].split("\t")[:2] != ["sentence", "label"]:
        raise DataError(f"{path}:1: expected the header 'sentence\\tlabel', got {lines[0]!r}.")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 2 or parts[1].strip() not in ("0", "1"):
            raise DataError(
                f"{path}:{number}: expected 'sentence<TAB>label' with label 0 or 1, got {line!r}."
            )
        rows.append((parts[0], int(parts[1])))
    if not rows:
        raise DataError(f"{path}: the file has a header but no rows.")
    return rows


def _encode(rows: list, ids: dict[str, int]) -> Split:
    tokens = [np.array([ids.get(w, UNK) for w in tokenize(s)] or [UNK], np.int32) for s, _ in rows]
    return Split(tokens, np.array([label for _, label in rows], np.int32))


def load(config: ml_collections.ConfigDict) -> Data:
    """The two splits as token ids, with the vocabulary of the training split.

    Raises:
      DropmaskValueError: an ``embed_dim`` or ``hidden`` below 1, or a
        ``learning_rate`` <= 0 (checked before any data or model).
      DataError: a ``data_dir`` that is not a directory or lacks a file (one line
        says what is expected and where to get it), bad rows, or a ``batch_size``
        larger than the training split.
    """
    check_config(config, widths=["embed_dim", "hidden"], positive=["learning_rate"])
    if config.data_dir:
        root = pathlib.Path(config.data_dir)
        if not root.is_dir():
            raise DataError(
                f"data_dir {root} is not a directory. Expected GLUE SST-2's train.tsv and "
                f"dev.tsv there (from {GLUE_URL}), or leave data_dir empty for the "
                "generated corpus."
            )
        train_rows, dev_rows = read_tsv(root / "train.tsv"), read_tsv(root / "dev.tsv")
    else:
        train_rows, dev_rows = generate(config.data_seed, config.train_size, config.dev_size)
    if not 0 < config.batch_size <= len(train_rows):
        raise DataError(
            f"batch_size must be in [1, {len(train_rows)}] (the training rows), got "
            f"{config.batch_size}. Set --config.batch_size."
        )
    words = sorted({w for s, _ in train_rows for w in tokenize(s)})
    vocab = ("<pad>", "<unk>", *words)
    ids = {w: i for i, w in enumerate(vocab)}
    train, dev = _encode(train_rows, ids), _encode(dev_rows, ids)
    lengths = [len(t) for t in train.tokens]
    buckets = tuple(int(b) for b in dropmask.bucket_boundaries(lengths, 4, multiple_of=8))
    return Data(train, dev, vocab, buckets)


def pad(split: Split, index: np.ndarray, buckets: tuple[int, ...]) -> dict[str, np.ndarray]:
    """``{'tokens': int32[b, bucket], 'length': int32[b], 'label': int32[b]}`` of ``index``."""
    tokens, length = dropmask.pad_to_bucket(
        [split.tokens[i] for i in index], buckets, pad_value=PAD, truncate="right"
    )
    return {"tokens": tokens, "length": length, "label": split.label[index]}


def train_batch(
    config: ml_collections.ConfigDict, data: Data, data_key: jax.Array, step: int
) -> dict[str, np.ndarray]:
    """The training batch of ``step`` (see :func:`pad`)."""
    index = epoch_batch(data_key, step, num_examples=len(data.train), batch_size=config.batch_size)
    return pad(data.train, index, data.buckets)


def position(config: ml_collections.ConfigDict, data: Data, step: int) -> dict[str, int]:
    """The epoch and batch of ``step``."""
    return epoch_position(step, num_examples=len(data.train), batch_size=config.batch_size)


def split_batch(config: ml_collections.ConfigDict, data: Data, split: str) -> dict[str, np.ndarray]:
    """The held-out split (``'eval'``) or the training split as one batch, padded to the
    smallest bucket that holds its longest sentence."""
    del config
    part = data.dev if split == "eval" else data.train
    longest = max(len(t) for t in part.tokens)
    buckets = tuple(b for b in data.buckets if b >= longest) or (longest,)
    return pad(part, np.arange(len(part)), buckets[:1])
