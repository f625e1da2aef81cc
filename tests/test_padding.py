"""Host-side padding, bucketing and packing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dropmask as dm

seq_lists = st.lists(st.lists(st.integers(1, 99), max_size=7), min_size=1, max_size=6)


@given(seq_lists, st.sampled_from(["right", "left"]))
def test_pad_sequences_keeps_every_sequence(seqs, side):
    padded, lengths = dm.pad_sequences(seqs, pad_value=-1, side=side)
    longest = max(len(s) for s in seqs)
    assert padded.shape == (len(seqs), longest) and lengths.dtype == np.int32
    for row, n, s in zip(padded, lengths, seqs, strict=True):
        assert n == len(s)
        data, pad = (
            (row[:n], row[n:]) if side == "right" else (row[longest - n :], row[: longest - n])
        )
        assert data.tolist() == s and (pad == -1).all()


@given(seq_lists, st.integers(0, 8), st.sampled_from(["right", "left"]))
def test_truncation_policies(seqs, max_len, truncate):
    padded, lengths = dm.pad_sequences(seqs, max_len=max_len, truncate=truncate)
    assert padded.shape == (len(seqs), max_len)
    for row, n, s in zip(padded, lengths, seqs, strict=True):
        kept = s[:max_len] if truncate == "right" else s[max(len(s) - max_len, 0) :]
        assert n == len(kept) and row[:n].tolist() == kept


def test_pad_sequences_options():
    seqs = [np.ones((3, 2), np.float32), np.zeros((0, 2), np.float32), []]
    padded, lengths = dm.pad_sequences(seqs, multiple_of=8, pad_value=np.nan)
    assert padded.shape == (3, 8, 2) and padded.dtype == np.float32
    assert lengths.tolist() == [3, 0, 0] and np.isnan(padded[0, 3:]).all()
    padded, _ = dm.pad_sequences([[1, 2]], max_len=16, multiple_of=8, dtype=np.int8)
    assert padded.shape == (1, 16) and padded.dtype == np.int8
    ints, _ = dm.pad_sequences([[1], [2.5]])
    assert ints.dtype == np.float64
    # The result feeds straight into the mask builders under jit.
    padded, lengths = dm.pad_sequences([[1, 2, 3], [4]], dtype=np.int32)
    mask = jax.jit(dm.sequence_mask, static_argnums=1)(lengths, padded.shape[1])
    assert dm.masked_sum(jnp.asarray(padded), mask, axis=-1).tolist() == [6, 4]


def test_padding_errors():
    with pytest.raises(ValueError, match="got no sequences"):
        dm.pad_sequences([])
    with pytest.raises(
        ValueError, match=r"sequence 1 has inner shape \(3,\) but sequence 0 has \(2,\)"
    ):
        dm.pad_sequences([np.ones((1, 2)), np.ones((1, 3))])
    with pytest.raises(ValueError, match="sequence 0 is a scalar"):
        dm.pad_sequences([5, [1]])
    with pytest.raises(
        ValueError, match=r"1 sequence\(s\) are longer than max_len=2.*index 1.*truncate='right'"
    ):
        dm.pad_sequences([[1], [1, 2, 3]], max_len=2)
    with pytest.raises(ValueError, match="side must be one of"):
        dm.pad_sequences([[1]], side="center")
    with pytest.raises(ValueError, match="truncate must be one of"):
        dm.pad_sequences([[1]], truncate="middle")
    with pytest.raises(
        ValueError, match="max_len=10 is not a multiple of multiple_of=8; pass max_len=16"
    ):
        dm.pad_sequences([[1]], max_len=10, multiple_of=8)
    with pytest.raises(ValueError, match=r"pad_value=-1 cannot be stored in dtype uint8"):
        dm.pad_sequences([np.array([1], np.uint8)], pad_value=-1)
    with pytest.raises(ValueError, match="pad_value=0.5 cannot be stored"):
        dm.pad_sequences([[1, 2]], pad_value=0.5)
    with pytest.raises(TypeError, match="max_len must be a Python int"):
        dm.pad_sequences([[1]], max_len=2.0)
    with pytest.raises(ValueError, match="multiple_of must be >= 1"):
        dm.pad_sequences([[1]], multiple_of=0)


def test_bucket_boundaries_and_pad_to_bucket():
    assert dm.bucket_boundaries([1, 2, 3, 4, 100], 2) == (3, 100)
    assert dm.bucket_boundaries([0, 0], 3, multiple_of=8) == (8,)
    padded, lengths = dm.pad_to_bucket([[1, 2, 3], [4]], buckets=(2, 4, 8))
    assert padded.shape == (2, 4) and lengths.tolist() == [3, 1]
    padded, lengths = dm.pad_to_bucket([[1] * 9], buckets=(2, 4), truncate="left")
    assert padded.shape == (1, 4) and lengths.tolist() == [4]
    with pytest.raises(ValueError, match="longer than the largest bucket=4"):
        dm.pad_to_bucket([[1] * 5], buckets=(2, 4))
    with pytest.raises(ValueError, match="strictly increasing"):
        dm.pad_to_bucket([[1]], buckets=(4, 2))
    with pytest.raises(ValueError, match="strictly increasing"):
        dm.pad_to_bucket([[1]], buckets=())
    with pytest.raises(ValueError, match="non-empty 1-D list of ints"):
        dm.bucket_boundaries([], 2)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        dm.bucket_boundaries([3, -1], 2)


@given(st.lists(st.integers(0, 20), min_size=1, max_size=30), st.integers(1, 4), st.booleans())
def test_bucket_by_length_places_every_sequence_once(lengths, batch_size, drop_remainder):
    buckets = (4, 8, 20)
    seqs = [np.arange(n) + 1 for n in lengths]
    batches = list(
        dm.bucket_by_length(iter(seqs), buckets, batch_size, drop_remainder=drop_remainder)
    )
    seen = []
    for batch in batches:
        assert batch.padded.shape[0] == batch_size and batch.padded.shape[1] in buckets
        for row, n, i in zip(batch.padded, batch.lengths, batch.indices, strict=True):
            if i < 0:
                assert n == 0 and (row == 0).all()
                continue
            seen.append(int(i))
            assert n == lengths[i] and row[:n].tolist() == seqs[i].tolist()
            assert batch.padded.shape[1] == min(b for b in buckets if b >= n)
    if drop_remainder:  # partial batches are dropped, never completed with fillers
        assert len(set(seen)) == len(seen)
        assert all(i >= 0 for b in batches for i in b.indices)
    else:
        assert sorted(seen) == list(range(len(lengths)))


def test_bucket_by_length_errors_and_dtypes():
    with pytest.raises(ValueError, match="got no sequences"):
        list(dm.bucket_by_length(iter([]), (4,), 2))
    with pytest.raises(ValueError, match="longer than the largest bucket=4"):
        list(dm.bucket_by_length([[1] * 5], (4,), 2))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        dm.bucket_by_length([[1]], (4,), 0)
    with pytest.raises(ValueError, match="cannot be stored in the batch dtype int64"):
        list(dm.bucket_by_length(iter([[1], [0.5]]), (4,), 2))
    (batch,) = dm.bucket_by_length([[1], [0.5]], (4,), 2)  # a list widens, as pad_sequences
    assert batch.padded.dtype == np.float64 and batch.padded[:, 0].tolist() == [1.0, 0.5]
    with pytest.raises(ValueError, match=r"inner shape \(3,\)"):
        list(dm.bucket_by_length([np.ones((1, 2)), np.ones((1, 3))], (4,), 2))
    (batch,) = dm.bucket_by_length([[1.5], []], (4,), 2, dtype=np.float32, truncate="right")
    assert batch.padded.dtype == np.float32 and batch.lengths.tolist() == [1, 0]
    (batch,) = dm.bucket_by_length([[1] * 6], (4,), 1, truncate="left")
    assert batch.lengths.tolist() == [4]


def test_bucketing_bounds_compilations():
    """A jitted step over bucketed batches traces at most len(buckets) times."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 64, size=120)
    seqs = [rng.normal(size=(n,)).astype(np.float32) for n in lengths]
    traces = []

    @jax.jit
    def step(padded, lengths):
        traces.append(padded.shape)
        mask = dm.sequence_mask(lengths, padded.shape[1])
        return dm.masked_mean(padded, mask, axis=-1)

    buckets = dm.bucket_boundaries(lengths, 4, multiple_of=8)
    means = {}
    for batch in dm.bucket_by_length(seqs, buckets, batch_size=8):
        out = np.asarray(step(batch.padded, batch.lengths))
        means.update({int(i): m for i, m in zip(batch.indices, out, strict=True) if i >= 0})
    assert len(traces) <= len(buckets) == 4
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(means[i], s.mean() if s.size else 0.0, rtol=1e-5, atol=1e-6)
    # Padding each batch to its own longest sequence compiles far more shapes.
    traces.clear()
    for start in range(0, 120, 8):
        padded, n = dm.pad_sequences(seqs[start : start + 8])
        step(padded, n)
    assert len(traces) > 2 * len(buckets)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.integers(6, 9))
