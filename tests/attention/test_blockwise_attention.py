"""dot_product_attention(algorithm="blockwise") against the dense path: same mask, same
values and gradients, the same NaN contract, memory linear in the lengths."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

import dropmask as dm
from dropmask._attention import _blockwise as bw

TOL = {"rtol": 1e-5, "atol": 1e-6}
B, LQ, LK, H, D = 2, 13, 70, 2, 4
# Tile sizes that divide nothing, straddle the 32-element mask words, or cover everything.
BLOCKS = [(5, 33), (13, 7), (16, 128)]


def _qkv(seed, b=B, lq=LQ, lk=LK, h=H, kv_heads=H, d=D, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, lq, h, d)).astype(dtype)
    k = rng.normal(size=(b, lk, kv_heads, d)).astype(dtype)
    v = rng.normal(size=(b, lk, kv_heads, d)).astype(dtype)
    return q, k, v, rng


def _attend(algorithm, q, k, v, blocks=(None, None), **kw):
    return dm.dot_product_attention(
        q, k, v, algorithm=algorithm, block_q=blocks[0], block_k=blocks[1], **kw
    )


def _loss(algorithm, blocks, kw, q, k, v, bias=None):
    extra = {} if bias is None else {"bias": bias}
    out = _attend(algorithm, q, k, v, blocks, **kw, **extra)
    weights = jax.lax.broadcasted_iota(jnp.float32, out.shape, out.ndim - 1)
    return jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)


@functools.partial(jax.jit, static_argnames=("algorithm", "blocks", "options"))
def _value_and_grads(algorithm, blocks, options, arrays, q, k, v, bias):
    kw = {**dict(options), **arrays}
    return jax.value_and_grad(functools.partial(_loss, algorithm, blocks, kw), (0, 1, 2, 3))(
        q, k, v, bias
    )


def _compare(q, k, v, bias=None, blocks=(5, 33), tol=TOL, **kw):
    """Blockwise and dense loss and gradients (q, k, v, bias) agree; returns dense's."""
    is_array = lambda x: isinstance(x, np.ndarray | jax.Array)  # noqa: E731
    options = tuple(sorted((n, x) for n, x in kw.items() if not is_array(x)))
    arrays = {n: x for n, x in kw.items() if is_array(x)}
    given = bias is not None
    bias = bias if given else jnp.zeros((1,), jnp.float32)
    dense = _value_and_grads("dense", (None, None), options, arrays, q, k, v, bias)
    block = _value_and_grads("blockwise", blocks, options, arrays, q, k, v, bias)
    # A constant bias's gradient is a sum of zeros, round-off only: compared when given.
    n = 4 if given else 3
    pairs = [(block[0], dense[0]), *zip(block[1][:n], dense[1][:n], strict=True)]
    for a, b in pairs:
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)
    return dense


STRUCTURES = {
    "none": {},
    "causal": {"is_causal": True},
    "window": {"window": (3, 9)},
    "causal_window": {"is_causal": True, "window": 20},
    "kv_lengths": {"kv_lengths": np.array([70, 23])},
    "kv_mask": {"kv_mask": np.arange(LK)[None] % np.array([[3], [5]]) != 0},
    "segments": {
        "q_segment_ids": np.repeat([[1, 2, 2, 3], [1, 1, 1, 0]], [4, 4, 4, 1], axis=1),
        "kv_segment_ids": np.repeat([[1, 2, 3, 0], [1, 1, 1, 0]], [20, 20, 20, 10], axis=1),
    },
}


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "name", [n if n in ("causal", "segments") else pytest.param(n, marks=SLOW) for n in STRUCTURES]
)
def test_structure_matches_dense_with_dropout(name):
    q, k, v, _ = _qkv(0)
    drop = {"dropout_rate": 0.3, "deterministic": False, "key": jax.random.key(1)}
    _compare(q, k, v, **STRUCTURES[name], **drop)


