"""Host-side padding, bucketing and packing: NumPy, run before ``jit``.

Every function takes a list of arrays ``[length_i, *inner]`` (the inner shape is
shared) and returns NumPy arrays. Three ways to batch variable-length data:

* :func:`pad_sequences` pads to one length (the longest, or ``max_len``).
* :func:`pad_to_bucket` / :func:`bucket_by_length` pad to the smallest of a few
  fixed lengths, so a jitted step compiles at most ``len(buckets)`` shapes.
* :func:`pack_sequences` concatenates short sequences into fixed-length rows with
  ``segment_ids`` (1, 2, ...; 0 = padding) and per-segment ``positions``, for
  :func:`dropmask.segment_mask`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from ._checks import check_choice, check_int, check_scalar
from ._errors import DropmaskTypeError, DropmaskValueError, user_error

__all__ = [
    "BucketBatch",
    "Packed",
    "bucket_boundaries",
    "bucket_by_length",
    "pack_sequences",
    "pad_sequences",
    "pad_to_bucket",
    "unpack_sequences",
]

Side = Literal["right", "left"]


# ----------------------------------------------------------------- validation


def _check_choice(value: Any, name: str, caller: str, *, allow_none: bool) -> None:
    choices: tuple[Any, ...] = ("right", "left") + ((None,) if allow_none else ())
    check_choice(value, choices, caller=caller, name=name)


class _Layout:
    """The shared inner shape of a stream of sequences, checked one by one.

    An empty 1-D sequence (``[]``) fits any inner shape.
    """

    def __init__(self, caller: str) -> None:
        self.caller = caller
        self.inner: tuple[int, ...] | None = None
        self.first = -1

    def add(self, index: int, seq: Any) -> np.ndarray:
        a = _as_numeric(seq, index, self.caller)
        if a.ndim == 0:
            raise user_error(
                DropmaskValueError,
                f"sequence {index} is a scalar; each sequence must be an array [length, ...]",
                "Wrap single values in a list.",
                caller=self.caller,
            )
        if a.shape == (0,):
            return a
        if self.inner is None:
            self.inner, self.first = a.shape[1:], index
        elif a.shape[1:] != self.inner:
            raise user_error(
                DropmaskValueError,
                f"sequence {index} has inner shape {a.shape[1:]} but sequence {self.first} has "
                f"{self.inner}; every sequence must be [length, *inner] with the same inner shape",
                caller=self.caller,
            )
        return a

    def shaped(self, a: np.ndarray) -> np.ndarray:
        return a.reshape((0, *(self.inner or ()))) if a.shape == (0,) else a


_NUMERIC_KINDS = "biufc"


def _as_numeric(seq: Any, index: int, caller: str) -> np.ndarray:
    """``seq`` as a NumPy array of booleans or numbers; names the sequence otherwise."""
    try:
        a = np.asarray(seq)
    except (ValueError, TypeError) as err:
        raise user_error(
            DropmaskTypeError,
            f"sequence {index} is not a rectangular array ({err})",
            "Each sequence must be [length, *inner] with one inner shape for all its steps; pad "
            "or split ragged steps first.",
            caller=caller,
        ) from None
    if a.dtype.kind not in _NUMERIC_KINDS:
        raise user_error(
            DropmaskTypeError,
            f"sequence {index} has dtype {a.dtype}; sequences must hold numbers or booleans (a "
            "list that mixes numbers with strings or None becomes such an array)",
            "Convert it first, e.g. np.asarray(seq, dtype=np.int32).",
            caller=caller,
        )
    return a


def _changed_values(a: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(values, stored)``: the entries of ``a`` that ``dtype`` would change, flat.

    Wrapping, truncating a fraction, rounding an integer, dropping an imaginary part
    or overflowing to inf change a value; rounding a float to the nearest value of a
    narrower float type does not.
    """
    # NumPy calls int64 -> float64 "safe", but 2**53 + 1 does not survive it.
    int_to_float = a.dtype.kind in "iu" and dtype.kind in "fc"
    if a.size == 0 or (np.can_cast(a.dtype, dtype, casting="safe") and not int_to_float):
        return a[:0].ravel(), np.zeros(0, dtype)
    src, lost = a, np.zeros(a.shape, bool)
    if a.dtype.kind == "c" and dtype.kind != "c":
        src, lost = np.real(a), np.imag(a) != 0
    with np.errstate(all="ignore"):
        stored = src.astype(dtype)
        if dtype.kind in "fc" and src.dtype.kind in "fc":
            lost |= np.isfinite(stored) != np.isfinite(src)
        else:  # an integer must survive exactly, into a float or another integer
            lost |= stored.astype(src.dtype) != src
    return a[lost].ravel(), stored[lost].ravel()