def test_pack_round_trip(lengths, max_len):
    seqs = [np.arange(n) + 10 * i + 1 for i, n in enumerate(lengths)]
    packed = dm.pack_sequences(seqs, max_len)
    rows = packed.values.shape[0]
    assert (
        packed.values.shape == packed.segment_ids.shape == packed.positions.shape == (rows, max_len)
    )
    for got, want in zip(dm.unpack_sequences(packed.values, packed), seqs, strict=True):
        assert got.tolist() == want.tolist()
    for r in range(rows):
        ids, pos = packed.segment_ids[r], packed.positions[r]
        assert (packed.values[r][ids == 0] == 0).all() and (pos[ids == 0] == 0).all()
        used = ids[ids > 0]
        assert used.tolist() == sorted(used.tolist())  # segments are contiguous, numbered in order
        for sid in set(used.tolist()):
            assert pos[ids == sid].tolist() == list(range((ids == sid).sum()))
    # First fit in input order never needs more rows than one per non-empty sequence.
    assert rows <= sum(1 for n in lengths if n)


def test_pack_options_and_errors():
    packed = dm.pack_sequences([np.ones((2, 3)), np.ones((4, 3))], 4, num_rows=3, pad_value=-1)
    assert packed.values.shape == (3, 4, 3) and (packed.segment_ids[2] == 0).all()
    assert packed.row.tolist() == [0, 1] and packed.start.tolist() == [0, 0]
    cut = dm.pack_sequences([[1, 2, 3, 4, 5]], 3, truncate="left")
    assert cut.values.tolist() == [[3, 4, 5]] and cut.lengths.tolist() == [3]
    with pytest.raises(ValueError, match="longer than max_len=3"):
        dm.pack_sequences([[1, 2, 3, 4]], 3)
    with pytest.raises(ValueError, match="need 2 rows of max_len=3, but num_rows=1"):
        dm.pack_sequences([[1, 2], [3, 4]], 3, num_rows=1)
    with pytest.raises(ValueError, match="got no sequences"):
        dm.pack_sequences([], 3)
    with pytest.raises(ValueError, match="must start with the packed shape"):
        dm.unpack_sequences(np.zeros((5, 5)), cut)


