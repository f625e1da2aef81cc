"""The mask generators: known answers, counter-based invariants, statistics.

Statistical tests use fixed seeds and 4-sigma bounds (or, for chi-square, the
quantile with the same two-sided tail mass, p = 6.3e-5).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import dropmask
import dropmask.linen
from dropmask import _random

P_4SIGMA = 2 * stats.norm.sf(4.0)


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [  # Random123 known-answer vectors for philox2x32 with 10 rounds
        ((0x00000000, 0x00000000), 0x00000000, (0xFF1DAE59, 0x6CD10DF2)),
        ((0xFFFFFFFF, 0xFFFFFFFF), 0xFFFFFFFF, (0x2C3F628B, 0xAB4FD7AD)),
        ((0x243F6A88, 0x85A308D3), 0x13198A2E, (0xDD7CE038, 0xF62A4C12)),
    ],
)
def test_philox_known_answers(counter, key, expected):
    u32 = jnp.uint32
    out = _random.philox2x32(u32(counter[0]), u32(counter[1]), u32(key))
    assert tuple(int(w) for w in out) == expected


def test_bits_depend_only_on_key_and_flat_index():
    key = jax.random.key(0)
    flat = np.asarray(_random.random_bits(key, (6 * 7 * 8,)))
    cube = np.asarray(jax.jit(lambda k: _random.random_bits(k, (6, 7, 8)))(key))
    np.testing.assert_array_equal(cube.ravel(), flat)
    block = dropmask.keep_mask(key, (2, 3, 4), 0.5, global_shape=(6, 7, 8), offset=(3, 4, 2))
    full = dropmask.keep_mask(key, (6, 7, 8), 0.5)
    np.testing.assert_array_equal(np.asarray(block), np.asarray(full)[3:5, 4:7, 2:6])


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
def test_any_key_impl_works_and_differs(impl):
    k0, k1 = jax.random.key(0, impl=impl), jax.random.key(1, impl=impl)
    a = np.asarray(dropmask.keep_mask(k0, (4096,), 0.5))
    b = np.asarray(dropmask.keep_mask(k1, (4096,), 0.5))
    assert 0.4 < a.mean() < 0.6 and (a != b).mean() > 0.4
    raw = jax.random.key_data(k0) if impl == "threefry2x32" else None
    if raw is not None:  # legacy raw uint32 keys give the same mask as typed keys
        np.testing.assert_array_equal(a, np.asarray(dropmask.keep_mask(raw, (4096,), 0.5)))


@pytest.mark.parametrize("rate", [0.001, 0.01, 0.1, 0.25, 0.5, 0.7, 0.9, 0.99, 0.999])
@pytest.mark.parametrize("impl", ["fast", "flax"])
def test_realised_keep_rate_within_4_sigma(rate, impl):
    n = 1 << 21
    mask = dropmask.keep_mask(jax.random.key(123), (n,), rate, impl=impl)
    keep = float(jnp.mean(mask))
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(keep - (1 - rate)) < 4 * sigma, (keep, 1 - rate, sigma)


@pytest.mark.parametrize(
    ("rate", "shift"), [(0.5, 24), (0.25, 24), (0.1, 16), (0.3, 16), (0.001, 0), (0.999, 0)]
)
def test_fewest_bits_for_the_rate(rate, shift):
    thr = _random.threshold(1 - rate)
    assert thr.shift == shift
    nbits = 32 - shift
    assert thr.realised == thr.value / 2**nbits
    assert abs(thr.realised - (1 - rate)) <= 1e-3 * min(rate, 1 - rate)


def test_traced_threshold_is_exact_in_float32():
    thr = jax.jit(lambda p: _random.threshold(p).realised)(jnp.float32(0.9))
    assert float(thr) * 2**24 == round(0.9 * 2**24)


def test_raw_bytes_are_uniform():
    bits = np.asarray(_random.random_bits(jax.random.key(5), (1 << 20,)))
    for shift in (0, 8, 16, 24):
        counts = np.bincount((bits >> shift) & 0xFF, minlength=256)
        assert stats.chisquare(counts).pvalue > P_4SIGMA


def _independent(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of a chi-square independence test on the joint counts of two masks."""
    table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]])
    return stats.chi2_contingency(table, correction=False).pvalue


def test_no_dependence_between_neighbours_rows_steps_splits_and_streams():
    key, rate, shape = jax.random.key(77), 0.5, (1024, 1024)
    m = np.asarray(dropmask.keep_mask(key, shape, rate))
    pairs = {
        "neighbouring elements": (m[:, :-1], m[:, 1:]),
        "neighbouring rows": (m[:-1], m[1:]),
    }
    step = [np.asarray(dropmask.keep_mask(jax.random.fold_in(key, s), shape, rate)) for s in (0, 1)]
    pairs["fold_in steps"] = tuple(step)
    k1, k2 = jax.random.split(key)
    pairs["split keys"] = tuple(np.asarray(dropmask.keep_mask(k, shape, rate)) for k in (k1, k2))

    class TwoStreams(nn.Module):
        @nn.compact
        def __call__(self, x):
            a = dropmask.linen.Dropout(rate, deterministic=False)(x)
            b = dropmask.linen.Dropout(rate, deterministic=False, rng_collection="other")(x)
            return a != 0, b != 0

    a, b = TwoStreams().apply({}, jnp.ones(shape), rngs={"dropout": key, "other": key})
    pairs["named streams (same root key)"] = (np.asarray(a), np.asarray(b))
    for name, (a, b) in pairs.items():
        assert _independent(a.ravel(), b.ravel()) > P_4SIGMA, name
        assert (a != b).mean() > 0.49, name


def test_broadcast_masks_exactly_shared():
    m = np.asarray(dropmask.keep_mask(jax.random.key(1), (16, 32, 8), 0.3, broadcast_dims=(1,)))
    np.testing.assert_array_equal(m, np.broadcast_to(m[:, :1], m.shape))


def test_too_many_elements_error():
    with pytest.raises(ValueError, match="2\\*\\*32"):
        jax.eval_shape(lambda k: dropmask.keep_mask(k, (1 << 16, 1 << 16), 0.5), jax.random.key(0))


def test_block_arguments_validated():
    with pytest.raises(ValueError, match="go together"):
        dropmask.keep_mask(jax.random.key(0), (2, 2), 0.5, global_shape=(4, 4))
    with pytest.raises(ValueError, match="one entry per axis"):
        dropmask.keep_mask(jax.random.key(0), (2, 2), 0.5, global_shape=(4,), offset=(0,))
    with pytest.raises(ValueError, match="impl='fast'"):
        dropmask.dropout(
            jnp.ones((2, 2)),
            0.5,
            jax.random.key(0),
            impl="flax",
            global_shape=(4, 4),
            offset=(0, 0),
        )
