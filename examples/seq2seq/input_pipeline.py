"""Addition problems as character sequences, generated on the fly from a fixed seed.

A problem ``"123+45"`` has the answer ``"168"``. Operands have 1 to ``max_digits``
digits (the number of digits drawn uniformly, then the value), so inputs have
variable length and come right-padded with ``lengths``. A fixed set of
``eval_size`` problems, drawn once from ``data_seed``, is held out: training batches
never contain one of them. The batch of step ``s`` depends only on the data key and
``s``, so a resumed run sees the batches an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np

from dropmask.training import DataError, check_config

PAD, EOS, GO = 0, 1, 2
_CHARS = "0123456789+"
# Token ids: 0 pad, 1 end of answer, 2 start of decoding, then the characters.
VOCAB = ("<pad>", "<eos>", "<go>", *_CHARS)
_ID = {c: i for i, c in enumerate(VOCAB)}


@dataclasses.dataclass(frozen=True)
class Problems:
    """Encoded problems.

    Attributes:
      query: ``int32[n, 2 * max_digits + 1]`` the characters of ``"a+b"``, right-padded.
      query_length: ``int32[n]`` valid characters of each query.
      answer: ``int32[n, max_digits + 2]`` the digits of ``a + b`` then ``<eos>``,
        right-padded.
      answer_length: ``int32[n]`` valid tokens of each answer, ``<eos>`` included.
    """

    query: np.ndarray
    query_length: np.ndarray
    answer: np.ndarray
    answer_length: np.ndarray

    def __len__(self) -> int:
        return len(self.query)

    def as_batch(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class Data:
    """The held-out problems and a fixed sample of training problems to score."""

    max_digits: int
    held_out_ids: np.ndarray  # sorted problem ids a * 10**max_digits + b
    eval: Problems
    train_eval: Problems


def encode(a: np.ndarray, b: np.ndarray, max_digits: int) -> Problems:
    """Encodes the problems ``a[i] + b[i]`` (non-negative ints below ``10**max_digits``)."""
    n = len(a)
    query = np.zeros((n, 2 * max_digits + 1), np.int32)
    answer = np.zeros((n, max_digits + 2), np.int32)
    query_length = np.zeros(n, np.int32)
    answer_length = np.zeros(n, np.int32)
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        q, s = f"{x}+{y}", str(x + y)
        query[i, : len(q)] = [_ID[c] for c in q]
        answer[i, : len(s)] = [_ID[c] for c in s]
        answer[i, len(s)] = EOS
        query_length[i], answer_length[i] = len(q), len(s) + 1
    return Problems(query, query_length, answer, answer_length)


def decode(tokens: np.ndarray) -> str:
    """The characters of ``tokens`` up to the first ``<eos>`` (pads and ``<go>`` dropped)."""
    out = []
    for t in np.asarray(tokens).tolist():
        if t == EOS:
            break
        if t > GO:
            out.append(VOCAB[t])
    return "".join(out)


def _draw(rng: np.random.Generator, n: int, max_digits: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` problems, each operand's digit count uniform in ``[1, max_digits]``."""

    def operand() -> np.ndarray:
        digits = rng.integers(1, max_digits + 1, n)
        low = np.where(digits == 1, 0, 10 ** (digits - 1))
        return rng.integers(low, 10**digits)

    return operand(), operand()


def _ids(a: np.ndarray, b: np.ndarray, max_digits: int) -> np.ndarray:
    return a.astype(np.int64) * 10**max_digits + b


def load(config: ml_collections.ConfigDict) -> Data:
    """The held-out set and a training sample, drawn from ``config.data_seed``.

    Raises:
      DropmaskValueError: a width or ``batch_size`` below 1, ``max_digits`` outside
        ``[1, 6]``, a negative ``warmup_steps`` or ``decay_steps``, or a
        ``learning_rate`` <= 0 (checked before any data or model).
      DataError: more held-out problems than half of all problems.
    """
    check_config(
        config,
        widths=["embed_dim", "hidden"],
        at_least={"batch_size": 1, "warmup_steps": 0, "decay_steps": 0},
        in_range={"max_digits": (1, 6)},
        positive=["learning_rate"],
    )
    max_digits = int(config.max_digits)
    total = 10 ** (2 * max_digits)
    if not 0 < config.eval_size <= total // 2:
        raise DataError(
            f"eval_size must be in [1, {total // 2}] for max_digits={max_digits}, got "
            f"{config.eval_size}. Set --config.eval_size."
        )
    rng = np.random.default_rng([config.data_seed, 0])
    held_out: set[int] = set()
    a_parts, b_parts = [], []
    while len(held_out) < config.eval_size:
        a, b = _draw(rng, config.eval_size, max_digits)
        for x, y, i in zip(a, b, _ids(a, b, max_digits), strict=True):
            if len(held_out) < config.eval_size and int(i) not in held_out:
                held_out.add(int(i))
                a_parts.append(x)
                b_parts.append(y)
    held_out_ids = np.array(sorted(held_out), np.int64)
    a, b = np.array(a_parts), np.array(b_parts)
    train_a, train_b = _training_problems(
        np.random.default_rng([config.data_seed, 1]), config.eval_size, max_digits, held_out_ids
    )
    return Data(
        max_digits=max_digits,
        held_out_ids=held_out_ids,
        eval=encode(a, b, max_digits),
        train_eval=encode(train_a, train_b, max_digits),
    )


def _training_problems(
    rng: np.random.Generator, n: int, max_digits: int, held_out_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` problems none of which is held out (redrawn until there are enough)."""
    a_out, b_out = np.zeros(0, np.int64), np.zeros(0, np.int64)
    while len(a_out) < n:
        a, b = _draw(rng, 2 * n, max_digits)
        keep = ~np.isin(_ids(a, b, max_digits), held_out_ids)
        a_out, b_out = np.concatenate([a_out, a[keep]]), np.concatenate([b_out, b[keep]])
    return a_out[:n], b_out[:n]


def train_batch(
    config: ml_collections.ConfigDict, data: Data, data_key: jax.Array, step: int
) -> dict[str, np.ndarray]:
    """The training batch of ``step``: fresh problems, none of them held out.

    Returns:
      ``{'query', 'query_length', 'answer', 'answer_length'}`` as in :class:`Problems`,
      each with ``config.batch_size`` rows.
    """
    seed = np.asarray(jax.random.key_data(jax.random.fold_in(data_key, step))).tolist()
    rng = np.random.default_rng(seed)
    a, b = _training_problems(rng, config.batch_size, data.max_digits, data.held_out_ids)
    return encode(a, b, data.max_digits).as_batch()