def _check_lossless(a: np.ndarray, dtype: np.dtype, index: int, caller: str) -> None:
    changed, stored = _changed_values(a, dtype)
    if changed.size:
        wider = np.result_type(a.dtype, dtype)
        wider = a.dtype if wider == dtype else wider  # int64 with uint64 gives float64
        raise user_error(
            DropmaskValueError,
            f"sequence {index} (dtype {a.dtype}) holds {changed[0].item()!r}, which the batch "
            f"dtype {dtype} cannot store (it would become {stored[0].item()!r})",
            f"Pass dtype={wider.name} (or another dtype that holds it), or convert the sequence "
            "first.",
            caller=caller,
        )


def _collect(
    seqs: Iterable[Any], caller: str, dtype: Any
) -> tuple[list[np.ndarray], np.dtype, tuple]:
    """Validates a finite collection: ``(arrays, dtype, inner shape)``.

    Without ``dtype`` the batch takes the common dtype of the non-empty sequences;
    either way, a sequence whose values the batch dtype would change is an error.
    """
    layout = _Layout(caller)
    arrays = [layout.add(i, s) for i, s in enumerate(seqs)]
    if not arrays:
        raise user_error(
            DropmaskValueError,
            "got no sequences; pass a non-empty list of arrays [length, ...]",
            caller=caller,
        )
    arrays = [layout.shaped(a) for a in arrays]
    # Even the common dtype can round: int64 with uint64 gives float64.
    out_dtype = _common_dtype(arrays) if dtype is None else np.dtype(dtype)
    for i, a in enumerate(arrays):
        _check_lossless(a, out_dtype, i, caller)
    return arrays, out_dtype, layout.inner or ()


def _common_dtype(arrays: Sequence[np.ndarray]) -> np.dtype:
    nonempty = [a for a in arrays if a.shape[0] > 0]
    return np.result_type(*(nonempty or arrays))


def _check_pad_value(pad_value: Any, dtype: np.dtype, caller: str) -> None:
    check_scalar(pad_value, caller=caller, name="pad_value", error=DropmaskValueError)
    value = np.asarray(pad_value)
    if value.dtype.kind not in _NUMERIC_KINDS:
        raise user_error(
            DropmaskTypeError,
            f"pad_value must be a number or a bool, got {pad_value!r}",
            "Pass e.g. pad_value=0.",
            caller=caller,
        )
    if _changed_values(value.reshape(1), dtype)[0].size:
        raise user_error(
            DropmaskValueError,
            f"pad_value={pad_value!r} cannot be stored in dtype {dtype} without changing it",
            "Pick another pad_value or pass dtype=.",
            caller=caller,
        )


def _too_long(lengths: np.ndarray, limit: int, caller: str, what: str) -> None:
    over = np.flatnonzero(lengths > limit)
    if over.size:
        i = int(over[np.argmax(lengths[over])])
        raise user_error(
            DropmaskValueError,
            f"{over.size} sequence(s) are longer than {what}={limit} (the longest, index {i}, "
            f"has length {int(lengths[i])})",
            "Pass truncate='right' (keep the start) or truncate='left' (keep the end), or allow "
            f"a longer {what}.",
            caller=caller,
        )


