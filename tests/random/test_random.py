"""The mask generators: known answers, counter-based invariants, statistics.

Statistical tests use fixed seeds and 4-sigma bounds (or, for chi-square, the
quantile with the same two-sided tail mass, p = 6.3e-5).
"""

import collections
import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from tests.covering import covering

import dropmask
import dropmask.linen
from dropmask._random import _fast_mask, _sharding
from dropmask._random._threefry import threefry4x32

P_4SIGMA = 2 * stats.norm.sf(4.0)


PI_COUNTER = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
PI_KEY = (0xA4093822, 0x299F31D0, 0x082EFA98, 0xEC4E6C89)


@pytest.mark.parametrize(
    ("counter", "key", "rounds", "expected"),
    [  # Random123 known-answer vectors (tests/kat_vectors) for threefry4x32
        ((0,) * 4, (0,) * 4, 20, (0x9C6CA96A, 0xE17EAE66, 0xFC10ECD4, 0x5256A7D8)),
        (
            (0xFFFFFFFF,) * 4,
            (0xFFFFFFFF,) * 4,
            20,
            (0x2A881696, 0x57012287, 0xF6C7446E, 0xA16A6732),
        ),
        (PI_COUNTER, PI_KEY, 20, (0x59CD1DBB, 0xB8879579, 0x86B5D00C, 0xAC8B6D84)),
        ((0,) * 4, (0,) * 4, 13, (0x531C7E4F, 0x39491EE5, 0x2C855A92, 0x3D6ABF9A)),
        (
            (0xFFFFFFFF,) * 4,
            (0xFFFFFFFF,) * 4,
            13,
            (0xC4189358, 0x1C9CC83A, 0xD5881C67, 0x6A0A89E0),
        ),
        (PI_COUNTER, PI_KEY, 13, (0x4AA71D8F, 0x734738C2, 0x431FC6A8, 0xAE6DEBF1)),
    ],
)
def test_threefry_known_answers(counter, key, rounds, expected):
    u32 = jnp.uint32
    out = threefry4x32([u32(c) for c in counter], [u32(k) for k in key], rounds=rounds)
    assert tuple(int(w) for w in out) == expected


def test_the_generator_is_threefry_4x32_13():
    u32 = jnp.uint32
    out = threefry4x32([u32(c) for c in PI_COUNTER], [u32(k) for k in PI_KEY])
    assert tuple(int(w) for w in out) == (0x4AA71D8F, 0x734738C2, 0x431FC6A8, 0xAE6DEBF1)