def test_structure_arguments_equal_an_explicit_mask():
    q, k, v, _ = _qkv(1)
    s = STRUCTURES
    explicit = (
        np.asarray(dm.causal_mask(LQ, LK))
        & np.asarray(dm.sliding_window_mask(LQ, 20, LK))
        & (np.arange(LK) < s["kv_lengths"]["kv_lengths"][:, None])[:, None, None]
        & s["kv_mask"]["kv_mask"][:, None, None]
        & np.asarray(dm.segment_mask(*s["segments"].values()))
    )
    structure = {**s["causal_window"], **s["kv_lengths"], **s["kv_mask"], **s["segments"]}
    want = _attend("dense", q, k, v, mask=explicit)
    for algorithm in ("dense", "blockwise"):
        got = _attend(algorithm, q, k, v, (4, 16), **structure)
        np.testing.assert_allclose(got, want, **TOL)


# Fast: two groups of two query heads; one key head for all four (slow) is grouped the
# same way.
@pytest.mark.parametrize("kv_heads", [pytest.param(1, marks=SLOW), 2])
def test_mask_bias_and_grouped_query_heads(kv_heads):
    q, k, v, rng = _qkv(2, h=4, kv_heads=kv_heads)
    mask = rng.random((B, 1, LQ, LK)) < 0.7
    mask[1, :, 3] = False  # a query with no valid key
    bias = rng.normal(size=(1, 4, LQ, LK)).astype(np.float32)
    bias[0, 1, :, ::4] = -np.inf  # a -inf bias masks
    drop = {"dropout_rate": 0.2, "deterministic": False, "key": jax.random.key(3)}
    (_, grads) = _compare(q, k, v, bias, (8, 24), mask=mask, broadcast_dropout=False, **drop)
    assert np.all(np.asarray(grads[3])[0, 1, :, ::4] == 0)


def _dropped_weights(algorithm, blocks, broadcast, rate=0.5, key=None, lq=LQ, lk=LK):
    """The weights the dropout leaves, read off the output: with ``v`` the identity over
    keys, ``out[..., q, h, j]`` is query ``q``'s dropped weight on key ``j``."""
    q, k, _, _ = _qkv(4, lq=lq, lk=lk)
    v = jnp.broadcast_to(jnp.eye(lk, dtype=jnp.float32)[None, :, None], (B, lk, H, lk))
    key = jax.random.key(5) if key is None else key
    out = _attend(
        algorithm, q, k, v, blocks, dropout_rate=rate, deterministic=False, key=key,
        broadcast_dropout=broadcast,
    )  # fmt: skip
    return jnp.moveaxis(out, -2, -3)  # [b, h, q, k]


@pytest.mark.parametrize("broadcast", [True, False])
def test_drops_exactly_the_dense_paths_weights(broadcast):
    shape = (B, H, LQ, LK)
    keep = dm.keep_mask(jax.random.key(5), shape, 0.5, broadcast_dims=(0, 1) if broadcast else ())
    dense = jax.jit(_dropped_weights, static_argnums=(0, 1, 2))("dense", (None, None), broadcast)
    np.testing.assert_array_equal(dense != 0, keep)
    for blocks in BLOCKS:
        got = jax.jit(_dropped_weights, static_argnums=(0, 1, 2))("blockwise", blocks, broadcast)
        np.testing.assert_array_equal(got != 0, keep, err_msg=str(blocks))
        np.testing.assert_allclose(got, dense, **TOL)


@SLOW
def test_backward_pass_drops_the_same_weights():
    """With the output's cotangent 1 on one query row, ``dv[k]`` is that row's dropped
    weight on key ``k``: the mask the backward pass draws, read element by element."""
    q, k, v, _ = _qkv(4)
    drop = {"dropout_rate": 0.5, "deterministic": False, "key": jax.random.key(5)}

    @jax.jit
    def backward_weights(q, k, v):
        _, vjp = jax.vjp(lambda v: _attend("blockwise", q, k, v, (5, 33), **drop), v)
        rows = jnp.eye(LQ, dtype=jnp.float32)[:, None, :, None, None]  # one per query
        (d_v,) = jax.vmap(vjp)(jnp.broadcast_to(rows, (LQ, B, LQ, H, D)))
        return jnp.moveaxis(d_v[..., 0], 0, -1).transpose(0, 2, 3, 1)  # [b, h, q, k]

    keep = dm.keep_mask(jax.random.key(5), (B, H, LQ, LK), 0.5, broadcast_dims=(0, 1))
    np.testing.assert_array_equal(backward_weights(q, k, v) != 0, keep)