def _cut(a: np.ndarray, limit: int, truncate: str | None) -> np.ndarray:
    if a.shape[0] <= limit:
        return a
    return a[:limit] if truncate == "right" else a[a.shape[0] - limit :]


# ----------------------------------------------------------------- padding


def pad_sequences(
    seqs: Iterable[Any],
    *,
    pad_value: Any = 0,
    max_len: int | None = None,
    multiple_of: int | None = None,
    side: Side = "right",
    truncate: Side | None = None,
    dtype: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pads sequences to a common length.

    Args:
      seqs: arrays ``[length_i, *inner]`` (lists are fine); lengths may be 0.
      pad_value: scalar written into padding; must fit ``dtype``.
      max_len: padded length; default: the longest sequence.
      multiple_of: round the default length up to a multiple of this (e.g. 8 for
        tensor cores); with ``max_len`` it must divide ``max_len``.
      side: ``"right"`` (padding after the data) or ``"left"``.
      truncate: what to do with sequences longer than ``max_len``: None raises,
        ``"right"`` drops their end, ``"left"`` drops their start.
      dtype: output dtype; default: the common dtype of the non-empty sequences
        (``np.result_type``). Either way it must hold every value: rounding a float
        to a narrower float is allowed; wrapping, truncating, rounding an integer
        (int64 with uint64 gives float64), overflowing to inf or dropping an
        imaginary part is an error naming the sequence.

    Returns:
      ``(padded [batch, length, *inner], lengths int32[batch])``.

    Raises:
      DropmaskValueError: no sequences, mixed inner shapes, a sequence longer than
        ``max_len`` without ``truncate``, a value ``dtype`` cannot hold (naming the
        sequence), or an invalid option.
      DropmaskTypeError: a ragged sequence or one that is not numbers or booleans.

    Example:
      >>> import dropmask
      >>> padded, lengths = dropmask.pad_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9]])
      >>> padded.tolist(), lengths.tolist()
      ([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]], [3, 2, 4])
    """
    caller = "pad_sequences"
    _check_choice(side, "side", caller, allow_none=False)
    _check_choice(truncate, "truncate", caller, allow_none=True)
    if max_len is not None:
        max_len = check_int(max_len, name="max_len", caller=caller, minimum=0, shape=True)
    if multiple_of is not None:
        multiple_of = check_int(
            multiple_of, name="multiple_of", caller=caller, minimum=1, shape=True
        )
        if max_len is not None and max_len % multiple_of:
            raise user_error(
                DropmaskValueError,
                f"max_len={max_len} is not a multiple of multiple_of={multiple_of}; pass max_len="
                f"{math.ceil(max_len / multiple_of) * multiple_of} or drop one of them",
                caller=caller,
            )
    arrays, out_dtype, inner = _collect(seqs, caller, dtype)
    _check_pad_value(pad_value, out_dtype, caller)
    lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    if max_len is None:
        length = int(lengths.max())
        if multiple_of is not None:
            length = math.ceil(length / multiple_of) * multiple_of
    else:
        length = max_len
        if truncate is None:
            _too_long(lengths, length, caller, "max_len")
    return _fill(arrays, length, inner, out_dtype, pad_value, side, truncate)


def _fill(
    arrays: Sequence[np.ndarray],
    length: int,
    inner: tuple,
    dtype: np.dtype,
    pad_value: Any,
    side: str,
    truncate: str | None,
) -> tuple[np.ndarray, np.ndarray]:
    out = np.full((len(arrays), length, *inner), pad_value, dtype=dtype)
    lengths = np.empty(len(arrays), dtype=np.int32)
    for i, a in enumerate(arrays):
        a = _cut(a, length, truncate)
        n = a.shape[0]
        lengths[i] = n
        if side == "right":
            out[i, :n] = a
        else:
            out[i, length - n :] = a
    return out, lengths


# ----------------------------------------------------------------- bucketing


def _check_buckets(buckets: Sequence[int], caller: str) -> tuple[int, ...]:
    out = tuple(
        check_int(b, name="buckets[i]", caller=caller, minimum=1, shape=True) for b in buckets
    )
    if not out or any(a >= b for a, b in zip(out, out[1:], strict=False)):
        raise user_error(
            DropmaskValueError,
            "buckets must be a non-empty, strictly increasing sequence of lengths, got "
            f"{tuple(buckets)!r}",
            caller=caller,
        )
    return out


def bucket_boundaries(
    lengths: Sequence[int] | np.ndarray, num_buckets: int, *, multiple_of: int = 1
) -> tuple[int, ...]:
    """Bucket lengths at quantiles of a dataset's sequence lengths.

    Args:
      lengths: the dataset's sequence lengths (non-negative ints).
      num_buckets: at most this many buckets are returned.
      multiple_of: round every boundary up to a multiple of this.

    Returns:
      Strictly increasing lengths; the last one fits the longest sequence.

    Example:
      >>> import dropmask
      >>> dropmask.bucket_boundaries([3, 5, 9, 17, 30, 31], 3, multiple_of=8)
      (16, 32)
    """
    caller = "bucket_boundaries"
    num_buckets = check_int(num_buckets, name="num_buckets", caller=caller, minimum=1, shape=True)
    multiple_of = check_int(multiple_of, name="multiple_of", caller=caller, minimum=1, shape=True)
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise user_error(
            DropmaskValueError,
            f"lengths must be a non-empty 1-D list of ints, got {arr!r}",
            caller=caller,
        )
    if arr.min() < 0:
        raise user_error(
            DropmaskValueError,
            f"lengths must be >= 0, got {int(arr.min())}",
            caller=caller,
        )
    qs = np.quantile(arr, np.linspace(0, 1, num_buckets + 1)[1:], method="higher")
    rounded = {max(multiple_of, math.ceil(int(q) / multiple_of) * multiple_of) for q in qs}
    return tuple(sorted(rounded))


def pad_to_bucket(
    seqs: Iterable[Any],
    buckets: Sequence[int],
    *,
    pad_value: Any = 0,
    side: Side = "right",
    truncate: Side | None = None,
    dtype: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pads a batch to the smallest bucket length that fits its longest sequence.

    Args:
      seqs: arrays ``[length_i, *inner]``.
      buckets: strictly increasing allowed lengths.
      pad_value, side, dtype: as in :func:`pad_sequences`.
      truncate: for sequences longer than the largest bucket: None raises,
        ``"right"``/``"left"`` cut them to it.

    Returns:
      ``(padded [batch, bucket, *inner], lengths int32[batch])``.

    Example:
      >>> import dropmask
      >>> dropmask.pad_to_bucket([[1, 2, 3], [4]], buckets=(2, 4, 8))[0].shape
      (2, 4)
    """
    caller = "pad_to_bucket"
    buckets = _check_buckets(buckets, caller)
    _check_choice(side, "side", caller, allow_none=False)
    _check_choice(truncate, "truncate", caller, allow_none=True)
    arrays, out_dtype, inner = _collect(seqs, caller, dtype)
    _check_pad_value(pad_value, out_dtype, caller)
    lengths = np.array([a.shape[0] for a in arrays])
    if truncate is None:
        _too_long(lengths, buckets[-1], caller, "the largest bucket")
    longest = int(lengths.max())
    target = next((b for b in buckets if b >= longest), buckets[-1])
    return _fill(arrays, target, inner, out_dtype, pad_value, side, truncate)