def test_mask_layout_from_the_block_function():
    """Element ``i`` of a 1-d mask: word ``i // 32``, lane ``l = i % 32``; call ``l // 8``
    of the word (counter ``(word, call, 0, 0)``), output word ``(l % 8) // 2``, 16-bit
    half ``l % 2``; kept when that field is below ``round((1 - rate) * 2**16)``."""
    key, rate, n = jax.random.key(11), 0.3, 96
    words = [jnp.uint32(w) for w in np.asarray(_fast_mask.key_words(key))]
    limit = int(np.round((np.float32(1) - np.float32(rate)) * np.float32(2**16)))
    want = []
    for i in range(n):
        lane = i % 32
        out = threefry4x32([jnp.uint32(i // 32), jnp.uint32(lane // 8), 0, 0], words)
        field = (int(out[(lane % 8) // 2]) >> (16 * (lane % 2))) & 0xFFFF
        want.append(field < limit)
    np.testing.assert_array_equal(np.asarray(dropmask.keep_mask(key, (n,), rate)), want)


SHAPES = [(64, 128), (3, 50), (7,), (5, 33, 1), (), (2, 3, 40), (4, 70), (1, 1)]


# Fast: every rank, whole words, a last word partial (rank 1 and 3) and a last axis of
# one; the slow suite adds the other partial words and one element.
@pytest.mark.parametrize("shape", covering(SHAPES, [(64, 128), (7,), (5, 33, 1), (), (2, 3, 40)]))
def test_all_paths_give_the_same_mask(shape):
    words = _fast_mask.key_words(jax.random.key(3))
    # The paths differ in how they lay the random fields out, which the shape decides;
    # each compares a field with the same threshold. A middle and an extreme one.
    rates = (0.5, 0.999)
    paths = ("per_element", "packed", "packed_inline", None)

    def every_mask(w):
        return [
            [
                _fast_mask.keep_from_words(w, shape, _fast_mask.threshold(1 - r), path=p)
                for p in paths
            ]
            for r in rates
        ]

    # One program holds every rate's every path (static thresholds, as a static rate
    # gives): one compilation per shape.
    for rate, masks in zip(rates, jax.jit(every_mask)(words), strict=True):
        for path, mask in zip(paths[1:], masks[1:], strict=True):
            np.testing.assert_array_equal(
                np.asarray(mask), np.asarray(masks[0]), err_msg=f"{path} at rate {rate}"
            )


def test_unknown_path_is_rejected():
    words = _fast_mask.key_words(jax.random.key(3))
    with pytest.raises(ValueError, match="path must be one of"):
        _fast_mask.keep_from_words(words, (4, 4), _fast_mask.threshold(0.5), path="fast")


@pytest.mark.parametrize("path", _fast_mask.PATHS)
def test_blocks_match_the_global_mask_at_any_offset(path):
    key, full_shape = jax.random.key(4), (6, 70, 8)
    words = _fast_mask.key_words(key)
    thr = _fast_mask.threshold(0.7)
    full = np.asarray(_fast_mask.keep_from_words(words, full_shape, thr, path=path))

    @functools.partial(jax.jit, static_argnums=2)
    def block(words, offset, shape):
        return _fast_mask.keep_from_words(
            words, shape, thr, _sharding.Block(full_shape, tuple(offset)), path=path
        )

    # Offsets along the packed (last) axis that are and are not multiples of 32 words,
    # traced, so that the kernel cannot rely on alignment.
    for offset, shape in [
        ((0, 0, 0), (6, 70, 8)),
        ((3, 33, 2), (2, 30, 4)),
        ((1, 5, 3), (4, 65, 5)),
    ]:
        got = np.asarray(block(words, jnp.array(offset), shape))
        want = full[tuple(slice(o, o + d) for o, d in zip(offset, shape, strict=True))]
        np.testing.assert_array_equal(got, want)


def test_bits_depend_only_on_key_and_flat_index():
    key = jax.random.key(0)
    flat = np.asarray(_fast_mask.random_bits(key, (6 * 7 * 8,)))
    cube = np.asarray(jax.jit(lambda k: _fast_mask.random_bits(k, (6, 7, 8)))(key))
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


@pytest.mark.parametrize("impl", ["fast", "flax"])
def test_realised_keep_rate_within_4_sigma(impl):
    n = 1 << 21
    rates = (0.001, 0.01, 0.1, 0.25, 0.5, 0.7, 0.9, 0.99, 0.999)
    # One program draws every rate's mask (each a static rate): one compilation.
    keeps = jax.jit(
        lambda key: [jnp.mean(dropmask.keep_mask(key, (n,), r, impl=impl)) for r in rates]
    )(jax.random.key(123))
    for rate, keep in zip(rates, keeps, strict=True):
        sigma = np.sqrt(rate * (1 - rate) / n)
        assert abs(float(keep) - (1 - rate)) < 4 * sigma, (rate, float(keep), sigma)


@pytest.mark.parametrize("rate", [0.5, 0.25, 0.1, 0.3, 0.001, 0.999, 0.123456789])
def test_one_precision_for_every_rate(rate):
    """Every rate is drawn to 2**-16: the threshold is ``1 - rate`` in float32, rounded
    half to even, whether the rate is a Python number or a float32 scalar."""
    static = _fast_mask.threshold(float(np.float32(1) - np.float32(rate)))
    traced = _fast_mask.Threshold(
        *jax.jit(lambda r: dataclasses.astuple(_fast_mask.threshold(1.0 - r)))(jnp.float32(rate))
    )
    want = int(np.round((np.float32(1) - np.float32(rate)) * np.float32(2**16)))
    assert static.value == int(traced.value) == want
    assert static.realised == float(traced.realised) == want / 2**16
    assert abs(static.realised - (1 - rate)) <= 2**-17 + 1e-7


def test_static_rates_that_round_to_0_or_1_are_refused():
    x, key = jnp.ones((4, 64)), jax.random.key(0)
    for rate in (1e-6, 1 - 1e-6):
        with pytest.raises(dropmask.RateError, match="dropout: rate must be 0, 1, or more than"):
            dropmask.dropout(x, rate, key)
    # Either end of the resolution is still drawn, and impl="flax" takes any rate.
    dropped = int((~dropmask.keep_mask(key, (1 << 20,), 2**-16)).sum())
    assert 0 < dropped < 16 + 4 * 4  # 16 expected, sigma 4
    assert float((dropmask.dropout(x, 1e-6, key, impl="flax") == 0).mean()) == 0


# Fast: the lowest and the highest bit of a key word apart; (6, 7), the lowest again, is
# slow.
@pytest.mark.parametrize(
    ("s0", "s1"), covering([(0, 1), (6, 7), (0, 2**31)], [(0, 1), (0, 2**31)], unpack=True)
)
def test_streams_of_seeds_one_bit_apart_are_unrelated(s0, s1):
    """The raw streams of two keys whose words differ in one bit agree on each of the 32
    bit positions half the time (4 sigma), and their 16-bit fields are uncorrelated."""
    n = 1 << 20
    a, b = (np.asarray(_fast_mask.random_bits(jax.random.key(s), (n,))) for s in (s0, s1))
    agree = 1 - ((a ^ b)[:, None] >> np.arange(32, dtype=np.uint32) & 1).mean(axis=0)
    assert np.all(np.abs(agree - 0.5) < 4 * 0.5 / np.sqrt(n)), agree
    fields = [(w & 0xFFFF).astype(np.float64) for w in (a, b)]
    assert abs(np.corrcoef(*fields)[0, 1]) < 4 / np.sqrt(n)


def test_raw_bytes_are_uniform():
    bits = np.asarray(_fast_mask.random_bits(jax.random.key(5), (1 << 20,)))
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
    # Seeds one bit apart give key words one bit apart: the generator hashes no key.
    for s0, s1 in ((0, 1), (0, 2**31)):
        pairs[f"seeds {s0} and {s1}"] = tuple(
            np.asarray(dropmask.keep_mask(jax.random.key(s), shape, rate)) for s in (s0, s1)
        )

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


@pytest.mark.parametrize("rate", [0.5, 0.1, 0.3])
def test_no_dependence_across_the_word_layout(rate):
    """Lanes of one word, the same lane of neighbouring words, and lanes fed by
    neighbouring Threefry calls (8 apart at 16 bits per element) are independent, and
    every lane keeps at the same rate."""
    m = np.asarray(dropmask.keep_mask(jax.random.key(78), (2048, 1024), rate))
    lanes = m.reshape(2048, 32, 32)  # [row, word, lane]
    pairs = {
        "lanes 0 and 1 of a word": (lanes[:, :, 0], lanes[:, :, 1]),
        "lanes 7 and 8 (neighbouring calls)": (lanes[:, :, 7], lanes[:, :, 8]),
        "lane 0 and lane 31": (lanes[:, :, 0], lanes[:, :, 31]),
        "same lane, neighbouring words": (lanes[:, :-1, 5], lanes[:, 1:, 5]),
        "last lane of a word, first of the next": (lanes[:, :-1, 31], lanes[:, 1:, 0]),
    }
    for name, (a, b) in pairs.items():
        assert _independent(a.ravel(), b.ravel()) > P_4SIGMA, name
    per_lane = lanes.reshape(-1, 32).mean(axis=0)
    sigma = np.sqrt(rate * (1 - rate) / (2048 * 32))
    assert np.all(np.abs(per_lane - (1 - rate)) < 4.5 * sigma), per_lane


def test_broadcast_masks_exactly_shared():
    m = np.asarray(dropmask.keep_mask(jax.random.key(1), (16, 32, 8), 0.3, broadcast_dims=(1,)))
    np.testing.assert_array_equal(m, np.broadcast_to(m[:, :1], m.shape))


def test_too_many_words_error():
    def draw(shape):
        return jax.eval_shape(lambda k: dropmask.keep_mask(k, shape, 0.5), jax.random.key(0))

    draw((1 << 16, 1 << 16))  # 2**32 elements are 2**27 words: fine
    with pytest.raises(ValueError, match="2\\*\\*32 words"):
        draw((1 << 16, 1 << 21))


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


@pytest.mark.parametrize("shape", [(3, 70), (3, 70, 1), (5,), (2, 1, 33), (4, 1, 1), (2, 3, 64, 1)])
def test_packed_keep_words_are_the_mask_bits(shape):
    words = _fast_mask.key_words(jax.random.key(5))
    thr = _fast_mask.threshold(0.9)
    packed = np.asarray(
        jax.jit(_fast_mask.packed_keep_words, static_argnums=(1, 2))(words, shape, thr)
    )
    axis = _fast_mask.packing_axis(shape)
    assert packed.shape == tuple(-(-d // 32) if i == axis else d for i, d in enumerate(shape))
    assert packed.dtype == np.uint32
    lanes = np.moveaxis((packed[..., None] >> np.arange(32, dtype=np.uint32)) & 1, -1, axis + 1)
    unpacked = lanes.reshape(packed.shape[:axis] + (-1,) + packed.shape[axis + 1 :])
    unpacked = np.take(unpacked, np.arange(shape[axis]), axis=axis).astype(bool)
    expected = np.asarray(_fast_mask.keep_from_words(words, shape, thr, path="per_element"))
    np.testing.assert_array_equal(unpacked, expected)


def test_packed_keep_words_join_without_a_reduction():
    # Joined by a reduction over a trailing axis of a word's 4 parts, XLA:CPU ran the
    # rounds 4 lanes wide and the generator took twice as long.
    thr = _fast_mask.threshold(0.9)
    fn = jax.jit(lambda w: _fast_mask.packed_keep_words(w, (64, 256), thr))
    hlo = fn.lower(_fast_mask.key_words(jax.random.key(0))).compile().as_text()
    assert " reduce(" not in hlo


def test_every_mask_caller_goes_through_the_one_entry_point(monkeypatch):
    from dropmask._random import _draw

    specs = []
    entry = _draw._entry

    def spy(spec, combine, *args):
        hash(spec)  # the static spec keys the jit cache
        specs.append(spec)
        return entry(spec, combine, *args)

    monkeypatch.setattr(_draw, "_entry", spy)
    x, key, tokens = jnp.ones((4, 40)), jax.random.key(0), jnp.zeros((4, 40), jnp.int32)
    calls = [
        lambda r, impl: dropmask.dropout(x, r, key, impl=impl),
        lambda r, impl: dropmask.drop_path(x, r, key, impl=impl),
        lambda r, impl: dropmask.alpha_dropout(x, r, key, impl=impl),
        lambda r, impl: dropmask.word_dropout(tokens, r, key, unk_id=1, impl=impl),
        lambda r, impl: dropmask.keep_mask(key, x.shape, r, impl=impl),
        lambda r, impl: dropmask.dot_product_attention(
            x[None, :, None, :],
            x[None, :, None, :],
            x[None, :, None, :],
            dropout_rate=r,
            key=key,
            deterministic=False,
            impl=impl,
        ),
    ]
    for call in calls:
        for impl in ("fast", "flax"):
            for rate in (0.3, jnp.float32(0.3)):
                before = len(specs)
                call(rate, impl)
                assert len(specs) == before + 1
                assert specs[-1].impl == impl
                assert (specs[-1].value is None) == (impl == "flax" or not isinstance(rate, float))


# Fast: each generator once, a static and a run-time rate in turn.
@pytest.mark.parametrize(
    ("impl", "rate"),
    covering(
        [(i, r) for i in ("fast", "flax") for r in (0.3, "traced")],
        [("fast", 0.3), ("flax", "traced")],
        unpack=True,
    ),
)
def test_keep_mask_is_the_mask_every_variant_applies(rate, impl):
    x, key = jnp.ones((8, 40)), jax.random.key(6)
    r = jnp.float32(0.3) if rate == "traced" else rate
    mask = np.asarray(dropmask.keep_mask(key, x.shape, r, impl=impl))
    np.testing.assert_array_equal(np.asarray(dropmask.dropout(x, r, key, impl=impl)) != 0, mask)
    tokens = jnp.ones((8, 40), jnp.int32)
    words = np.asarray(dropmask.word_dropout(tokens, 1 - r, key, unk_id=0, impl=impl))
    assert 0 < (words == 0).mean() < 1


# A static rate and a run-time one: the program's structure is the same for every
# static value.
@pytest.mark.parametrize("keep", [0.9, jnp.float32(0.7)], ids=["static", "traced"])
def test_packed_paths_hold_one_copy_of_the_rounds(keep, monkeypatch):
    """A word's four Threefry calls are spread over its four byte parts, so a mask's
    program holds the rounds once, static rate or run-time; on CPU the parts come out of
    a fusion of their own (not fused into, and so recomputed for, every element), with
    no ``cond``; the masks are the per-element path's bit for bit."""
    words = _fast_mask.key_words(jax.random.key(0))
    thr = _fast_mask.threshold(keep)
    assert _fast_mask.FIELDS.calls == 4 and _fast_mask.FIELDS.parts == 4
    traced = []
    real = _fast_mask.threefry4x32
    monkeypatch.setattr(
        _fast_mask, "threefry4x32", lambda *a, **k: traced.append(1) or real(*a, **k)
    )
    for path in ("packed", "packed_inline"):
        jax.clear_caches()
        traced.clear()
        jax.make_jaxpr(lambda w, p=path: _fast_mask.keep_from_words(w, (8, 256), thr, path=p))(
            words
        )
        assert len(traced) == 1, path
    x = jnp.ones((8, 256))
    apply = jax.jit(lambda w, x: jnp.where(_fast_mask.keep_from_words(w, (8, 256), thr), x, 0.0))
    hlo = apply.lower(words, x).compile().as_text()
    assert " conditional(" not in hlo
    assert any(" fusion(" in line and "= u8[8,32]" in line for line in hlo.splitlines()), hlo
    for path in ("packed", "packed_inline"):
        np.testing.assert_array_equal(
            _fast_mask.keep_from_words(words, (8, 256), thr, path=path),
            _fast_mask.keep_from_words(words, (8, 256), thr, path="per_element"),
        )


def test_a_traced_rate_compiles_to_the_program_of_a_static_one():
    """A run-time rate's site holds the same generator as a static one's: the same
    compiled count of every op the rounds and the packing use; what it adds is the
    threshold and the scale computed from the rate, a few dozen scalar ops, and one
    elementwise add that gives dropped elements the rate's fill (0, or NaN for an
    invalid rate; ``_dropout.dropped_value``)."""

    def count(rate):
        def loss(x, key, r):
            y = dropmask.dropout(x, r if rate is None else rate, key)
            return jnp.sum(y * y)

        args = (jnp.ones((8, 128, 512)), jax.random.key(0), jnp.float32(0.1))
        hlo = jax.jit(jax.grad(loss)).lower(*args).compile().as_text()
        return collections.Counter(re.findall(r"= \S+ ([a-z][\w-]*)\(", hlo))

    static, traced = count(0.1), count(None)
    for op in ("xor", "or", "shift-left", "shift-right-logical"):
        assert traced[op] == static[op], (op, static[op], traced[op])
    assert traced["add"] == static["add"] + 1, (static["add"], traced["add"])
    assert sum(traced.values()) <= sum(static.values()) + 64, (static, traced)


# Fast: a small, the middle and an odd rate (test_one_precision_for_every_rate checks
# the threshold static and traced at the others' rates); the rest are slow.
@pytest.mark.parametrize(
    "rate",
    covering([0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.123456789], [0.05, 0.5, 0.123456789]),
)
def test_a_static_rate_and_the_same_rate_as_a_jax_scalar_draw_the_same_mask(rate):
    x, key = jax.random.normal(jax.random.key(1), (16, 300)), jax.random.key(2)
    static = dropmask.dropout(x, rate, key)
    np.testing.assert_array_equal(static, dropmask.dropout(x, jnp.float32(rate), key))
    jitted = jax.jit(lambda x, r: dropmask.dropout(x, r, key))(x, jnp.float32(rate))
    np.testing.assert_array_equal(static, jitted)
    np.testing.assert_array_equal(
        dropmask.keep_mask(key, x.shape, rate), dropmask.keep_mask(key, x.shape, jnp.float32(rate))
    )


def test_key_words_are_the_keys_own_words_and_two_spread_ones():
    """A Threefry key's words ``(k0, k1)`` give the generator's key ``(k0, k1, k0 ^
    0x9E3779B9, k1 ^ 0xBB67AE85)``, derived inside the generator's computation from the
    two words alone (raw and typed keys alike); other impls hand over
    ``jax.random.bits(key, (4,), uint32)``."""
    for seed in (0, 1, 7, 2**31 + 5):
        key = jax.random.key(seed)
        k0, k1 = (int(w) for w in jax.random.key_data(key))
        want = np.array([k0, k1, k0 ^ 0x9E3779B9, k1 ^ 0xBB67AE85], np.uint32)
        source = _fast_mask.key_source(key)
        assert source.shape == (2,)
        got = jax.jit(lambda s: jnp.stack(_fast_mask._words(s)))(source)
        np.testing.assert_array_equal(np.asarray(got), want)
        np.testing.assert_array_equal(_fast_mask.key_words(jax.random.PRNGKey(seed)), want)
    rbg = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(
        np.asarray(_fast_mask.key_source(rbg)), np.asarray(jax.random.bits(rbg, (4,), jnp.uint32))
    )
    np.testing.assert_array_equal(_fast_mask.key_source(rbg), _fast_mask.key_words(rbg))


def test_a_dropout_site_compiles_no_loop_of_its_own_for_the_key_words():
    """JAX lowers its Threefry hash on CPU to a loop that XLA compiles as a separate
    small kernel at every call site; the mask's key words are derived inside the
    generator's own computation instead, so a site holds no loop at all (and no
    ``cond``: the packed flags are kept apart by a division, not a conditional)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the loop lowering is XLA:CPU's")
    x, key = jnp.ones((512, 2048)), jax.random.key(0)
    hlo = jax.jit(lambda x, k: dropmask.dropout(x, 0.1, k)).lower(x, key).compile().as_text()
    assert hlo.count(" while(") == 0, hlo
    assert hlo.count(" conditional(") == 0, hlo
    assert 'xla_cpu_small_call="true"' not in hlo


def test_generator_constants_are_literals_not_broadcasts():
    # The rounds' constants and key words enter the jaxpr as scalar operands: no
    # broadcast equation to trace, or for a differentiated scan to compute before its
    # loop. Broadcast once per constant, one site's generator traced 272 equations;
    # now 202.
    words = _fast_mask.key_source(jax.random.key(0))
    index = jnp.zeros((4, 8, 16), jnp.uint32)
    for value, static in ((None, 58982), (jnp.uint32(58982), None)):
        jaxpr = _fast_mask._jitted_flags.trace(words, index, index, value, static, True).jaxpr
        names = [eqn.primitive.name for eqn in jaxpr.eqns]
        assert "broadcast_in_dim" not in names
        assert len(names) <= 210


def test_threefry_broadcasts_counters_and_keys_of_different_shapes():
    rows = jnp.arange(4, dtype=jnp.uint32)[:, None]
    cols = jnp.arange(8, dtype=jnp.uint32)[None, :]
    key = jnp.arange(3, dtype=jnp.uint32)[:, None, None]
    got = threefry4x32((rows, cols, 0, 0), (key, 2, 3, 4))
    full = [jnp.broadcast_to(a, (3, 4, 8)) for a in (rows, cols, jnp.uint32(0), key)]
    want = threefry4x32((full[0], full[1], full[2], full[2]), (full[3], 2, 3, 4))
    for g, w in zip(got, want, strict=True):
        assert g.shape == (3, 4, 8)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
