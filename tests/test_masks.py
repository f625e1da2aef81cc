"""Building masks, combining them, and the converters (docs/masking.md runs in test_docs)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dropmask as dm


@given(st.integers(0, 6), st.lists(st.integers(0, 6), min_size=1, max_size=4))
def test_sequence_mask_matches_numpy(max_len, raw):
    lengths = np.minimum(np.array(raw), max_len).reshape(-1, 1)  # [batch, 1]: any leading dims
    got = dm.sequence_mask(lengths, max_len)
    assert got.shape == (len(raw), 1, max_len) and got.dtype == jnp.bool_
    np.testing.assert_array_equal(got, np.arange(max_len) < lengths[..., None])


def test_sequence_mask_under_jit_and_vmap():
    lengths = jnp.array([0, 2, 4])
    want = dm.sequence_mask(lengths, 4)
    np.testing.assert_array_equal(jax.jit(dm.sequence_mask, static_argnums=1)(lengths, 4), want)
    np.testing.assert_array_equal(jax.vmap(lambda n: dm.sequence_mask(n, 4))(lengths), want)
    # Traced lengths cannot be checked: out-of-range values saturate, documented.
    traced = jax.jit(dm.sequence_mask, static_argnums=1)(jnp.array([-1, 9]), 3)
    assert traced.tolist() == [[False] * 3, [True] * 3]


@pytest.mark.parametrize(
    ("dtype", "lengths", "max_len"),
    [
        (np.uint8, [0, 5, 255], 300),  # positions 256.. would wrap to 0..
        (np.int8, [0, 5, 127], 200),  # positions 128.. would wrap negative
        (np.int16, [3, 32767], 40000),
        (np.uint16, [0, 65535], 70000),
        (np.uint32, [3, 7], 10),
    ],
)
def test_sequence_mask_with_narrow_integer_lengths(dtype, lengths, max_len):
    arr = np.array(lengths, dtype)
    want = np.arange(max_len) < np.array(lengths)[:, None]
    np.testing.assert_array_equal(dm.sequence_mask(arr, max_len), want)
    np.testing.assert_array_equal(jax.jit(dm.sequence_mask, static_argnums=1)(arr, max_len), want)
    vmapped = jax.vmap(lambda n: dm.sequence_mask(n, max_len))(jnp.asarray(arr))
    np.testing.assert_array_equal(vmapped, want)


def test_sequence_mask_rejects_out_of_range_lengths_of_any_dtype():
    with pytest.raises(ValueError, match=r"lengths must be in \[0, 4\].*\[-1, 2\]"):
        dm.sequence_mask(np.array([-1, 2], np.int8), 4)
    with pytest.raises(ValueError, match=r"got values in \[3, 200\]"):
        dm.sequence_mask(np.array([3, 200], np.uint8), 100)
    # Traced values cannot raise: out of range saturates in every dtype, documented.
    mask = jax.jit(dm.sequence_mask, static_argnums=1)
    assert mask(np.array([-1, 9], np.int8), 3).tolist() == [[False] * 3, [True] * 3]
    assert mask(np.array([0, 200], np.uint8), 3).tolist() == [[False] * 3, [True] * 3]


def test_padding_and_causal_masks():
    tokens = jnp.array([[5, 3, 0], [0, 1, 0]])
    assert dm.padding_mask(tokens).tolist() == [[True, True, False], [False, True, False]]
    assert dm.padding_mask(tokens, pad_id=5)[0].tolist() == [False, True, True]
    np.testing.assert_array_equal(dm.causal_mask(4), np.tril(np.ones((4, 4), bool)))
    np.testing.assert_array_equal(dm.causal_mask(2, 5, offset=3), np.tril(np.ones((2, 5), bool), 3))
    np.testing.assert_array_equal(dm.causal_mask(3, 2), np.tril(np.ones((3, 2), bool)))
    np.testing.assert_array_equal(
        dm.causal_mask(3), nn.make_causal_mask(jnp.ones((1, 3)), dtype=jnp.bool_)[0, 0]
    )


@pytest.mark.parametrize("window", [(1, 0), (2, 1), 1, (0, 0)])
def test_sliding_window_matches_jax_local_window(window):
    q = jax.random.normal(jax.random.key(0), (1, 6, 1, 4))
    k = jax.random.normal(jax.random.key(1), (1, 6, 1, 4))
    want = jax.nn.dot_product_attention(q, k, k, local_window_size=window)
    mask = dm.sliding_window_mask(6, window)[None, None]
    got = jax.nn.dot_product_attention(q, k, k, mask=mask)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_sliding_window_with_offset_and_kv_len():
    got = dm.sliding_window_mask(2, (1, 0), kv_len=4, offset=2)
    assert got.astype(int).tolist() == [[0, 1, 1, 0], [0, 0, 1, 1]]


def test_attention_mask_matches_flax_and_broadcasts():
    q_valid = jnp.array([[True, True, False], [True, False, False]])
    kv_valid = jnp.array([[True, False], [True, True]])
    got = dm.attention_mask(q_valid, kv_valid)
    want = nn.make_attention_mask(q_valid, kv_valid, dtype=jnp.bool_)
    assert got.shape == (2, 1, 3, 2)
    np.testing.assert_array_equal(got, want)
    shared_kv = dm.attention_mask(q_valid, jnp.array([True, False]))  # [2, q] with [kv]
    assert shared_kv.shape == (2, 1, 3, 2)
    assert shared_kv[0, 0, 0].tolist() == [True, False]


def test_segment_mask_for_packed_rows():
    ids = jnp.array([[1, 1, 2, 2, 0]])
    got = dm.segment_mask(ids)[0, 0].astype(int).tolist()
    assert got == [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0],
    ]
    cross = dm.segment_mask(jnp.array([1, 2]), jnp.array([2, 2, 0]))
    assert cross[0].astype(int).tolist() == [[0, 0, 0], [1, 1, 0]]


def test_combine_masks():
    a = jnp.array([[True, False], [True, True]])
    b = jnp.array([True, False])
    assert dm.combine_masks(a, None, b).tolist() == [[True, False], [True, False]]
    assert dm.combine_masks(None, None) is None
    assert dm.combine_masks(b).tolist() == [True, False]
    causal = dm.causal_mask(3)
    pad = dm.attention_mask(jnp.array([[1, 1, 0]], bool), jnp.array([[1, 1, 0]], bool))
    flax = nn.combine_masks(pad, jnp.broadcast_to(causal, pad.shape), dtype=jnp.bool_)
    np.testing.assert_array_equal(dm.combine_masks(pad, causal), flax)


def test_converters_round_trip():
    mask = jnp.array([[True, False, True]])
    flax_mask = dm.to_flax_mask(mask)
    assert flax_mask.dtype == jnp.float32 and flax_mask.tolist() == [[1.0, 0.0, 1.0]]
    np.testing.assert_array_equal(dm.from_flax_mask(flax_mask), mask)
    np.testing.assert_array_equal(dm.from_flax_mask(mask), mask)
    float_flax = nn.make_attention_mask(jnp.array([[1, 0]]), jnp.array([[1, 0]]))
    assert dm.from_flax_mask(float_flax).dtype == jnp.bool_
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        bias = dm.to_bias(mask, dtype)
        assert bias.dtype == dtype and bool(jnp.isfinite(bias).all())
        assert float(bias[0, 1]) <= float(jnp.finfo(dtype).min) / 2
        assert bool(jnp.isfinite(bias + bias).all())  # two biases can be summed
        np.testing.assert_array_equal(dm.from_bias(bias), mask)
    assert dm.from_bias(jnp.array([0.0, -1e4, -1e4 + 1, jnp.nan])).tolist() == [
        True,
        False,
        True,
        False,
    ]
    assert dm.from_bias(jnp.array([0.0, -5.0]), threshold=-1.0).tolist() == [True, False]


def test_numpy_ma_round_trip_uses_inverted_mask():
    x = jnp.array([[1.0, 2.0, 99.0], [4.0, 99.0, 6.0]])
    mask = jnp.array([[True, True, False], [True, False, True]])
    marr = dm.to_numpy_ma(x, mask)
    np.testing.assert_array_equal(marr.mask, ~np.asarray(mask))
    np.testing.assert_allclose(marr.mean(axis=1), dm.masked_mean(x, mask, axis=1), rtol=1e-6)
    data, back = dm.from_numpy_ma(marr)
    np.testing.assert_array_equal(back, mask)
    np.testing.assert_array_equal(data, x)
    _, all_valid = dm.from_numpy_ma(np.ma.masked_array([1.0, 2.0]))  # nomask
    assert all_valid.tolist() == [True, True]
    broadcast = dm.to_numpy_ma(x, jnp.array([True, False, True]))
    assert broadcast.mask.tolist() == [[False, True, False], [False, True, False]]


def test_errors():
    with pytest.raises(dm.DtypeError, match="lengths must be integers"):
        dm.sequence_mask(jnp.array([1.0]), 3)
    with pytest.raises(ValueError, match=r"lengths must be in \[0, 3\].*got values in \[0, 5\]"):
        dm.sequence_mask(jnp.array([0, 5]), 3)
    with pytest.raises(ValueError, match=r"in \[-1, 2\]"):
        dm.sequence_mask([2, -1], 3)
    with pytest.raises(TypeError, match="max_len must be a Python int"):
        dm.sequence_mask([1], 3.0)
    with pytest.raises(ValueError, match="max_len must be >= 0"):
        dm.sequence_mask([0], -1)
    with pytest.raises(TypeError, match="pad_id must be a scalar"):
        dm.padding_mask(jnp.array([1, 0]), pad_id=jnp.array([0, 1]))
    with pytest.raises(TypeError, match="offset must be a Python int"):
        dm.causal_mask(3, offset=1.5)
    with pytest.raises(ValueError, match=r"window\[0\] \(left\) must be >= 0"):
        dm.sliding_window_mask(3, (-1, 0))
    with pytest.raises(ValueError, match=r"window must be an int or \(left, right\)"):
        dm.sliding_window_mask(3, (1, 2, 3))
    with pytest.raises(dm.DtypeError, match="q_valid must be boolean"):
        dm.attention_mask(jnp.array([1, 0]), jnp.array([True]))
    with pytest.raises(dm.MaskShapeError, match="do not broadcast"):
        dm.attention_mask(jnp.ones((2, 3), bool), jnp.ones((4, 3), bool))
    with pytest.raises(dm.MaskShapeError, match="need a length axis"):
        dm.attention_mask(jnp.array(True), jnp.ones(3, bool))
    with pytest.raises(dm.DtypeError, match="segment_ids must be integers"):
        dm.segment_mask(jnp.array([1.0, 0.0]))
    with pytest.raises(dm.MaskShapeError, match=r"masks\[0\]: \(2, 3\), masks\[2\]: \(4,\)"):
        dm.combine_masks(jnp.ones((2, 3), bool), None, jnp.ones(4, bool))
    with pytest.raises(dm.DtypeError, match=r"masks\[1\] must be boolean.*from_flax_mask"):
        dm.combine_masks(jnp.ones(2, bool), jnp.ones(2))
    with pytest.raises(dm.DtypeError, match="to_bias: dtype must be floating"):
        dm.to_bias(jnp.ones(2, bool), jnp.int32)
    with pytest.raises(dm.DtypeError, match="bias must be floating"):
        dm.from_bias(jnp.zeros(2, jnp.int32))
    with pytest.raises(dm.MaskShapeError, match="does not broadcast"):
        dm.to_numpy_ma(jnp.ones(3), jnp.ones(2, bool))
