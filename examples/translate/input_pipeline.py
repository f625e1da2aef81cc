"""Sentence pairs, a SentencePiece tokenizer, packed training rows and held-out splits.

With ``config.src`` and ``config.tgt`` set, aligned parallel files are read (one
sentence a line, line ``i`` of one translating line ``i`` of the other). Without them
the pairs come from :mod:`corpus`, generated from ``data_seed``. Either way a
held-out set of ``eval_size`` pairs whose source sentences never occur in training
is set aside first, and one SentencePiece model is trained on the training text of
both languages, so that it sees nothing of the held-out set.

Training pairs are packed into rows of ``max_len`` tokens, as Flax's WMT pipeline
does: each row holds several pairs one after another, told apart by segment ids
(1, 2, ... and 0 for padding) and positions that restart at 0 for every pair. The
rows are packed once; epoch ``e`` visits them in the order ``fold_in(data_key, e)``
draws, so the batch of a step depends only on the data, the data key and the step.
Since attention never crosses a segment, a pair's loss does not depend on the
other pairs in its row.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np
import sentencepiece as spm

import dropmask
from dropmask.training import DataError, check_config, epoch_batch, epoch_position

from . import corpus

PAD, EOS, BOS, UNK = 0, 1, 2, 3
BATCH_KEYS = (
    "inputs",
    "targets_in",
    "targets",
    "inputs_segmentation",
    "targets_segmentation",
    "inputs_position",
    "targets_position",
)


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """A SentencePiece model shared by both languages (ids: pad 0, eos 1, bos 2, unk 3).

    Attributes:
      model: the serialized SentencePiece model.
    """

    model: bytes
    processor: spm.SentencePieceProcessor = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "processor", spm.SentencePieceProcessor(model_proto=self.model))

    @property
    def vocab_size(self) -> int:
        return int(self.processor.get_piece_size())

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of each text, without ``<bos>`` or ``<eos>``."""
        return [list(ids) for ids in self.processor.encode(list(texts))]

    def decode(self, rows: np.ndarray) -> list[str]:
        """Texts of ``int[n, len]`` id rows, each read up to its first ``<eos>``."""
        texts = []
        for row in np.asarray(rows).tolist():
            row = row[: row.index(EOS)] if EOS in row else row
            texts.append(self.processor.decode([i for i in row if i > UNK]))
        return texts


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """Trains a unigram SentencePiece model on ``texts``, in memory and single-threaded.

    One thread and no sampling of the input keep the model a function of ``texts``.
    ``vocab_size`` is an upper bound: a small corpus may yield fewer pieces.
    """
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=PAD,
        eos_id=EOS,
        bos_id=BOS,
        unk_id=UNK,
        hard_vocab_limit=False,
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        minloglevel=2,
    )
    return Tokenizer(buffer.getvalue())


def _read_lines(path: pathlib.Path, entry: str, other: pathlib.Path) -> list[str]:
    if not path.is_file():
        raise DataError(
            f"{path}: no such file (config.{entry}). Give a text file, one sentence a line."
        )
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}).") from None
    if not lines:
        raise DataError(
            f"{path}: the file is empty; expected one sentence a line, aligned with {other}."
        )
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise DataError(
                f"{path}:{i}: empty line; every line must hold a sentence, the translation "
                f"of line {i} of {other}. Remove the pair from both files."
            )
    return lines


def read_parallel(src: str | pathlib.Path, tgt: str | pathlib.Path) -> list[tuple[str, str]]:
    """Reads aligned parallel files: line ``i`` of ``tgt`` translates line ``i`` of ``src``.

    Args:
      src: source-language text file (UTF-8), one sentence a line.
      tgt: target-language text file, with as many lines.

    Returns:
      ``[(source, target), ...]`` in file order.

    Raises:
      DataError: a missing, unreadable or empty file, an empty line, or files with
        different numbers of lines; the message names the file and the line.
    """
    src, tgt = pathlib.Path(src), pathlib.Path(tgt)
    sources = _read_lines(src, "src", tgt)
    targets = _read_lines(tgt, "tgt", src)
    if len(sources) != len(targets):
        longer = src if len(sources) > len(targets) else tgt
        n = min(len(sources), len(targets))
        raise DataError(
            f"{src} has {len(sources)} lines but {tgt} has {len(targets)}: "
            f"{longer}:{n + 1} has no translation. Parallel files must be aligned, one "
            f"sentence a line."
        )
    return list(zip(sources, targets, strict=True))


