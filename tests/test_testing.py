"""dropmask.testing: the internals hook gives the library's own masks, not copies."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dropmask
from dropmask import testing


def _unpack(words: jax.Array, shape: tuple[int, ...]) -> np.ndarray:
    bits = (np.asarray(words)[..., None] >> np.arange(testing.LANES, dtype=np.uint32)) & 1
    return bits.reshape(*bits.shape[:-2], -1)[..., : shape[-1]].astype(bool)


# Each shape (the words' layout) and each rate (the threshold the bits are compared
# with) once: the hook hands over the library's words, whatever the two are.
@pytest.mark.parametrize(
    ("rate", "shape"), [(0.1, (3, 64)), (0.5, (2, 5, 40)), (0.013, (7,))], ids=str
)
def test_packed_words_are_the_keep_mask(rate: float, shape: tuple[int, ...]) -> None:
    key = jax.random.key(11)
    words = testing.packed_mask_words(key, shape, rate)
    assert words.dtype == jnp.uint32
    assert words.shape == (*shape[:-1], -(-shape[-1] // testing.LANES))
    np.testing.assert_array_equal(
        _unpack(words, shape), np.asarray(dropmask.keep_mask(key, shape, rate))
    )


@pytest.mark.parametrize("path", testing.PATHS)
def test_every_path_draws_the_same_mask_and_dropout(path: str) -> None:
    key = jax.random.key(3)
    x = jax.random.normal(jax.random.key(1), (4, 96), jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda k: testing.path_keep_mask(k, x.shape, 0.2, path=path))(key)),
        np.asarray(dropmask.keep_mask(key, x.shape, 0.2)),
    )
    got = jax.jit(lambda x, k: testing.path_dropout(x, 0.2, k, path=path))(x, key)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(dropmask.dropout(x, 0.2, key)))
    grad = jax.jit(jax.grad(lambda x: jnp.sum(testing.path_dropout(x, 0.2, key, path=path))))(x)
    want = jax.jit(jax.grad(lambda x: jnp.sum(dropmask.dropout(x, 0.2, key))))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(want))


def test_threshold() -> None:
    t = testing.threshold(0.9)
    assert t.value == round(0.9 * 2**16) and t.realised == t.value / 2**16
    assert abs(t.realised - 0.9) <= 2**-17


def test_key_words_and_threefry_make_the_raw_stream() -> None:
    key = jax.random.key(9)
    words = testing.key_words(key)
    assert words.shape == (4,) and words.dtype == jnp.uint32
    zero = jnp.zeros((), jnp.uint32)
    block = testing.threefry4x32((jnp.uint32(1), zero, zero, zero), [words[i] for i in range(4)])
    bits = testing.random_bits(key, (8,))
    np.testing.assert_array_equal(np.asarray(bits[4:]), np.asarray(jnp.stack(block)))


def _tile(shape, *, words=None, rows=None):
    words = testing.key_words(jax.random.key(0)) if words is None else words
    rows = np.zeros((shape[0], 1), np.uint32) if rows is None else rows
    return testing.tpu_keep_tile(words, testing.threshold(0.9).value, rows, 0, shape)


@pytest.mark.parametrize("row_words", ["a column", "a row"])
def test_tpu_keep_tile_is_the_mask_at_any_tile_offset(row_words) -> None:
    key, shape = jax.random.key(3), (40, 256)
    want = np.asarray(dropmask.keep_mask(key, shape, 0.3))
    rows = np.arange(16, 40, dtype=np.uint32) * np.uint32(256 // 32)
    rows = rows[:, None] if row_words == "a column" else rows[None, :]
    tile = testing.tpu_keep_tile(
        testing.key_words(key), testing.threshold(0.7).value, rows, 2, (24, 64)
    )
    np.testing.assert_array_equal(np.asarray(tile), want[16:40, 64:128])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: testing.packed_mask_words(jax.random.key(0), (4, 32), 0.0), "value", "0, 1"),
        (lambda: testing.packed_mask_words(jax.random.key(0), (4, 32), 1.5), "rate", "rate"),
        (lambda: testing.packed_mask_words(jax.random.key(0), (4.0, 32), 0.1), "type", "shape"),
        (
            lambda: testing.path_keep_mask(jax.random.key(0), (4, 32), 0.1, path="x"),
            "value",
            "path",
        ),
        (
            lambda: testing.path_dropout(jnp.ones(4), 0.1, jax.random.key(0), path="x"),
            "value",
            "path",
        ),
        (lambda: _tile((8, 100)), "value", "multiple of 32"),
        (lambda: _tile((8, 128), words=testing.key_words(jax.random.key(0))[:3]), "value", "four"),
        (lambda: _tile((8, 128), rows=np.zeros((8,), np.uint32)), "value", "row_words"),
    ],
)
def test_bad_arguments_raise_dropmask_errors(call, error: str, match: str) -> None:
    kind = {
        "value": dropmask.DropmaskValueError,
        "type": dropmask.DropmaskTypeError,
        "rate": dropmask.RateError,
    }[error]
    with pytest.raises(kind, match=match):
        call()


@pytest.mark.parametrize(
    ("path", "residual", "per_element"),
    [
        ("packed", "mask", 0.125),
        ("packed_inline", "mask", 0.125),
        ("packed", "none", 0.0),
        ("per_element", "mask", 0.0),  # no words to keep: drawn again
    ],
)
def test_path_dropout_keeps_what_its_residual_says(
    path: str, residual: str, per_element: float
) -> None:
    key = jax.random.key(2)

    def residual_bytes(n: int) -> int:
        x = jax.ShapeDtypeStruct((n, 256), jnp.float32)
        closure = jax.eval_shape(
            lambda x: jax.vjp(
                lambda x: testing.path_dropout(x, 0.1, key, path=path, residual=residual), x
            )[1],
            x,
        )
        return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(closure))

    growth = (residual_bytes(64) - residual_bytes(32)) / (32 * 256)
    assert growth == pytest.approx(per_element, abs=1e-9)
    x = jax.random.normal(jax.random.key(1), (8, 256))
    grad = jax.grad(
        lambda x: jnp.sum(testing.path_dropout(x, 0.1, key, path=path, residual=residual) ** 2)
    )(x)
    want = jax.grad(lambda x: jnp.sum(dropmask.dropout(x, 0.1, key) ** 2))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(want))


def test_mask_name_is_the_one_policies_use() -> None:
    assert testing.MASK_NAME == "dropout_mask"
    assert testing.MASK_NAME is dropmask.DROPOUT_MASK_NAME
    with pytest.raises(dropmask.DropmaskValueError, match="residual"):
        testing.path_dropout(jnp.ones(4), 0.1, jax.random.key(0), path="packed", residual="x")