class BucketBatch(NamedTuple):
    """A batch from :func:`bucket_by_length`.

    Attributes:
      padded: ``[batch_size, bucket, *inner]``.
      lengths: ``int32[batch_size]``; 0 for filler rows.
      indices: ``int64[batch_size]``: each row's position in the input; -1 for
        filler rows that complete a final, partial batch.

    Example:
      >>> import dropmask
      >>> batch = next(dropmask.bucket_by_length([[1], [2, 3, 4], [5]], (2, 4), batch_size=2))
      >>> batch.padded.tolist(), batch.lengths.tolist(), batch.indices.tolist()
      ([[1, 0], [5, 0]], [1, 1], [0, 2])
    """

    padded: np.ndarray
    lengths: np.ndarray
    indices: np.ndarray


def bucket_by_length(
    seqs: Iterable[Any],
    buckets: Sequence[int],
    batch_size: int,
    *,
    pad_value: Any = 0,
    side: Side = "right",
    truncate: Side | None = None,
    drop_remainder: bool = False,
    dtype: Any = None,
) -> Iterator[BucketBatch]:
    """Groups sequences of similar length into batches of a few fixed shapes.

    Each sequence joins the smallest bucket that fits it; a bucket emits a batch
    when it holds ``batch_size`` sequences. When the input is exhausted, partial
    batches are completed with empty filler rows (length 0, index -1) so every
    batch has shape ``[batch_size, bucket, *inner]``: a jitted step compiles at most
    ``len(buckets)`` times. ``seqs`` may be a generator; it is read lazily.

    Args:
      seqs: arrays ``[length_i, *inner]``.
      buckets: strictly increasing lengths (see :func:`bucket_boundaries`).
      batch_size: rows per batch.
      pad_value, side: as in :func:`pad_sequences`.
      truncate: for sequences longer than the largest bucket: None raises.
      drop_remainder: drop partial batches instead of completing them.
      dtype: the dtype of every batch. Default: for a list (or tuple), the common
        dtype of all its sequences, as :func:`pad_sequences` chooses; for an
        iterator, which is read lazily, the dtype of its first non-empty sequence.
        A sequence whose values the batch dtype would change raises
        ``DropmaskValueError`` naming its index; nothing is narrowed silently.

    Yields:
      :class:`BucketBatch` ``(padded, lengths, indices)``.

    Example:
      >>> import dropmask
      >>> seqs = [[1], [2, 3, 4], [5, 6], [7, 8, 9, 10, 11]]
      >>> [b.padded.shape for b in dropmask.bucket_by_length(seqs, (2, 8), batch_size=2)]
      [(2, 2), (2, 8)]
    """
    caller = "bucket_by_length"
    buckets = _check_buckets(buckets, caller)
    batch_size = check_int(batch_size, name="batch_size", caller=caller, minimum=1, shape=True)
    _check_choice(side, "side", caller, allow_none=False)
    _check_choice(truncate, "truncate", caller, allow_none=True)
    if dtype is None and isinstance(seqs, Sequence) and not isinstance(seqs, str):
        # A list is known in full: its batches share the common dtype of all of its
        # sequences (as pad_sequences would choose), so no value is ever narrowed.
        seqs = [_as_numeric(s, i, caller) for i, s in enumerate(seqs)]
        nonempty = [a for a in seqs if a.ndim and a.shape[0]]
        if nonempty:
            dtype = _common_dtype(nonempty)
    if dtype is not None:
        _check_pad_value(pad_value, np.dtype(dtype), caller)
    return _bucket_batches(
        seqs, buckets, batch_size, pad_value, side, truncate, drop_remainder, dtype
    )