def test_run_time_rate_vmap_over_keys_and_eager():
    keys = jax.random.split(jax.random.key(6), 3)
    rate = jnp.float32(0.25)

    def both(key):
        return [
            _dropped_weights(a, (6, 17), False, rate=rate, key=key) for a in ("dense", "blockwise")
        ]

    dense, block = jax.vmap(both)(keys)
    np.testing.assert_array_equal(block != 0, dense != 0)
    np.testing.assert_allclose(block, dense, **TOL)
    eager = _dropped_weights("blockwise", (6, 17), False, rate=rate, key=keys[1])
    np.testing.assert_allclose(eager, block[1], **TOL)


def test_rates_zero_and_one_and_deterministic():
    q, k, v, _ = _qkv(7)
    key = jax.random.key(0)
    for rate, det in ((0.0, False), (0.5, True), (1.0, False)):
        kw = {"dropout_rate": rate, "deterministic": det, "key": key}
        np.testing.assert_allclose(
            _attend("blockwise", q, k, v, (4, 40), **kw), _attend("dense", q, k, v, **kw), **TOL
        )


@pytest.mark.parametrize("broadcast", [True, pytest.param(False, marks=SLOW)])
def test_inside_shard_map_over_the_batch(broadcast):
    devices = np.array(jax.devices()[:8])
    q, k, v, _ = _qkv(8, b=8)
    kw = {"dropout_rate": 0.4, "deterministic": False, "broadcast_dropout": broadcast}
    mesh = Mesh(devices, ("x",))
    spec = PartitionSpec("x")

    def run(algorithm):
        def local(q, k, v, key):
            return _attend(algorithm, q, k, v, (5, 32), key=key, is_causal=True, **kw)

        f = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3 + (PartitionSpec(),),
                          out_specs=spec)  # fmt: skip
        return jax.jit(f)(q, k, v, jax.random.key(9))

    block, dense = run("blockwise"), run("dense")
    np.testing.assert_array_equal(block == 0, dense == 0)
    np.testing.assert_allclose(block, dense, **TOL)
    if broadcast:  # one mask for every row: the same as unsharded
        whole = _attend("dense", q, k, v, key=jax.random.key(9), is_causal=True, **kw)
        np.testing.assert_allclose(block, whole, **TOL)


def test_bf16_inputs():
    q, k, v, _ = _qkv(10)
    half = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
    drop = {"dropout_rate": 0.3, "deterministic": False, "key": jax.random.key(1)}
    attend = jax.jit(_attend, static_argnums=(0, 4), static_argnames=("is_causal", "deterministic"))
    out = attend("blockwise", *half, (4, 40), is_causal=True, **drop)
    assert out.dtype == jnp.bfloat16
    want = attend("dense", q, k, v, (None, None), is_causal=True, **drop)
    np.testing.assert_allclose(out.astype(jnp.float32), want, rtol=2e-2, atol=2e-2)
    (_, grads) = _compare(*half, blocks=(4, 40), tol={"rtol": 5e-2, "atol": 5e-2}, **drop)
    assert all(g.dtype == jnp.bfloat16 for g in grads[:3])


def test_query_with_no_valid_key_outputs_zeros_with_finite_gradients():
    q, k, v, _ = _qkv(11)
    lengths = np.array([0, 9])
    out = _attend("blockwise", q, k, v, (4, 8), kv_lengths=lengths)
    np.testing.assert_array_equal(out[0], 0.0)
    _, grads = _compare(q, k, v, kv_lengths=lengths, blocks=(4, 8))
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_non_finite_inputs_reach_only_the_queries_that_may_see_them():
    q, k, v, _ = _qkv(12)
    k[1, 40:] = np.nan  # padding junk behind kv_lengths
    v[1, 60, 0, 0] = np.inf
    q[0, 2, 1, 0] = np.nan
    kw = {"kv_lengths": np.array([70, 40]), "is_causal": True}
    q, k, v = (jnp.asarray(a) for a in (q, k, v))
    attend = jax.jit(_attend, static_argnums=(0, 4), static_argnames="is_causal")
    want = attend("dense", q, k, v, (None, None), **kw)
    got = attend("blockwise", q, k, v, (4, 33), **kw)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()
    np.testing.assert_allclose(got, want, equal_nan=True, **TOL)
    # A NaN key a query may see taints only that query, in values and gradients.
    k2 = k.at[0, 5, 0, 0].set(jnp.nan)

    def grads(algorithm):
        def loss(*a):
            return jnp.sum(_attend(algorithm, *a, (4, 33), is_causal=True)[..., 1:, :])

        return jax.jit(jax.grad(loss, (0, 1, 2)))(q.at[0, 2].set(0.0), k2, v)

    got, want = grads("blockwise"), grads("dense")
    assert np.isnan(want[0]).any() and not np.isnan(want[0]).all()  # tainted queries only
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, equal_nan=True, **TOL)