# --------------------------------------------------------------- no value changes silently

_BIG = np.array([2**40], np.int64)


def test_bucket_by_length_never_narrows_a_value():
    seqs = [np.array([1, 2], np.int32), _BIG, np.array([1.0], np.float32)]
    # A list: every batch takes the common dtype of all sequences, as pad_sequences does.
    batches = list(dm.bucket_by_length(seqs[:2], (4,), 1))
    assert [b.padded.dtype for b in batches] == [np.int64, np.int64]
    assert batches[1].padded[0, 0] == 2**40
    assert dm.pad_sequences(seqs[:2])[0].dtype == np.int64
    # An iterator is read lazily: a later value its batch dtype cannot hold is an error
    # naming the sequence, never a wrapped 0 or an inf.
    with pytest.raises(
        dm.DropmaskValueError,
        match=r"sequence 1 \(dtype int64\) holds 1099511627776.*would become 0.*dtype=int64",
    ):
        list(dm.bucket_by_length(iter(seqs[:2]), (4,), 1))
    floats = iter([np.array([1.0], np.float32), np.array([1e300])])
    with pytest.raises(
        dm.DropmaskValueError, match=r"sequence 1 .*holds 1e\+300.*would become inf"
    ):
        list(dm.bucket_by_length(floats, (4,), 1))
    # Values that fit are fine: a float64 stream rounded into float32 keeps its values' sizes.
    (batch,) = dm.bucket_by_length(iter([np.ones(1, np.float32), [0.1]]), (4,), 2)
    assert batch.padded.dtype == np.float32
    with pytest.raises(dm.DropmaskValueError, match="sequence 1 .*holds 300"):
        list(dm.bucket_by_length([[1], [300]], (4,), 2, dtype=np.int8))