def _bucket_batches(
    seqs: Iterable[Any],
    buckets: tuple[int, ...],
    batch_size: int,
    pad_value: Any,
    side: str,
    truncate: str | None,
    drop_remainder: bool,
    dtype: Any,
) -> Iterator[BucketBatch]:
    caller = "bucket_by_length"
    layout = _Layout(caller)
    pending: dict[int, list[tuple[int, np.ndarray]]] = {b: [] for b in buckets}
    out_dtype = None if dtype is None else np.dtype(dtype)

    def emit(bucket: int, items: list[tuple[int, np.ndarray]]) -> BucketBatch:
        arrays = [layout.shaped(a) for _, a in items]
        filler = batch_size - len(arrays)
        arrays += [np.zeros((0, *(layout.inner or ())))] * filler
        final_dtype = np.dtype(np.float64) if out_dtype is None else out_dtype
        padded, lengths = _fill(
            arrays, bucket, layout.inner or (), final_dtype, pad_value, side, truncate
        )
        indices = np.array([i for i, _ in items] + [-1] * filler, dtype=np.int64)
        return BucketBatch(padded, lengths, indices)

    count = 0
    for index, seq in enumerate(seqs):
        a = layout.add(index, seq)
        count += 1
        n = a.shape[0]
        if n:
            if out_dtype is None:
                # A stream (an iterator) cannot be read ahead: its dtype is fixed by its
                # first non-empty sequence, and a later one must fit it.
                out_dtype = a.dtype
                _check_pad_value(pad_value, out_dtype, caller)
            elif dtype is None and not np.can_cast(a.dtype, out_dtype, casting="same_kind"):
                raise user_error(
                    DropmaskValueError,
                    f"sequence {index} has dtype {a.dtype}, which cannot be stored in the batch "
                    f"dtype {out_dtype} (fixed by the first non-empty sequence of the stream) "
                    "without losing its kind",
                    "Pass dtype= or a list.",
                    caller=caller,
                )
            _check_lossless(a, out_dtype, index, caller)
        if n > buckets[-1] and truncate is None:
            _too_long(np.array([n]), buckets[-1], caller, "the largest bucket")
        bucket = next((b for b in buckets if b >= n), buckets[-1])
        pending[bucket].append((index, a))
        if len(pending[bucket]) == batch_size and layout.inner is not None:
            yield emit(bucket, pending[bucket])
            pending[bucket] = []
    if count == 0:
        raise user_error(
            DropmaskValueError,
            "got no sequences; pass a non-empty iterable of arrays",
            caller=caller,
        )
    for bucket in buckets:
        items = pending[bucket]
        while items:
            chunk, items = items[:batch_size], items[batch_size:]
            if len(chunk) == batch_size or not drop_remainder:
                yield emit(bucket, chunk)


