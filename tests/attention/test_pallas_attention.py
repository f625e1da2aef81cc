"""dot_product_attention(algorithm="pallas") against the dense path, in Pallas's
interpreter: the same dropout flags element by element, the same values and gradients,
the same NaN contract; the kernels lower to Triton for a GPU."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dropmask as dm
from dropmask._attention import _blockwise as bw
from dropmask._attention import _flash_triton as pa
from dropmask._attention import _kernel_inputs as ki

TOL = {"rtol": 1e-5, "atol": 1e-6}
SLOW = pytest.mark.slow
B, LQ, LK, H, D = 2, 13, 70, 2, 4  # 70 keys: two whole mask words and part of a third


def _qkv(seed, b=B, lq=LQ, lk=LK, h=H, kv_heads=H, d=D, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, lq, h, d)).astype(dtype)
    k = rng.normal(size=(b, lk, kv_heads, d)).astype(dtype)
    v = rng.normal(size=(b, lk, kv_heads, d)).astype(dtype)
    return q, k, v


def _attend(algorithm, q, k, v, block_k=None, **kw):
    return dm.dot_product_attention(q, k, v, algorithm=algorithm, block_k=block_k, **kw)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 4, 5, 6))
def _dropped_weights(algorithm, block_k, broadcast, key, lq=LQ, lk=LK, h=H):
    """The weights dropout leaves, read off the output: with ``v`` the identity over
    keys, ``out[..., q, h, j]`` is query ``q``'s dropped weight on key ``j``."""
    q, k, _ = _qkv(4, lq=lq, lk=lk, h=h, kv_heads=h)
    v = jnp.broadcast_to(jnp.eye(lk, dtype=jnp.float32)[None, :, None], (B, lk, h, lk))
    out = _attend(
        algorithm, q, k, v, block_k, dropout_rate=0.5, deterministic=False, key=key,
        broadcast_dropout=broadcast,
    )  # fmt: skip
    return jnp.moveaxis(out, -2, -3)  # [b, h, q, k]


@pytest.mark.parametrize("broadcast", [True, False])
def test_drops_exactly_the_dense_paths_weights(broadcast):
    key = jax.random.key(5)
    keep = dm.keep_mask(key, (B, H, LQ, LK), 0.5, broadcast_dims=(0, 1) if broadcast else ())
    dense = _dropped_weights("dense", None, broadcast, key)
    np.testing.assert_array_equal(dense != 0, keep)
    # block_k=32: one word per tile row (a call serves a row's lanes); 16: per weight.
    for block_k in (32, 16):
        got = _dropped_weights("pallas", block_k, broadcast, key)
        np.testing.assert_array_equal(got != 0, keep, err_msg=f"block_k={block_k}")
        np.testing.assert_allclose(got, dense, **TOL)


@pytest.mark.parametrize(("lq", "lk", "h"), [(13, 1, 2), (1, 1, 3)])
def test_masks_packed_along_queries_or_heads(lq, lk, h):
    """With one key the mask's words run along the queries, with one query and one key
    along the heads: the kernel finds the same flags."""
    key = jax.random.key(6)
    got = _dropped_weights("pallas", 16, False, key, lq, lk, h)
    want = _dropped_weights("dense", None, False, key, lq, lk, h)
    assert bool((want == 0).any()) and bool((want != 0).any())
    np.testing.assert_array_equal(got != 0, want != 0)
    np.testing.assert_allclose(got, want, **TOL)


def _loss(algorithm, kw, q, k, v):
    out = _attend(algorithm, q, k, v, **kw)
    weights = jax.lax.broadcasted_iota(jnp.float32, out.shape, out.ndim - 1)
    return jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)


@functools.partial(jax.jit, static_argnames=("algorithm", "options"))
def _value_and_grads(algorithm, options, arrays, q, k, v):
    kw = {**dict(options), **arrays}
    return jax.value_and_grad(functools.partial(_loss, algorithm, kw), (0, 1, 2))(q, k, v)


def _compare(q, k, v, tol=TOL, reference="dense", **kw):
    """Pallas and ``reference`` loss and gradients (dq, dk, dv) agree; returns Pallas's."""
    is_array = lambda x: isinstance(x, np.ndarray | jax.Array)  # noqa: E731
    options = tuple(sorted((n, x) for n, x in kw.items() if not is_array(x)))
    arrays = {n: x for n, x in kw.items() if is_array(x)}
    want = _value_and_grads(reference, options, arrays, q, k, v)
    got = _value_and_grads("pallas", options, arrays, q, k, v)
    pairs = [(got[0], want[0]), *zip(got[1], want[1], strict=True)]
    for a, b in pairs:
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)
    return got