@pytest.mark.parametrize("caller", ["pad_sequences", "pad_to_bucket", "pack_sequences"])
@pytest.mark.parametrize(
    ("seq", "dtype", "held"),
    [
        ([1, 300], np.int8, "300"),
        ([1, -3], np.uint8, "-3"),
        ([1.5], np.int32, "1.5"),
        ([1e300], np.float32, "1e\\+300"),
        ([1 + 2j], np.float32, "1\\+2j"),
        ([2], np.bool_, "2"),
    ],
)
def test_given_dtype_that_would_change_a_value_raises(caller, seq, dtype, held):
    call = {
        "pad_sequences": lambda s, **kw: dm.pad_sequences(s, **kw),
        "pad_to_bucket": lambda s, **kw: dm.pad_to_bucket(s, (4,), **kw),
        "pack_sequences": lambda s, **kw: dm.pack_sequences(s, 4, **kw),
    }[caller]
    with pytest.raises(
        dm.DropmaskValueError, match=f"{caller}: sequence 1 .*holds .*{held}.*Pass dtype="
    ):
        call([[0], seq], dtype=dtype)
    assert call([[0], [1]], dtype=dtype)[0].dtype == dtype  # values that fit pass


@pytest.mark.parametrize(
    "caller", ["pad_sequences", "pad_to_bucket", "pack_sequences", "bucket_by_length"]
)
def test_ragged_or_non_numeric_sequences_are_named(caller):
    call = {
        "pad_sequences": lambda s, **kw: dm.pad_sequences(s, **kw),
        "pad_to_bucket": lambda s, **kw: dm.pad_to_bucket(s, (4,), **kw),
        "pack_sequences": lambda s, **kw: dm.pack_sequences(s, 4, **kw),
        "bucket_by_length": lambda s, **kw: list(dm.bucket_by_length(s, (4,), 1, **kw)),
    }[caller]
    with pytest.raises(
        dm.DropmaskTypeError, match=f"{caller}: sequence 1 is not a rectangular array"
    ):
        call([[[1, 2]], [[1, 2], [3]]])
    for mixed in ([1, "a"], [1, None]):
        with pytest.raises(
            dm.DropmaskTypeError, match=f"{caller}: sequence 1 has dtype .*numbers or booleans"
        ):
            call([[1], mixed])
    with pytest.raises(dm.DropmaskTypeError, match="pad_value must be a number"):
        call([[1]], pad_value="x")
    with pytest.raises(dm.DropmaskValueError, match="pad_value=5 cannot be stored in dtype bool"):
        call([[True]], pad_value=5)


def test_integers_are_never_rounded_into_floats():
    big = np.array([2**53 + 1], np.int64)
    # int64 with uint64 has float64 as its NumPy common dtype, which rounds 2**53 + 1.
    with pytest.raises(dm.DropmaskValueError, match=r"sequence 0 .*9007199254740993.*dtype=int64"):
        dm.pad_sequences([big, np.array([1], np.uint64)])
    padded, _ = dm.pad_sequences([big, np.array([1], np.uint64)], dtype=np.int64)
    assert padded[0, 0] == 2**53 + 1
    with pytest.raises(dm.DropmaskValueError, match="holds 16777217.*16777216"):
        dm.pad_sequences([[16777217]], dtype=np.float32)
    assert dm.pad_sequences([[0.1]], dtype=np.float16)[0].dtype == np.float16  # floats round