def _temp_bytes(length, algorithm):
    q = jnp.zeros((1, length, 2, 16), jnp.float32)
    drop = {"dropout_rate": 0.1, "deterministic": False, "key": jax.random.key(0)}

    def loss(q, k, v):
        return jnp.sum(_attend(algorithm, q, k, v, (128, 128), is_causal=True, **drop))

    compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, q, q).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@SLOW
def test_memory_grows_linearly_with_the_length():
    small, large = _temp_bytes(256, "blockwise"), _temp_bytes(1024, "blockwise")
    assert large <= 5 * small, (small, large)
    dense_large = _temp_bytes(1024, "dense")
    assert dense_large > 12 * _temp_bytes(256, "dense")  # the [q, k] wall, for contrast
    assert large * 8 < dense_large, (large, dense_large)


def test_causal_and_window_visit_only_the_tiles_they_need():
    def visited(**kw):
        span = dm._attention._checked.window_span(kw.get("window"), kw.get("is_causal", False))
        plan = bw.Plan((1,), 1, 1, 1024, 1024, 128, 128, *span, None, False, True, None)
        return sum(int(hi) - int(lo) for lo, hi in (bw.key_block_bounds(plan, i) for i in range(8)))

    assert visited() == 64
    assert visited(is_causal=True) == 36  # the diagonal and below: 8 * 9 / 2
    assert visited(window=(100, 0)) == 15  # the diagonal and the tile before it


def test_auto_picks_blockwise_for_long_sequences_and_dense_for_flax_masks():
    def loops(length, dtype=jnp.float32, **kw):
        q = jnp.zeros((1, length, 1, 8), dtype)
        jaxpr = jax.make_jaxpr(lambda q: dm.dot_product_attention(q, q, q, **kw))(q)
        return "custom_vjp_call" in str(jaxpr)

    assert not loops(2048)
    assert loops(4096)
    assert not loops(4096, impl="flax")
    assert loops(16, algorithm="blockwise")
    # 16-bit inputs switch earlier: there the blockwise path is faster from 512 on.
    assert not loops(511, jnp.bfloat16)
    assert loops(512, jnp.bfloat16)
    assert loops(512, jnp.float16)
    assert not loops(512, jnp.bfloat16, module=None, impl="flax")


def test_default_tiles_follow_the_length():
    from dropmask._attention import _blockwise as bw

    assert [bw.default_block(n) for n in (1, 256, 512, 513, 4096)] == [64, 64, 64, 128, 128]


def test_errors():
    q, k, v, _ = _qkv(13)
    cases = [
        ({"algorithm": "flash"}, "algorithm must be one of"),
        ({"algorithm": "blockwise", "impl": "flax"}, "impl='flax'"),
        ({"algorithm": "blockwise", "module": object()}, "module="),
        ({"block_q": 0}, "block_q must be >= 1"),
        ({"window": (1, 2, 3)}, "window must be an int or"),
        ({"window": -1}, "window"),
        ({"kv_segment_ids": np.ones((B, LK), int)}, "needs q_segment_ids"),
        ({"q_segment_ids": np.ones((B, LQ), int)}, "q_len == kv_len"),
        ({"q_segment_ids": np.ones((B, LQ)), "kv_segment_ids": np.ones((B, LK))}, "integers"),
        ({"kv_lengths": np.array([1, 2, 3])}, "kv_lengths"),
        ({"kv_lengths": np.array([1, 99])}, r"\[0, 70\]"),
        ({"kv_mask": np.ones((B, LK), int)}, "boolean"),
    ]
    for kw, match in cases:
        with pytest.raises(dm.DropmaskError, match=match):
            dm.dot_product_attention(q, k, v, **kw)