@dataclasses.dataclass(frozen=True)
class Split:
    """Unpacked sentence pairs, one a row, in the batch layout of the packed rows.

    Every row holds a single segment (id 1), so the model reads both layouts alike.
    Rows past ``size`` are empty padding that fills the last ``eval_batch_size`` batch.
    """

    sources: tuple[str, ...]
    references: tuple[str, ...]
    batch: dict[str, np.ndarray]

    @property
    def size(self) -> int:
        return len(self.sources)

    def batches(self, batch_size: int) -> list[dict[str, np.ndarray]]:
        rows = self.batch["inputs"].shape[0]
        return [
            {k: v[i : i + batch_size] for k, v in self.batch.items()}
            for i in range(0, rows, batch_size)
        ]


@dataclasses.dataclass(frozen=True)
class Data:
    """Everything a run reads: tokenizer, packed training rows, held-out splits.

    Attributes:
      tokenizer: trained on the training pairs only.
      train: packed rows, ``{name: int32[rows, max_len]}`` for each of ``BATCH_KEYS``.
      train_pairs: number of training pairs packed into ``train``.
      eval: the held-out pairs.
      train_eval: a sample of training pairs of the same size, scored the same way.
    """

    tokenizer: Tokenizer
    train: dict[str, np.ndarray]
    train_pairs: int
    eval: Split
    train_eval: Split


def _encode_pairs(
    tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]], max_len: int, where: Sequence[str]
) -> list[np.ndarray]:
    """Each pair as ``int32[length, 3]``: source, ``<bos>`` + target, target + ``<eos>``."""
    sources = tokenizer.encode([s for s, _ in pairs])
    targets = tokenizer.encode([t for _, t in pairs])
    out = []
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        length = max(len(s), len(t) + 1)
        if length > max_len:
            raise DataError(
                f"{where[i]}: the pair has {len(s)} source and {len(t) + 1} target tokens, "
                f"more than config.max_len={max_len}. Raise max_len or shorten the sentence."
            )
        row = np.full((length, 3), PAD, dtype=np.int32)
        row[: len(s), 0] = s
        row[: len(t) + 1, 1] = [BOS, *t]
        row[: len(t) + 1, 2] = [*t, EOS]
        out.append(row)
    return out


def _layout(values: np.ndarray, segment_ids: np.ndarray, positions: np.ndarray) -> dict:
    """Splits ``[rows, len, 3]`` into the batch keys; padding gets segment 0."""
    inputs, targets_in, targets = values[..., 0], values[..., 1], values[..., 2]
    src_valid, tgt_valid = inputs != PAD, targets != PAD
    return {
        "inputs": inputs,
        "targets_in": targets_in,
        "targets": targets,
        "inputs_segmentation": np.where(src_valid, segment_ids, 0).astype(np.int32),
        "targets_segmentation": np.where(tgt_valid, segment_ids, 0).astype(np.int32),
        "inputs_position": np.where(src_valid, positions, 0).astype(np.int32),
        "targets_position": np.where(tgt_valid, positions, 0).astype(np.int32),
    }