# ----------------------------------------------------------------- packing


class Packed(NamedTuple):
    """Sequences packed into rows by :func:`pack_sequences`.

    Attributes:
      values: ``[rows, max_len, *inner]``.
      segment_ids: ``int32[rows, max_len]``: 1, 2, ... for the sequences of a row in
        order, 0 for padding (the t5x / MaxText convention).
      positions: ``int32[rows, max_len]``: 0, 1, ... within each sequence; 0 on padding.
      row: ``int32[n]``: the row of input sequence ``i`` (-1 for an empty sequence).
      start: ``int32[n]``: its offset within the row.
      lengths: ``int32[n]``: its (possibly truncated) length.

    Example:
      >>> import dropmask
      >>> p = dropmask.pack_sequences([[1, 2, 3], [4, 5], [6, 7]], max_len=5)
      >>> p.row.tolist(), p.start.tolist(), p.lengths.tolist()
      ([0, 0, 1], [0, 3, 0], [3, 2, 2])
    """

    values: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    row: np.ndarray
    start: np.ndarray
    lengths: np.ndarray


def pack_sequences(
    seqs: Iterable[Any],
    max_len: int,
    *,
    pad_value: Any = 0,
    num_rows: int | None = None,
    truncate: Side | None = None,
    dtype: Any = None,
) -> Packed:
    """Packs short sequences into rows of ``max_len`` (first fit, in input order).

    Args:
      seqs: arrays ``[length_i, *inner]``.
      max_len: row length.
      pad_value: written where no sequence lies.
      num_rows: a fixed number of rows (for a fixed shape); None uses as few as
        first-fit needs.
      truncate: for sequences longer than ``max_len``: None raises.
      dtype: as in :func:`pad_sequences`.

    Returns:
      :class:`Packed`. Use ``segment_mask(packed.segment_ids)`` (with
      :func:`dropmask.causal_mask` for decoders) so that sequences in one row do not
      attend to each other, and ``segment_ids > 0`` as the token mask.

    Raises:
      ValueError: as :func:`pad_sequences`, or the sequences do not fit ``num_rows``.

    Example:
      >>> import dropmask
      >>> p = dropmask.pack_sequences([[1, 2, 3], [4, 5], [6, 7]], max_len=5)
      >>> p.values.tolist()
      [[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]]
      >>> p.segment_ids.tolist(), p.positions.tolist()
      ([[1, 1, 1, 2, 2], [1, 1, 0, 0, 0]], [[0, 1, 2, 0, 1], [0, 1, 0, 0, 0]])
    """
    caller = "pack_sequences"
    max_len = check_int(max_len, name="max_len", caller=caller, minimum=1, shape=True)
    if num_rows is not None:
        num_rows = check_int(num_rows, name="num_rows", caller=caller, minimum=0, shape=True)
    _check_choice(truncate, "truncate", caller, allow_none=True)
    arrays, out_dtype, inner = _collect(seqs, caller, dtype)
    _check_pad_value(pad_value, out_dtype, caller)
    if truncate is None:
        _too_long(np.array([a.shape[0] for a in arrays]), max_len, caller, "max_len")
    arrays = [_cut(a, max_len, truncate) for a in arrays]
    lengths = np.array([a.shape[0] for a in arrays], dtype=np.int32)
    row = np.full(len(arrays), -1, dtype=np.int32)
    start = np.zeros(len(arrays), dtype=np.int32)
    free = np.zeros(0, dtype=np.int64)
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        fits = np.flatnonzero(free >= n)
        r = int(fits[0]) if fits.size else free.size
        if r == free.size:
            free = np.append(free, max_len)
        row[i], start[i] = r, max_len - free[r]
        free[r] -= n
    rows = free.size if num_rows is None else num_rows
    if free.size > rows:
        raise user_error(
            DropmaskValueError,
            f"the sequences need {free.size} rows of max_len={max_len}, but num_rows={rows}",
            "Raise num_rows or max_len, or pack fewer sequences per call.",
            caller=caller,
        )
    values = np.full((rows, max_len, *inner), pad_value, dtype=out_dtype)
    segment_ids = np.zeros((rows, max_len), dtype=np.int32)
    positions = np.zeros((rows, max_len), dtype=np.int32)
    next_id = np.ones(rows, dtype=np.int32)
    for i, a in enumerate(arrays):
        r, s, n = row[i], start[i], lengths[i]
        if r < 0:
            continue
        values[r, s : s + n] = a
        segment_ids[r, s : s + n] = next_id[r]
        positions[r, s : s + n] = np.arange(n)
        next_id[r] += 1
    return Packed(values, segment_ids, positions, row, start, lengths)


def unpack_sequences(x: Any, packed: Packed) -> list[np.ndarray]:
    """Cuts per-sequence pieces out of a packed array (e.g. a model's outputs).

    Args:
      x: ``[rows, max_len, ...]``, aligned with ``packed.values``.
      packed: the result of :func:`pack_sequences`.

    Returns:
      One array ``[length_i, ...]`` per input sequence, in input order.

    Example:
      >>> import dropmask
      >>> p = dropmask.pack_sequences([[1, 2], [], [3]], max_len=4)
      >>> [a.tolist() for a in dropmask.unpack_sequences(p.values, p)]
      [[1, 2], [], [3]]
    """
    x = np.asarray(x)
    if x.shape[:2] != packed.segment_ids.shape:
        raise user_error(
            DropmaskValueError,
            f"x must start with the packed shape {packed.segment_ids.shape}, got {x.shape}",
            caller="unpack_sequences",
        )
    empty = np.zeros((0, *x.shape[2:]), dtype=x.dtype)
    return [
        x[r, s : s + n] if r >= 0 else empty
        for r, s, n in zip(packed.row, packed.start, packed.lengths, strict=True)
    ]