def test_plugs_into_linen_and_nnx_attention():
    x = jax.random.normal(jax.random.key(0), (2, 9, 16))
    mask = nn.make_attention_mask(jnp.ones((2, 9)), jnp.arange(9)[None] < jnp.array([[9], [6]]))
    dense_fn = functools.partial(dm.dot_product_attention, algorithm="dense")
    block_fn = functools.partial(dm.dot_product_attention, algorithm="blockwise", block_k=4)
    cfg = {"num_heads": 4, "qkv_features": 16, "dropout_rate": 0.3, "deterministic": False}
    dense_layer = nn.MultiHeadDotProductAttention(**cfg, attention_fn=dense_fn)
    block_layer = nn.MultiHeadDotProductAttention(**cfg, attention_fn=block_fn)
    params = dense_layer.init(jax.random.key(1), x, mask=mask)
    rngs = {"dropout": jax.random.key(2)}
    want = jax.jit(dense_layer.apply)(params, x, mask=mask, rngs=rngs)
    got = jax.jit(block_layer.apply)(params, x, mask=mask, rngs=rngs)
    np.testing.assert_allclose(got, want, **TOL)

    ncfg = {"num_heads": 4, "in_features": 16, "qkv_features": 16, "num_kv_heads": 2}
    ncfg |= {"decode": False, "dropout_rate": 0.3, "deterministic": False}
    nd = nnx.MultiHeadAttention(**ncfg, attention_fn=dense_fn, rngs=nnx.Rngs(0, dropout=3))
    nb = nnx.MultiHeadAttention(**ncfg, attention_fn=block_fn, rngs=nnx.Rngs(0, dropout=3))

    @nnx.jit
    def call(layer, x):
        return layer(x, is_causal=True)

    np.testing.assert_allclose(call(nb, x), call(nd, x), **TOL)


def _shapes(jaxpr):
    """Every array shape a jaxpr and its sub-jaxprs (loops, conds, calls) produce."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            yield getattr(var.aval, "shape", ())
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    yield from _shapes(inner)


def test_no_array_spans_queries_and_keys_forward_or_backward():
    lq, lk = 96, 160
    q, k, v, _ = _qkv(14, lq=lq, lk=lk)
    drop = {"dropout_rate": 0.1, "deterministic": False, "key": jax.random.key(0)}

    def loss(algorithm, q, k, v):
        kw = {"is_causal": True, "kv_lengths": np.array([lk, 50]), **drop}
        return jnp.sum(_attend(algorithm, q, k, v, (32, 32), **kw))

    def shapes(algorithm):
        jaxpr = jax.make_jaxpr(jax.grad(functools.partial(loss, algorithm), (0, 1, 2)))(q, k, v)
        return list(_shapes(jaxpr.jaxpr))

    def spans(shapes):
        return [s for s in shapes if lq in s and lk in s]

    assert spans(shapes("dense"))  # the check sees the dense path's weights
    tiled = shapes("blockwise")
    assert any(s[-2:] == (32, 32) for s in tiled)  # ... and reaches inside the loops
    assert spans(tiled) == []


def test_gradients_check_numerically_in_float64():
    from jax.test_util import check_grads

    with jax.enable_x64(True):
        q, k, v = (jnp.asarray(a, jnp.float64) for a in _qkv(15, b=1, lq=5, lk=7)[:3])
        bias = jnp.asarray(np.random.default_rng(16).normal(size=(1, H, 5, 7)))
        drop = {"dropout_rate": 0.3, "deterministic": False, "key": jax.random.key(2)}

        def attend(q, k, v, bias):
            out = _attend("blockwise", q, k, v, (2, 3), bias=bias, is_causal=True, **drop)
            assert out.dtype == jnp.float64
            return out

        check_grads(jax.jit(attend), (q, k, v, bias), order=1, modes=["rev"])