DROP = {"dropout_rate": 0.3, "deterministic": False, "key": jax.random.key(1)}
SEGMENTS = {
    "q_segment_ids": np.repeat([[1, 2, 2, 3], [1, 1, 1, 0]], [4, 4, 4, 1], axis=1),
    "kv_segment_ids": np.repeat([[1, 2, 3, 0], [1, 1, 1, 0]], [20, 20, 20, 10], axis=1),
}
CASES = {
    # A partial last tile, and a row with no valid key (zeros, as on the dense path).
    "causal_lengths": {"is_causal": True, "kv_lengths": np.array([23, 0]), **DROP},
    "per_head_mask": {"broadcast_dropout": False, "block_q": 16, "block_k": 64, **DROP},
    "window_segments_kv_mask": {
        "window": (3, 9),
        "kv_mask": np.arange(LK)[None] % np.array([[3], [5]]) != 0,
        **SEGMENTS,
        **DROP,
    },
    "no_dropout": {"is_causal": True},
}


@pytest.mark.parametrize(
    "name",
    [n if n in ("causal_lengths", "no_dropout") else pytest.param(n, marks=SLOW) for n in CASES],
)
def test_values_and_gradients_match_dense(name):
    _compare(*_qkv(0), **CASES[name])


@pytest.mark.parametrize(
    "shape",
    [(B, 1, LQ, LK), pytest.param((LQ, LK), marks=SLOW), pytest.param((1, H, 1, LK), marks=SLOW)],
)
def test_dense_masks_broadcast_on_any_axis(shape):
    q, k, v = _qkv(13)
    mask = np.random.default_rng(14).random(shape) < 0.7
    if shape[-2] == LQ:
        mask[..., 3, :] = False  # a query with no valid key
    _compare(q, k, v, mask=mask, is_causal=True, broadcast_dropout=False, **DROP)


def test_grouped_query_heads():
    q, k, v = _qkv(2, h=4, kv_heads=2)
    _compare(q, k, v, is_causal=True, broadcast_dropout=False, **DROP)


def test_bf16_inputs_accumulate_in_float32():
    """bf16 in and out, float32 inside: near the float32 result."""
    q, k, v = _qkv(3)
    half = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
    attend = jax.jit(
        _attend, static_argnums=0, static_argnames=("is_causal", "deterministic", "dropout_rate")
    )
    out = attend("pallas", *half, is_causal=True, **DROP)
    assert out.dtype == jnp.bfloat16
    want = attend("dense", q, k, v, is_causal=True, **DROP)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2e-2, atol=2e-2)


@SLOW
def test_bf16_gradients_equal_the_blockwise_paths():
    """bf16 loss and gradients equal the blockwise path's (the same tile arithmetic) to
    bf16 round-off; the dense path rounds its weights to bf16, so it differs more."""
    half = [jnp.asarray(a, jnp.bfloat16) for a in _qkv(3)]
    tol = {"rtol": 1e-2, "atol": 1e-2}
    _, grads = _compare(*half, tol=tol, reference="blockwise", is_causal=True, **DROP)
    assert all(g.dtype == jnp.bfloat16 for g in grads)


def test_vmap_over_keys_equals_a_loop():
    q, k, v = _qkv(7)
    keys = jax.random.split(jax.random.key(8), 3)

    @jax.jit
    def attend(key):
        return _attend("pallas", q, k, v, dropout_rate=0.2, deterministic=False, key=key)

    batched = jax.vmap(attend)(keys)
    for i in range(len(keys)):
        np.testing.assert_allclose(batched[i], attend(keys[i]), **TOL)


def test_non_finite_inputs_reach_only_the_queries_that_may_see_them():
    q, k, v = _qkv(9)
    k[0, 5, 1, 2] = np.nan  # key 5: causal queries 5.. of batch 0, head 1 see it
    q[1, 2, 0, 0] = np.inf
    kw = {"is_causal": True, **DROP}
    attend = jax.jit(
        _attend, static_argnums=0, static_argnames=("is_causal", "deterministic", "dropout_rate")
    )
    got = np.asarray(attend("pallas", q, k, v, **kw))
    want = np.asarray(attend("dense", q, k, v, **kw))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 5:, 1]).all() and not np.isnan(got[0, :5]).any()
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], **TOL)
    grads = jax.jit(jax.grad(lambda k: jnp.nansum(_attend("pallas", q, k, v, **kw))))(k)
    assert np.isfinite(np.asarray(grads)).all()