def make_split(
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    where: Sequence[str],
    max_len: int,
    batch_size: int,
) -> Split:
    """Pairs as unpacked rows, padded to a multiple of ``batch_size`` with empty rows."""
    rows = _encode_pairs(tokenizer, pairs, max_len, where)
    total = -(-len(rows) // batch_size) * batch_size
    rows += [np.zeros((0, 3), np.int32)] * (total - len(rows))
    # Padded to the split's longest pair (a multiple of 8), not to max_len: shorter rows
    # make the teacher-forced evaluation cheaper.
    values, _ = dropmask.pad_sequences(rows, multiple_of=8, pad_value=PAD)
    # One segment per non-empty row, over the source and the target alike: a source
    # longer than its target keeps every token.
    segment_ids = (values != PAD).any(-1).astype(np.int32)
    positions = np.broadcast_to(np.arange(values.shape[1], dtype=np.int32), segment_ids.shape)
    return Split(
        tuple(s for s, _ in pairs),
        tuple(t for _, t in pairs),
        _layout(values, segment_ids, positions),
    )


def _pairs(config: ml_collections.ConfigDict) -> tuple[list[tuple[str, str]], list[str]]:
    """All pairs and where each comes from (``file:line`` or ``corpus pair i``)."""
    if bool(config.src) != bool(config.tgt):
        raise DataError(
            f"config.src={config.src!r} and config.tgt={config.tgt!r}: give both parallel "
            f"files, or neither for the generated corpus."
        )
    if config.src:
        pairs = read_parallel(config.src, config.tgt)
        return pairs, [f"{config.src}:{i}" for i in range(1, len(pairs) + 1)]
    count = int(config.train_size) + int(config.eval_size)
    pairs = corpus.generate_pairs(int(config.data_seed), count)
    return pairs, [f"corpus pair {i} (data_seed={config.data_seed})" for i in range(count)]


def load(config: ml_collections.ConfigDict) -> Data:
    """Reads or generates the pairs, holds out ``eval_size``, tokenizes and packs.

    Raises:
      DropmaskValueError: a width, size or count below 1, a negative seed or
        schedule length, a ``learning_rate`` <= 0, a ``beam_alpha`` outside [0, 10]
        or an unknown ``attention_algorithm`` (checked before any data).
      DataError: bad parallel files (see :func:`read_parallel`), a held-out set as
        large as the data, a pair longer than ``max_len``, or fewer packed rows than
        ``batch_size``.
    """
    check_config(
        config,
        widths=["emb_dim", "num_heads", "num_layers", "qkv_dim", "mlp_dim"],
        at_least={"data_seed": 0, "warmup_steps": 0, "decay_steps": 0, "max_len": 1}
        | {"eval_size": 1, "batch_size": 1, "beam_size": 1, "eval_batch_size": 1},
        in_range={"beam_alpha": (0.0, 10.0)},
        positive=["learning_rate"],
        choices={"attention_algorithm": ("auto", "dense", "blockwise", "pallas")},
    )
    pairs, where = _pairs(config)
    eval_size = int(config.eval_size)
    order = np.random.default_rng(int(config.data_seed)).permutation(len(pairs))
    held_out, seen = [], set()
    for i in order:
        if len(held_out) == eval_size:
            break
        if pairs[i][0] not in seen:
            seen.add(pairs[i][0])
            held_out.append(int(i))
    train_index = [i for i in range(len(pairs)) if pairs[i][0] not in seen]
    if len(held_out) < eval_size or not train_index:
        raise DataError(
            f"config.eval_size={eval_size}: the data has {len({p for p, _ in pairs})} "
            f"distinct source sentences, too few to hold out {eval_size} and train on the "
            f"rest. Lower eval_size."
        )
    train_pairs = [pairs[i] for i in train_index]
    tokenizer = train_tokenizer(
        [s for s, _ in train_pairs] + [t for _, t in train_pairs], int(config.vocab_size)
    )
    max_len = int(config.max_len)
    rows = _encode_pairs(tokenizer, train_pairs, max_len, [where[i] for i in train_index])
    packed = dropmask.pack_sequences(rows, max_len=max_len, pad_value=PAD)
    train = _layout(packed.values, packed.segment_ids, packed.positions)
    if train["inputs"].shape[0] < int(config.batch_size):
        raise DataError(
            f"config.batch_size={config.batch_size}: the training pairs pack into only "
            f"{train['inputs'].shape[0]} rows of max_len={max_len}. Lower batch_size."
        )
    sample = np.random.default_rng(int(config.data_seed) + 1).choice(
        len(train_index), size=min(eval_size, len(train_index)), replace=False
    )
    batch_size = int(config.eval_batch_size)
    return Data(
        tokenizer=tokenizer,
        train=train,
        train_pairs=len(train_pairs),
        eval=make_split(
            tokenizer,
            [pairs[i] for i in held_out],
            [where[i] for i in held_out],
            max_len,
            batch_size,
        ),
        train_eval=make_split(
            tokenizer,
            [train_pairs[i] for i in sample],
            [where[train_index[i]] for i in sample],
            max_len,
            batch_size,
        ),
    )


def train_batch(
    config: ml_collections.ConfigDict, data: Data, data_key: jax.Array, step: int
) -> dict[str, np.ndarray]:
    """The ``batch_size`` packed rows of ``step``: ``{name: int32[batch_size, max_len]}``."""
    rows = data.train["inputs"].shape[0]
    index = epoch_batch(data_key, step, num_examples=rows, batch_size=int(config.batch_size))
    return {k: v[index] for k, v in data.train.items()}


def position(config: ml_collections.ConfigDict, data: Data, step: int) -> dict[str, int]:
    """The epoch and batch of ``step``, and the sizes that fix the data."""
    rows = int(data.train["inputs"].shape[0])
    return {
        **epoch_position(step, num_examples=rows, batch_size=int(config.batch_size)),
        "train_pairs": data.train_pairs,
        "vocab_size": data.tokenizer.vocab_size,
    }
