"""The TPU kernel (``_random/_tpu_mask.py``) run in Pallas's TPU interpreter on a CPU.

Inside ``dropmask.testing.tpu_kernels()`` (and by default on a TPU with one device)
dropout draws its mask in the kernel; every output, gradient, tangent and batched result
must equal the default path's bit for bit, on the shapes the kernel serves and on those
it hands back (to the flags kernel's bytes, ``test_tpu_flags.py``, or XLA's path).
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from tests.covering import covering

import dropmask
from dropmask import _random, testing
from dropmask import linen as dl
from dropmask._random import _placement, _tpu_mask, threshold

KEY = jax.random.key(5)
RATE = 0.1
SERVED = [
    ((4, 32, 256), "float32"),  # a block narrower than the kernel's 1024 columns
    ((64, 1024), "bfloat16"),
    ((2, 16, 5120), "float32"),  # column blocks of 2048, the last one partial
    ((48, 384), "float32"),  # rows not a multiple of 32: chunks of 16
    ((3, 197, 256), "bfloat16"),  # ViT's 197 tokens: the block's last chunk padded
    ((2, 1, 4096), "float32"),  # one row: a chunk of 32, 31 of them padding
    ((2, 3, 77, 128), "float32"),  # rank 4, 77 rows
    ((2, 3000, 512), "float32"),  # row blocks of 1024: the third partial (952 rows)
    ((128,), "bfloat16"),  # rank 1
]
FALLBACK = [((3, 100), "float32"), ((7, 96), "bfloat16"), ((3, 128, 1), "float32")]
FALLBACK_DTYPE = [((64, 128), "float16"), ((64, 128), "complex64")]


def _x(shape, dtype):
    return jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(dtype)


def _uses_kernel(f, *args):
    return "dropmask_tpu_masked_linear" in str(jax.make_jaxpr(f)(*args))


def _dropout(x):
    return dropmask.dropout(x, RATE, KEY)


def _loss(x):
    w = jnp.cos(jnp.arange(x.size, dtype=jnp.float32)).reshape(x.shape)
    return jnp.sum(_dropout(x).astype(jnp.float32) * w)


# Fast: partial chunks, row blocks and column blocks, rank 1, a fallback by shape and
# by each dtype; the slow cases repeat those layouts at other sizes and ranks.
FAST_CASES = [
    ((2, 16, 5120), "float32"),
    ((48, 384), "float32"),
    ((3, 197, 256), "bfloat16"),
    ((2, 3000, 512), "float32"),
    ((128,), "bfloat16"),
    ((3, 100), "float32"),
    *FALLBACK_DTYPE,
]


@pytest.mark.parametrize(
    ("shape", "dtype"), covering(SERVED + FALLBACK + FALLBACK_DTYPE, FAST_CASES, unpack=True)
)
def test_the_kernel_gives_the_default_paths_outputs_and_gradients(shape, dtype):
    x = _x(shape, dtype)
    want, want_grad = _dropout(x), jax.grad(_loss)(x) if dtype != "complex64" else None
    with testing.tpu_kernels():
        served = _uses_kernel(_dropout, x)
        got = _dropout(x)
        got_grad = jax.grad(_loss)(x) if dtype != "complex64" else None
    assert served == ((shape, dtype) in SERVED)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    if want_grad is not None:
        np.testing.assert_array_equal(np.asarray(got_grad), np.asarray(want_grad))


def test_tangents_batches_and_run_time_rates_equal_the_default_path():
    x = _x((32, 256), "float32")
    keys = jax.random.split(KEY, 3)
    tangent = lambda x: jax.jvp(_dropout, (x,), (2 * x,))  # noqa: E731
    batched = jax.vmap(lambda k: dropmask.dropout(x, RATE, k))
    traced = jax.jit(lambda r: dropmask.dropout(x, r, KEY))
    want = (tangent(x), batched(keys), traced(jnp.float32(0.3)), traced(jnp.float32(1.5)))
    with testing.tpu_kernels():
        assert _uses_kernel(lambda r: dropmask.dropout(x, r, KEY), jnp.float32(0.3))
        got = (tangent(x), batched(keys), traced(jnp.float32(0.3)), traced(jnp.float32(1.5)))
    assert bool(jnp.isnan(got[3]).all())  # a run-time rate outside [0, 1]: NaN, not clipped
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_kernel_that_fails_to_lower_falls_back_to_the_same_bits(monkeypatch):
    def broken(*args, **kwargs):
        raise NotImplementedError("no such Mosaic op")

    x = _x((32, 256), "float32")
    want = jax.jit(_dropout)(x)
    monkeypatch.setattr(_tpu_mask, "_pallas", broken)
    with testing.tpu_kernels():
        assert _uses_kernel(_dropout, x)
        got = jax.jit(_dropout)(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_layers_draw_through_the_kernel():
    x = _x((2, 16, 256), "bfloat16")
    layer = dl.Dropout(RATE, deterministic=False)
    apply = lambda x: layer.apply({}, x, rngs={"dropout": KEY})  # noqa: E731
    want = apply(x)
    with testing.tpu_kernels():
        assert _uses_kernel(apply, x)
        got = apply(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_kernel_is_off_by_default_off_a_tpu():
    x = _x((32, 256), "float32")
    assert not _uses_kernel(_dropout, x)


@pytest.fixture
def pretend_tpu(monkeypatch):
    """JAX's default backend reported as a TPU with ``devices`` devices (the kernel still
    runs in the interpreter), JAX's caches cleared around it: the choice is made when a
    mask is traced."""

    def pretend(devices):
        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
        monkeypatch.setattr(jax, "device_count", lambda: devices)
        jax.clear_caches()

    yield pretend
    jax.clear_caches()


# Fast: the default on a TPU; turned off there (slow), the choice is in
# test_leaving_tpu_kernels_restores_the_choice_for_the_next_trace, the values XLA's own.
@pytest.mark.parametrize(
    ("devices", "enabled", "served"),
    covering(
        [
            (1, None, True),  # the default on a TPU
            (8, None, True),  # with any number of devices
            (1, False, False),
            (8, True, True),
        ],
        [(1, None, True)],
        unpack=True,
    ),
)
def test_the_default_draws_by_the_kernel_on_a_tpu(pretend_tpu, devices, enabled, served):
    x = _x((32, 256), "float32")
    want, want_grad = _dropout(x), jax.grad(_loss)(x)
    pretend_tpu(devices)
    with contextlib.nullcontext() if enabled is None else testing.tpu_kernels(enabled):
        assert _placement.tpu_kernels_run() == served
        assert _uses_kernel(_dropout, x) == served
        got, got_grad = jax.jit(_dropout)(x), jax.grad(_loss)(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_grad), np.asarray(want_grad))


def test_leaving_tpu_kernels_restores_the_choice_for_the_next_trace(pretend_tpu):
    x = _x((32, 256), "float32")
    pretend_tpu(1)
    with testing.tpu_kernels(False):
        assert not _uses_kernel(_dropout, x)
        with testing.tpu_kernels():
            assert _uses_kernel(_dropout, x)
        assert not _uses_kernel(_dropout, x)
    assert _uses_kernel(_dropout, x)


@pytest.mark.skipif(not hasattr(jax, "make_user_context"), reason="clears caches instead")
def test_a_function_jitted_outside_is_traced_once_more_inside_and_kept_for_both():
    traces = []

    @jax.jit
    def f(x):
        traces.append(_placement.tpu_kernels_run())
        return _dropout(x)

    x = _x((32, 256), "float32")
    outside = f(x)
    with testing.tpu_kernels():
        inside = f(x)
    f(x)
    with testing.tpu_kernels():
        f(x)
    assert traces == [False, True]  # one trace each way, each kept for the next call
    np.testing.assert_array_equal(np.asarray(inside), np.asarray(outside))


@pytest.mark.parametrize("enabled", ["yes", 1, None])
def test_tpu_kernels_refuses_an_enabled_that_is_not_a_bool(enabled):
    with pytest.raises(dropmask.DropmaskTypeError) as err:
        testing.tpu_kernels(enabled)
    msg = str(err.value)
    assert msg.startswith("tpu_kernels: enabled must be a bool, got ")
    assert "Pass True to draw by the TPU kernel, False to draw by XLA's path." in msg


@pytest.mark.parametrize(
    ("shape", "dtype", "served"),
    [
        ((8, 1024), "float32", True),  # 8 rows: one chunk of 32, padded
        ((16, 1024), "float32", True),
        ((32, 200), "float32", False),  # not whole vector registers
        ((32, 128), "float64", False),
        ((0, 128), "float32", False),
        ((), "float32", False),
    ],
)
def test_kernel_for_serves_whole_registers_of_float32_and_bfloat16(shape, dtype, served):
    kernel = _tpu_mask.kernel_for(shape, jnp.dtype(dtype), threshold(0.9))
    assert (kernel is not None) == served
    if kernel is not None:
        rows, cols = kernel.block
        assert rows % kernel.chunk == 0 and cols % 128 == 0
        assert rows >= min(shape[0], 32)


@pytest.mark.parametrize("layout", ["calls along lanes", "rows along lanes", "transposed"])
@pytest.mark.parametrize("cols", covering([128, 256, 1024], [256]))
def test_keep_tile_is_the_fast_masks_tile_in_every_layout(layout, cols):
    """The delivery the kernels share: a tile of rows at any word offset, its calls laid
    out by ``row_word``'s shape, given either way round."""
    key, shape = jax.random.key(11), (3, 40, 2 * cols)
    want = np.asarray(dropmask.keep_mask(key, shape, 0.5)).reshape(120, 2 * cols)[8:40, cols:]
    words = [w for w in _random.key_words(key)]
    on_lanes = layout != "calls along lanes"
    rows = lax.broadcasted_iota(np.uint32, (1, 32) if on_lanes else (32, 1), 1 if on_lanes else 0)
    row_word = (rows + np.uint32(8)) * np.uint32(2 * cols // 32)
    thr = np.int32(_random.threshold(0.5).value)  # keep_mask takes the rate
    transposed = layout == "transposed"
    got = _random.keep_tile(
        words, thr, row_word, np.uint32(cols // 32), (32, cols), transposed=transposed
    )
    np.testing.assert_array_equal(np.asarray(got).T if transposed else got, want)


@pytest.mark.parametrize(
    ("rows", "cols", "dtype", "chunk"),
    [
        (197, 256, "float32", 128),  # 197 rows of 256 columns: 256 x 32 calls, not 224 x 128
        (197, 768, "bfloat16", 128),
        (48, 384, "float32", 16),  # 128 rows would pad 48 too far
        (8, 1024, "float32", 32),  # a whole delivery a row: its calls fill the lanes
        (130, 768, "float32", 32),
    ],
)
def test_a_narrow_block_is_drawn_with_its_rows_along_lanes_where_that_computes_less(
    rows, cols, dtype, chunk
):
    kernel = _tpu_mask.kernel_for((2, rows, cols), jnp.dtype(dtype), threshold(0.9))
    assert kernel is not None and kernel.chunk == chunk
    assert kernel.narrow == (chunk == 128)
    assert kernel.block[0] % chunk == 0


def _uses_bytes(f, *args):
    jaxpr = str(jax.make_jaxpr(f)(*args))
    return "dropmask_tpu_bytes_linear" in jaxpr and "dropmask_tpu_masked_linear" not in jaxpr


@pytest.mark.parametrize(("shape", "dtype"), [((64, 256), "float32"), ((2, 77, 384), "bfloat16")])
def test_differentiated_dropout_selects_bytes_by_xla_and_keeps_only_the_key(shape, dtype):
    """Alone, the dropout kernel; under ``grad`` and ``jvp``, the flags kernel's bytes
    selected by XLA in both passes (fusible with the ops around them), the same values,
    and the backward pass keeps the key's words and threshold, nothing of ``x``'s size."""
    x = _x(shape, dtype)
    tangent = lambda x: jax.jvp(_dropout, (x,), (jnp.cos(x),))  # noqa: E731
    want = (_dropout(x), tangent(x), jax.grad(_loss)(x))
    with testing.tpu_kernels():
        assert _uses_kernel(_dropout, x)
        assert _uses_bytes(jax.grad(_loss), x)
        assert _uses_bytes(tangent, x)
        got = (_dropout(x), tangent(x), jax.grad(_loss)(x))
        _, vjp = jax.vjp(_dropout, x)
    assert [leaf.shape for leaf in jax.tree.leaves(vjp)] == [(4,)]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_differentiated_bytes_under_vmap_and_a_run_time_rate_equal_the_default_path():
    """Per-example gradients (``vmap`` of ``grad``, over ``x`` and over keys) and a traced
    rate, through the bytes: the default path's values."""
    x = _x((3, 64, 256), "float32")
    keys = jax.random.split(KEY, 3)

    def loss(x, key, rate):
        return jnp.sum(jnp.sin(dropmask.dropout(x, rate, key)))

    per_x = jax.vmap(jax.grad(loss), in_axes=(0, None, None))
    per_key = jax.vmap(jax.grad(loss), in_axes=(None, 0, None))
    traced = jax.jit(jax.grad(loss))
    run = lambda: (per_x(x, KEY, 0.1), per_key(x[0], keys, 0.1), traced(x, KEY, jnp.float32(0.3)))  # noqa: E731
    want = run()
    with testing.tpu_kernels():
        assert _uses_bytes(per_x, x, KEY, 0.1)
        got = run()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_the_kernel_lowers_for_a_tpu_rather_than_falling_back(lowering_for_a_tpu):
    """Lowered for a TPU on this CPU: the kernels' custom calls, not the XLA path their
    lowering falls back to; differentiated, the flags kernel's in each pass, with no
    ``optimization_barrier`` (a checkpoint's) to keep XLA from fusing the selects."""
    key = jax.random.key(0)

    def loss(x, rate):
        return jnp.sum(dropmask.dropout(x, rate, key).astype(jnp.float32))

    for dtype, rate in [(jnp.float32, 0.1), (jnp.bfloat16, jnp.float32(0.3))]:
        x = jnp.ones((256, 2048), dtype)
        with testing.tpu_kernels():
            lowered = jax.export.export(jax.jit(jax.value_and_grad(loss)), platforms=["tpu"])
            text = lowered(x, rate).mlir_module()
            alone = jax.export.export(jax.jit(loss), platforms=["tpu"])(x, rate).mlir_module()
        assert alone.count("tpu_custom_call(") == 1, dtype
        assert text.count("tpu_custom_call(") == 2, dtype  # forward and backward
        assert "optimization_barrier" not in text, dtype