def test_rates_zero_and_one_and_deterministic():
    q, k, v = _qkv(11)
    attend = jax.jit(_attend, static_argnums=0, static_argnames=("deterministic", "dropout_rate"))
    for rate, det in ((0.0, False), (0.5, True), (1.0, False)):
        kw = {"dropout_rate": rate, "deterministic": det, "key": jax.random.key(0)}
        np.testing.assert_allclose(
            attend("pallas", q, k, v, **kw), attend("dense", q, k, v, **kw), **TOL
        )


def test_run_time_rate_one_compilation_for_every_rate():
    q, k, v = _qkv(12)

    @functools.partial(jax.jit, static_argnums=0)
    def attend(algorithm, rate):
        return _attend(algorithm, q, k, v, dropout_rate=rate, deterministic=False, key=DROP["key"])

    rates = jnp.array([0.1, 0.3, 0.7], jnp.float32)
    got = jax.vmap(functools.partial(attend, "pallas"))(rates)
    want = jax.vmap(functools.partial(attend, "dense"))(rates)
    np.testing.assert_array_equal(got != 0, want != 0)
    np.testing.assert_allclose(got, want, **TOL)
    invalid = attend("pallas", jnp.float32(1.5))  # outside [0, 1]: NaN, as on the dense path
    np.testing.assert_array_equal(np.isnan(invalid), np.isnan(attend("dense", jnp.float32(1.5))))
    assert np.isnan(invalid).all()


@SLOW
def test_run_time_rate_gradients():
    _compare(*_qkv(12), dropout_rate=jnp.float32(0.3), deterministic=False, key=DROP["key"])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"bias": np.zeros((LQ, LK), np.float32)}, "bias="),
        ({"impl": "flax"}, "impl='flax'"),
        ({"block_k": 24}, "block_k must be a power of two >= 16"),
        ({"block_q": 8}, "block_q must be a power of two >= 16"),
    ],
)
def test_what_it_rejects_it_names_in_one_line(kw, match):
    with pytest.raises(dm.DropmaskValueError, match=match) as info:
        _attend("pallas", *_qkv(0), **kw)
    assert "\n" not in str(info.value)
    assert any(fix in str(info.value) for fix in ("algorithm=", "Pass e.g."))


def test_auto_never_picks_pallas_where_tpu_kernels_do_not_run():
    q = k = v = jnp.zeros((1, 1024, 1, 8))
    for algorithm, expected in (("auto", False), ("pallas", True)):
        jaxpr = jax.make_jaxpr(functools.partial(_attend, algorithm, **DROP))(q, k, v)
        assert ("pallas_call" in str(jaxpr)) == expected, algorithm


@pytest.mark.parametrize("keep", [0.9, None])
def test_kernels_lower_to_triton_for_a_gpu(keep):
    """The forward and both backward kernels lower (Pallas to Triton IR) for CUDA, with
    a static keep probability, and with a run-time one and a dense mask."""
    plan = bw.Plan(
        batch=(2,), kv_heads=1, groups=2, q_len=40, kv_len=70, block_q=16, block_k=32,
        left=None, right=0, keep=keep, dropout=True, broadcast_dropout=False,
        precision=None, accumulate=jnp.float32,
    )  # fmt: skip
    mask = None if keep is not None else jnp.ones((2, 1, 40, 70), bool)  # with a dense mask
    dims = None if mask is None else pa.mask_dims(mask, plan.batch)
    kernel = pa.Kernel(plan, segments=True, interpret=False, mask_dims=dims)
    run_time_keep = None if keep is not None else jnp.float32(0.9)

    def loss(q, k, v):
        inputs = ki.KernelInputs(
            kv_valid=None, q_segments=jnp.ones((2, 40), jnp.int32),
            kv_segments=jnp.ones((2, 70), jnp.int32), bad_q=jnp.zeros((2, 40, 2), bool),
            bad_kv=jnp.zeros((2, 70, 1), bool), key=jax.random.key(0),
            run_time_keep=run_time_keep,
        )  # fmt: skip
        out, _ = pa.pallas_attention(kernel, q, k, v, inputs, mask=mask)
        return out.astype(jnp.float32).sum()

    q = jnp.zeros((2, 40, 2, 64), jnp.bfloat16)
    k = v = jnp.zeros((2, 70, 1, 64), jnp.bfloat16)
    exported = jax.export.export(
        jax.jit(jax.grad(loss, (0, 1, 2))),
        platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(q, k, v)
    text = exported.mlir_module()
    for name in ("dropmask_attention_forward", "dropmask_attention_dkdv", "dropmask_attention_dq"):
        assert name in text, name
