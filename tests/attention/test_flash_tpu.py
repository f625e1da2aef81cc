"""The Pallas TPU attention kernels (``_flash_tpu``) in Pallas's TPU interpreter, against
the dense path: the same dropout flags element by element for any tile, the same values,
gradients and NaN places; what they serve and what falls back; the dispatch."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from tests.covering import covering
from tests.jaxprs import equations

import dropmask as dm
from dropmask import testing
from dropmask._attention import _flash_dropout as fd
from dropmask._attention import _flash_tpu as ft
from dropmask._attention import _flash_tpu_calls as fc
from dropmask._attention import _kernel_inputs as ki

B, LQ, LK, H, D = 2, 40, 200, 2, 8  # lengths that are not a multiple of any tile
TOL = {"rtol": 2e-5, "atol": 1e-5}  # gradients are O(1): a zero is exact here, 2e-6 there


def _qkv(seed, lq=LQ, lk=LK, h=H, kv_heads=H, d=D, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, lq, h, d)).astype(dtype)
    k = rng.normal(size=(B, lk, kv_heads, d)).astype(dtype)
    v = rng.normal(size=(B, lk, kv_heads, d)).astype(dtype)
    return q, k, v


def _run(algorithm, q, k, v, kw):
    def loss(q, k, v):
        out = dm.dot_product_attention(q, k, v, algorithm=algorithm, **kw)
        weights = jax.lax.broadcasted_iota(jnp.float32, out.shape, out.ndim - 1) + 1
        return jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights), out

    (_, out), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def _on_tpu_kernels(algorithm, q, k, v, kw):
    with testing.tpu_kernels():
        return jax.jit(functools.partial(_run, algorithm, kw=kw))(q, k, v)


def _uses_kernels(algorithm, q, k, v, kw) -> bool:
    with testing.tpu_kernels():
        text = str(jax.make_jaxpr(functools.partial(_run, algorithm, kw=kw))(q, k, v))
    return "dropmask_flash_fwd" in text


def _assert_same(got, want, tol):
    (out, grads), (want_out, want_grads) = got, want
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want_out))
    np.testing.assert_allclose(out, want_out, **tol)
    for name, g, w in zip("qkv", grads, want_grads, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"d{name}: NaN places")
        np.testing.assert_allclose(g, w, **tol, err_msg=f"d{name}")


KEY = jax.random.key(7)
CASES = {
    "causal, dropout": {"is_causal": True, "dropout_rate": 0.3},
    "full, per-head dropout": {"dropout_rate": 0.3, "broadcast_dropout": False},
    "window, kv_lengths": {"window": (17, 5), "kv_lengths": jnp.array([200, 61])},
    "segments, dropout": {
        "q_segment_ids": jnp.array([[1] * 25 + [2] * 15, [1] * 40]),
        "kv_segment_ids": jnp.array([[1] * 100 + [2] * 90 + [0] * 10, [1] * 200]),
        "dropout_rate": 0.2,
        "broadcast_dropout": False,
    },
    "run-time rate": {"is_causal": True, "dropout_rate": jnp.float32(0.25)},
}


# Fast: a mask per head with segments, and a run-time rate with causal structure; the
# stored-flags cases below take window and kv_lengths.
@pytest.mark.parametrize("name", covering(CASES, ["segments, dropout", "run-time rate"]))
def test_values_and_gradients_equal_the_dense_paths(name):
    kw = dict(CASES[name])
    if "dropout_rate" in kw:
        kw.update(key=KEY, deterministic=False)
    q, k, v = _qkv(0)
    # Tiles of 16 queries and 128 keys: several of each, the last ones partly padding.
    tiles = {"block_q": 16, "block_k": 128}
    assert _uses_kernels("pallas", q, k, v, {**kw, **tiles})
    _assert_same(
        _on_tpu_kernels("pallas", q, k, v, {**kw, **tiles}), _run("dense", q, k, v, kw), TOL
    )


def test_grouped_query_heads_and_wider_value_depth():
    q, k, v = _qkv(1, h=4, kv_heads=2)
    v = np.concatenate([v, v], axis=-1)  # v_depth 16 != depth 8
    kw = {"is_causal": True, "dropout_rate": 0.3, "key": KEY, "deterministic": False}
    _assert_same(_on_tpu_kernels("pallas", q, k, v, kw), _run("dense", q, k, v, kw), TOL)


@pytest.mark.parametrize(
    "name", covering(["segments, dropout", "grouped heads"], ["grouped heads"])
)
def test_dq_by_its_own_kernel_where_the_parts_would_not_fit(name, monkeypatch):
    """The cases above take dq from the dk/dv kernel (accumulated in VMEM); here the
    dq kernel computes it."""
    monkeypatch.setattr(fc, "fuses_dq", lambda *_: False)
    if name == "grouped heads":
        q, k, v = _qkv(1, h=4, kv_heads=2)
        kw = {"is_causal": True, "dropout_rate": 0.3, "key": KEY, "deterministic": False}
    else:
        q, k, v = _qkv(0)
        kw = {**CASES[name], "key": KEY, "deterministic": False}
    tiled = {**kw, "block_q": 16, "block_k": 128}
    with testing.tpu_kernels():
        text = str(jax.make_jaxpr(functools.partial(_run, "pallas", kw=tiled))(q, k, v))
    assert "dropmask_flash_dq" in text
    _assert_same(_on_tpu_kernels("pallas", q, k, v, tiled), _run("dense", q, k, v, kw), TOL)


@pytest.mark.parametrize(
    ("stored", "kw"),
    [
        pytest.param(True, {"is_causal": True}, marks=pytest.mark.slow),
        (False, {"broadcast_dropout": False, "window": (90, 7), "kv_lengths": [640, 333]}),
    ],
    ids=["causal, stored flags", "a mask per head, window, kv_lengths, drawn flags"],
)
def test_the_forward_computes_a_key_tile_in_pieces_with_the_whole_tiles_values(
    stored, kw, monkeypatch
):
    """Key tiles of 512 in pieces of 256 (each piece's flags unpacked or drawn at its
    keys) give the values and gradients of the tile computed whole, and the dense
    path's."""
    q, k, v = _qkv(10, lq=640, lk=640)  # every piece of both key tiles has a query
    tiles = {"block_q": 112, "block_k": 512}
    _assert_pieces_give_the_whole_tiles_values(
        "FORWARD_CHUNK", q, k, v, kw, tiles, stored, monkeypatch
    )


@pytest.mark.parametrize(
    ("stored", "kw"),
    [
        pytest.param(True, {"is_causal": True}, marks=pytest.mark.slow),
        (
            False,
            {
                "broadcast_dropout": False,
                "window": (300, 7),
                "kv_lengths": [1024, 700],
                "q_segment_ids": [[1] * 600 + [2] * 424, [1] * 1024],
                "kv_segment_ids": [[1] * 600 + [2] * 424, [1] * 1024],
            },
        ),
    ],
    ids=["causal, stored flags", "a mask per head, window, segments, drawn flags"],
)
def test_the_dkdv_kernel_computes_a_query_tile_in_pieces_with_the_whole_tiles_values(
    stored, kw, monkeypatch
):
    """Query tiles of 512 in pieces of 256 (each piece's flags unpacked or drawn at its
    queries, its segment ids, log-sum-exp and row sums sliced, its dq rows summed) give
    the values and gradients of the tile computed whole, and the dense path's."""
    q, k, v = _qkv(11, lq=1024, lk=1024)  # every piece of both query tiles has a key
    tiles = {"block_q": 512, "block_k": 128}
    _assert_pieces_give_the_whole_tiles_values(
        "BACKWARD_CHUNK", q, k, v, kw, tiles, stored, monkeypatch
    )


def _assert_pieces_give_the_whole_tiles_values(chunk, q, k, v, kw, tiles, stored, monkeypatch):
    """The kernels with tiles ``tiles`` computed in pieces of 256 (``chunk``, of the keys
    or the queries) against the tiles computed whole, and against the dense path; the
    flags stored as bits or drawn by each kernel (``stored``)."""
    from dropmask._attention import _flash_tpu_plan as fp

    kw = {k_: jnp.array(x) if isinstance(x, list) else x for k_, x in kw.items()}
    kw = {**kw, "dropout_rate": 0.2, "key": KEY, "deterministic": False}
    tiled = {**kw, **tiles}
    monkeypatch.setattr(fd, "stores", lambda *args, **kwargs: stored)
    monkeypatch.setattr(fp, "PIECES_FROM", tiles["block_q"] * tiles["block_k"])  # else whole
    assert getattr(fp, chunk) == 256
    pieces = _on_tpu_kernels("pallas", q, k, v, tiled)
    monkeypatch.setattr(fp, chunk, max(tiles.values()))
    whole = _on_tpu_kernels("pallas", q, k, v, tiled)
    _assert_same(pieces, whole, TOL)
    _assert_same(pieces, _run("dense", q, k, v, kw), TOL)


@pytest.mark.parametrize(
    ("tiles", "dropout", "forward", "backward"),
    [
        ((1024, 1024), True, 256, 256),
        ((1024, 1024), False, 256, 1024),  # the backward in pieces only with dropout
        ((512, 512), True, 512, 512),  # fewer scores than PIECES_FROM: whole
        ((1024, 768), True, 768, 1024),
        ((2048, 512), True, 256, 256),
        ((512, 2048), True, 256, 256),
        ((4096, 384), True, 384, 256),  # 384 keys are not pieces of 256
    ],
)
def test_tiles_are_computed_in_pieces_from_a_million_scores(tiles, dropout, forward, backward):
    from dropmask._attention import _flash_tpu_plan as fp

    bq, bk = tiles
    plan = ft.bw.Plan((1,), 8, 1, 8192, 8192, bq, bk, None, 0, 0.9, dropout, True, None)
    flash = fp.Flash(plan, segments=False, interpret=False)
    assert (flash.chunk, flash.backward_chunk) == (forward, backward)


def test_fused_dq_is_zero_on_query_tiles_no_key_tile_reaches():
    """200 queries, 40 keys, each query seeing only keys up to 3 before it: no key tile
    reaches the query tiles past 128, whose dq is the aliased zeros."""
    q, _, _ = _qkv(3, lq=200)
    _, k, v = _qkv(4, lk=40)
    kw = {"window": (3, 0), "dropout_rate": 0.3, "key": KEY, "deterministic": False}
    tiled = {**kw, "block_q": 16, "block_k": 128}
    got = _on_tpu_kernels("pallas", q, k, v, tiled)
    assert np.all(np.asarray(got[1][0])[:, 128:] == 0)
    _assert_same(got, _run("dense", q, k, v, kw), TOL)


def test_dq_is_fused_while_a_group_of_heads_rows_fit_in_vmem():
    plan = ft.bw.Plan((1,), 8, 1, 32768, 32768, 1024, 1024, None, 0, 0.9, True, True, None)
    assert fc.fuses_dq(plan, 128)  # 16 MiB of float32
    assert not fc.fuses_dq(dataclasses.replace(plan, q_len=32769), 128)  # a tile more
    assert fc.fuses_dq(dataclasses.replace(plan, q_len=65536), 64)
    grouped = dataclasses.replace(plan, q_len=8192, kv_heads=2, groups=4)  # 8 over 2
    assert fc.fuses_dq(grouped, 128)
    assert not fc.fuses_dq(dataclasses.replace(grouped, q_len=16384), 128)


@pytest.mark.parametrize("dq", covering(["fused", "own kernel"], ["own kernel"]))
def test_query_tiles_of_128_draw_their_flags_with_the_rows_along_lanes(dq, monkeypatch):
    """Tiles of 128 queries and fewer than 1024 keys: the forward and dq kernels compute
    the flags with the queries along lanes (``rows_along_lanes``), dk/dv transposed."""
    if dq == "own kernel":
        monkeypatch.setattr(fc, "fuses_dq", lambda *_: False)
    q, k, v = _qkv(5, lq=200)
    kw = {"is_causal": True, "dropout_rate": 0.3, "broadcast_dropout": False}
    kw.update(key=KEY, deterministic=False)
    tiles = {"block_q": 128, "block_k": 256}
    assert fd.rows_along_lanes(tiles["block_q"], tiles["block_k"])
    _assert_same(
        _on_tpu_kernels("pallas", q, k, v, {**kw, **tiles}), _run("dense", q, k, v, kw), TOL
    )


@pytest.mark.parametrize("block_k", covering([128, 256], [128]))
def test_drops_the_dense_paths_weights_for_any_tile(block_k):
    """With ``v`` the identity over keys, the output is each query's dropped weights."""
    lk = 256
    q, k, _ = _qkv(2, lk=lk)
    v = np.broadcast_to(np.eye(lk, dtype=np.float32)[None, :, None], (B, lk, H, lk))
    kw = {"dropout_rate": 0.5, "key": KEY, "deterministic": False, "broadcast_dropout": False}
    keep = dm.keep_mask(KEY, (B, H, LQ, lk), 0.5)
    with testing.tpu_kernels():
        out = dm.dot_product_attention(
            q, k, v, algorithm="pallas", block_q=16, block_k=block_k, **kw
        )
    np.testing.assert_array_equal(np.moveaxis(np.asarray(out), -2, -3) != 0, keep)


def test_bfloat16_agrees_with_the_dense_path_to_its_round_off():
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(3))
    kw = {"is_causal": True, "dropout_rate": 0.3, "key": KEY, "deterministic": False}
    got, want = _on_tpu_kernels("pallas", q, k, v, kw), _run("dense", q, k, v, kw)
    f32 = lambda t: jax.tree.map(lambda x: np.asarray(x, np.float32), t)  # noqa: E731
    _assert_same(f32(got), f32(want), {"rtol": 3e-2, "atol": 3e-2})


@pytest.mark.parametrize("only_v", covering([False, True], [False]))
def test_non_finite_inputs_give_nan_in_the_dense_paths_places(only_v):
    """With a non-finite value alone the call is not clean either (``clean`` reads the
    positions of non-finite keys and values alike)."""
    q, k, v = _qkv(4)
    if not only_v:
        q[0, 3, 1, 2] = np.nan  # a query: its row
        k[1, 150, 0, 0] = np.inf  # a key: the rows that may see it (causal: from 150 on)
    v[0, 7, 1, 5] = -np.inf
    kw = {"is_causal": True, "dropout_rate": 0.3, "key": KEY, "deterministic": False}
    got, want = _on_tpu_kernels("pallas", q, k, v, kw), _run("dense", q, k, v, kw)
    assert np.isnan(got[0]).any()
    _assert_same(got, want, TOL)


def test_the_nan_rows_are_written_only_where_a_row_is_tainted():
    """The kernels' output is poisoned under a ``cond`` on any tainted row: the branch
    a clean call takes is the output as it is; the other writes the NaNs."""
    q, k, v = _qkv(4)
    attend = functools.partial(dm.dot_product_attention, is_causal=True, algorithm="pallas")
    with testing.tpu_kernels():
        jaxpr = jax.make_jaxpr(attend)(q, k, v).jaxpr
    passes = [
        eqn
        for eqn in equations(jaxpr)
        if eqn.primitive.name == "cond"
        and eqn.outvars  # not a kernel's pl.when
        and not eqn.params["branches"][0].jaxpr.eqns
    ]
    assert len(passes) == 1  # the output, untouched where no row is tainted
    poisoned = [e.primitive.name for e in passes[0].params["branches"][1].jaxpr.eqns]
    assert "select_n" in poisoned and "div" in poisoned
    # Batched, the condition is per batch entry: a NaN in one leaves the other exact.
    bad = q.copy()
    bad[0, 3, 1, 2] = np.nan
    both = np.stack([bad, q])
    with testing.tpu_kernels():
        got = jax.vmap(attend)(both, np.stack([k, k]), np.stack([v, v]))
        one = [attend(x, k, v) for x in (bad, q)]
    for g, w in zip(got, one, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, **TOL)
    assert np.isnan(got[0]).any() and not np.isnan(got[1]).any()


def test_a_row_with_no_valid_key_is_zero():
    q, k, v = _qkv(5)
    kw = {"kv_lengths": jnp.array([0, 3]), "window": (0, 0)}
    got, want = _on_tpu_kernels("pallas", q, k, v, kw), _run("dense", q, k, v, kw)
    assert not np.asarray(got[0][0]).any()
    _assert_same(got, want, TOL)


def test_auto_takes_the_kernels_from_512_by_512_scores_where_they_serve():
    short, long_ = _qkv(6, lq=16, lk=128), _qkv(6, lq=512, lk=512)
    assert not _uses_kernels("auto", *short, {})
    assert _uses_kernels("auto", *long_, {})
    assert not _uses_kernels("auto", *(x.astype(np.float16) for x in long_), {})
    mask = jnp.ones((1, 1, 512, 512), bool)
    assert not _uses_kernels("auto", *long_, {"mask": mask})
    assert not _uses_kernels("auto", *long_, {"impl": "flax"})
    # Outside tpu_kernels() on a CPU: the paths of before.
    text = str(jax.make_jaxpr(functools.partial(_run, "auto", kw={}))(*long_))
    assert "dropmask_flash_fwd" not in text


def test_what_the_kernels_do_not_take_falls_back_with_the_same_values():
    q, k, v = _qkv(7)
    mask = np.random.default_rng(0).random((B, 1, LQ, LK)) < 0.6
    kw = {"mask": jnp.asarray(mask), "dropout_rate": 0.3, "key": KEY, "deterministic": False}
    assert not _uses_kernels("pallas", q, k, v, kw)
    _assert_same(_on_tpu_kernels("pallas", q, k, v, kw), _run("dense", q, k, v, kw), TOL)


@pytest.mark.parametrize(
    ("tiles", "match"),
    [
        ({"block_k": 64}, "block_k must be a multiple of 128 for algorithm='pallas' on a TPU"),
        ({"block_q": 24}, "block_q must be a multiple of 16 for algorithm='pallas' on a TPU"),
    ],
)
def test_tiles_the_kernels_cannot_take_are_named(tiles, match):
    q, k, v = _qkv(8)
    with testing.tpu_kernels(), pytest.raises(ValueError, match=match) as info:
        dm.dot_product_attention(q, k, v, algorithm="pallas", **tiles)
    assert "\n" not in str(info.value)


def test_serves():
    served = {"mask": False, "bias": False, "interpret": False}
    assert ft.serves(jnp.bfloat16, 2, True, (64, 128), **served)
    assert not ft.serves(jnp.float16, 2, True, (64, 64), **served)
    assert not ft.serves(jnp.float32, 1, True, (64, 64), **served)  # the mask packs queries
    assert ft.serves(jnp.float32, 1, False, (64, 64), **served)
    assert not ft.serves(jnp.float32, 2, False, (64, 64), **{**served, "mask": True})
    # Depths Mosaic has not compiled on a TPU take the blockwise path there; the
    # interpreter takes any.
    assert not ft.serves(jnp.float32, 2, True, (32, 64), **served)
    assert not ft.serves(jnp.float32, 2, True, (64, 96), **served)
    assert ft.serves(jnp.float32, 2, True, (32, 96), **{**served, "interpret": True})


def test_compiled_for_a_tpu_the_kernels_take_depths_of_64_and_its_multiples(lowering_for_a_tpu):
    """Traced (not run) as for a TPU: other depths take the blockwise path there."""
    assert not _uses_kernels("pallas", *_qkv(9, d=8), {})
    assert _uses_kernels("pallas", *_qkv(9, d=64), {})
    q, k, v = _qkv(9, d=64)
    assert not _uses_kernels("pallas", q, k, np.concatenate([v, v[..., :32]], -1), {})


# --- the flags stored as bits ---------------------------------------------------------


@pytest.mark.parametrize(
    ("block_q", "block_k"), [(512, 1024), (112, 640), (48, 256), (16, 128), (128, 384)]
)
def test_bits_pack_and_unpack_the_flags_in_either_orientation(block_q, block_k):
    bits = fd.Bits(block_q, block_k)
    flags = np.random.default_rng(block_q + block_k).random((block_q, block_k)) < 0.7
    words = bits.pack(jnp.asarray(flags))
    assert words.shape == bits.tile and words.dtype == jnp.int32
    assert words.size * 32 >= flags.size  # a bit a flag, the last word block maybe part-used
    got = bits.unpack(words, transposed=False)
    assert got.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(got), flags)
    np.testing.assert_array_equal(np.asarray(bits.unpack(words, transposed=True)), flags.T)


def test_the_default_tile_stores_one_bit_a_flag_in_whole_registers():
    bits = fd.Bits(*ft.DEFAULT_BLOCKS)
    assert bits.tile == (256, 128) and bits.serves(interpret=False)  # 64 blocks, 2 words
    assert fd.Bits(512, 1024).tile == (128, 128)
    assert fd.Bits(256, 1024).tile == (128, 128)  # 16 blocks: half of each word used
    assert not fd.Bits(48, 256).serves(interpret=False)  # [16, 128] blocks: interpreter only
    assert fd.Bits(48, 256).serves(interpret=True)


@pytest.fixture
def stores_spy(monkeypatch):
    """Records each call's choice between stored and drawn flags."""
    chosen = []
    original = fd.stores

    def spy(*args, **kwargs):
        chosen.append(original(*args, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(fd, "stores", spy)
    return chosen


STORED_CASES = {
    "causal, one mask": ({"is_causal": True, "dropout_rate": 0.3}, (112, 640)),
    "per-head, window, kv_lengths": (
        {
            "dropout_rate": 0.2,
            "broadcast_dropout": False,
            "window": (90, 7),
            "kv_lengths": jnp.array([640, 333]),
        },
        (112, 640),
    ),
    "run-time rate": ({"is_causal": True, "dropout_rate": jnp.float32(0.25)}, (48, 256)),
}


# Fast: the case with the most structure; the other two differ in the rate and tiles.
@pytest.mark.parametrize("name", covering(STORED_CASES, ["per-head, window, kv_lengths"]))
def test_stored_flags_give_the_drawn_values_and_the_dense_paths(name, stores_spy, monkeypatch):
    kw, (block_q, block_k) = STORED_CASES[name]
    kw = {**kw, "key": KEY, "deterministic": False}
    q, k, v = _qkv(10, lq=224, lk=640)
    tiles = {"block_q": block_q, "block_k": block_k}
    stored = _on_tpu_kernels("pallas", q, k, v, {**kw, **tiles})
    assert stores_spy == [True]
    _assert_same(stored, _run("dense", q, k, v, kw), TOL)
    monkeypatch.setattr(fd, "stores", lambda *args, **kwargs: False)
    drawn = _on_tpu_kernels("pallas", q, k, v, {**kw, **tiles})
    for got, want in zip(jax.tree.leaves(stored), jax.tree.leaves(drawn), strict=True):
        np.testing.assert_array_equal(got, want)


# Stored flags, and flags drawn in each kernel: the fast suite draws them (the cases
# above store them).
@pytest.mark.parametrize("tiles", covering([(112, 640), (16, 128)], [(16, 128)]))
def test_vmap_over_keys_draws_each_keys_mask(tiles, stores_spy):
    q, k, v = _qkv(13, lq=224, lk=640)
    keys = jax.random.split(jax.random.key(1), 3)

    def attend(key, algorithm, **tiles_):
        return dm.dot_product_attention(
            q,
            k,
            v,
            key=key,
            dropout_rate=0.3,
            deterministic=False,
            is_causal=True,
            algorithm=algorithm,
            **tiles_,
        )

    with testing.tpu_kernels():
        got = jax.jit(
            jax.vmap(lambda key: attend(key, "pallas", block_q=tiles[0], block_k=tiles[1]))
        )(keys)
    assert stores_spy == [tiles == (112, 640)]
    want = jax.vmap(lambda key: attend(key, "dense"))(keys)
    np.testing.assert_allclose(got, want, **TOL)


def test_flags_are_stored_while_they_take_no_more_than_the_inputs_and_output(stores_spy):
    """The words' bytes (here a [128, 128] block of words a tile, a word a flag) against
    the bytes of q, k, v and the output."""
    kw = {"dropout_rate": 0.1, "key": KEY, "deterministic": False, "broadcast_dropout": False}
    tiles = {"block_q": 128, "block_k": 128}  # [128, 128] blocks: one word block a tile
    for lk, d, stored in [(256, 8, False), (256, 64, True)]:
        q, k, v = _qkv(11, lq=128, lk=lk, d=d)
        stores_spy.clear()
        _uses_kernels("pallas", q, k, v, {**kw, **tiles})
        assert stores_spy == [stored], (lk, d)


# --- clean calls ----------------------------------------------------------------------


CLEAN_CASES = {  # name: (keywords, tiles); stored flags, flags drawn in each kernel
    "causal, one mask, stored": ({"is_causal": True, "dropout_rate": 0.3}, (112, 640)),
    "segments, a mask per head, drawn": (
        {**CASES["segments, dropout"], "kv_lengths": jnp.array([200, 151])},
        (16, 128),
    ),
    "run-time rate, window": (
        {"window": (17, 5), "dropout_rate": jnp.float32(0.25)},
        (48, 256),
    ),
    "no dropout, kv_lengths": ({"kv_lengths": jnp.array([200, 61])}, (16, 128)),
}


# Fast: stored flags with dropout, and a call without dropout.
@pytest.mark.parametrize(
    "name", covering(CLEAN_CASES, ["causal, one mask, stored", "no dropout, kv_lengths"])
)
def test_a_clean_call_skips_the_checks_and_gives_what_they_give(name, monkeypatch):
    """On finite scores the checks change nothing: with them forced on (``clean`` 0),
    the outputs and gradients are the same bits."""
    kw, (block_q, block_k) = CLEAN_CASES[name]
    kw = {**kw, "key": KEY, "deterministic": False, "block_q": block_q, "block_k": block_k}
    q, k, v = _qkv(14)
    seen = []
    original = ft.clean

    def spy(*args):
        out = original(*args)
        jax.debug.callback(lambda x: seen.append(int(x[0])), out)
        return out

    monkeypatch.setattr(ft, "clean", spy)
    fast = _on_tpu_kernels("pallas", q, k, v, kw)
    assert seen == [1]
    monkeypatch.setattr(ft, "clean", lambda q, *_: jnp.zeros((1,), jnp.int32))
    checked = _on_tpu_kernels("pallas", q, k, v, kw)
    for got, want in zip(jax.tree.leaves(fast), jax.tree.leaves(checked), strict=True):
        np.testing.assert_array_equal(got, want)


def _inputs(bad_q=False, bad_kv=False):
    return ki.KernelInputs(
        kv_valid=None,
        q_segments=None,
        kv_segments=None,
        bad_q=jnp.zeros((1, 4, 1), bool).at[0, 0, 0].set(bad_q),
        bad_kv=jnp.zeros((1, 4, 1), bool).at[0, 3, 0].set(bad_kv),
        key=None,
    )


def test_clean_is_no_non_finite_input_and_no_score_that_can_overflow():
    ones = jnp.ones((1, 4, 16), jnp.bfloat16)
    assert int(ft.clean(ones, ones, _inputs())[0]) == 1
    assert int(ft.clean(ones, ones, _inputs(bad_q=True))[0]) == 0
    assert int(ft.clean(ones, ones, _inputs(bad_kv=True))[0]) == 0
    # 16 * q_max * k_max against float32's largest over 4: just under, then over.
    limit = float(np.finfo(np.float32).max) / 4 / 16
    q_max = jnp.float32(2.0**60)
    k_under = jnp.float32(limit / 2.0**60 * 0.99)
    for k_max, want in [(k_under, 1), (k_under * 1.03, 0), (jnp.float32(jnp.inf), 0)]:
        k = ones.astype(jnp.float32).at[0, 2, 5].set(-k_max)
        got = ft.clean(ones.astype(jnp.float32).at[0, 1, 1].set(q_max), k, _inputs())
        assert int(got[0]) == want, k_max


# --- lowered for a TPU ----------------------------------------------------------------


def _lowered(kw, *, lq=1024, lk=1024, h=4, kv_heads=4, d=64, dtype=jnp.bfloat16):
    q, k, v = (jnp.asarray(x, dtype) for x in _qkv(12, lq=lq, lk=lk, h=h, kv_heads=kv_heads, d=d))

    def loss(q, k, v):
        out = dm.dot_product_attention(q, k, v, algorithm="pallas", **kw)
        return jnp.sum(out.astype(jnp.float32))

    with testing.tpu_kernels():
        exported = jax.export.export(jax.jit(jax.grad(loss, (0, 1, 2))), platforms=["tpu"])
        return exported(q, k, v).mlir_module()


DROP = {"dropout_rate": 0.1, "key": KEY, "deterministic": False}
LOWERED = {  # name: (keywords, shapes, whether the flags are stored, whether dq is fused)
    "causal, one mask": ({**DROP, "is_causal": True}, {}, True, True),
    "a mask per head, window, kv_lengths": (
        {
            **DROP,
            "broadcast_dropout": False,
            "window": (300, 0),
            "kv_lengths": jnp.array([1024, 700]),
        },
        {},
        True,
        True,
    ),
    "segments": (
        {
            **DROP,
            "q_segment_ids": jnp.repeat(jnp.array([[1, 2]]), 512, axis=1),
            "kv_segment_ids": jnp.repeat(jnp.array([[1, 2]]), 512, axis=1),
        },
        {},
        True,
        True,
    ),
    "run-time rate, f32, depth 128": (
        {**DROP, "dropout_rate": jnp.float32(0.2)},
        {"d": 128, "dtype": jnp.float32},
        True,
        True,
    ),
    # 8192 tokens, a mask per head: the bits would outgrow q, k, v and the output; 8
    # query heads a key-value head: their dq (32 MiB of float32) outgrows DQ_VMEM_BYTES.
    "grouped heads, flags drawn in each kernel": (
        {**DROP, "broadcast_dropout": False, "block_q": 256},
        {"lq": 8192, "lk": 8192, "h": 8, "kv_heads": 1, "d": 128},
        False,
        False,
    ),
    "no dropout": ({"is_causal": True}, {}, False, True),
}


# Fast: stored flags and fused dq, flags drawn in each kernel with the dq kernel, and no
# dropout; the slow cases add structure, which the interpreted tests above cover.
@pytest.mark.parametrize(
    "name",
    covering(
        LOWERED, ["causal, one mask", "grouped heads, flags drawn in each kernel", "no dropout"]
    ),
)
def test_the_kernels_lower_for_a_tpu(name, lowering_for_a_tpu):
    kw, shapes, stored, fused = LOWERED[name]
    text = _lowered(kw, **shapes)
    kernels = ["dropmask_flash_fwd", "dropmask_flash_dkdv"]
    kernels += ["dropmask_flash_flags"] if stored else []
    kernels += [] if fused else ["dropmask_flash_dq"]
    assert text.count("tpu_custom_call(") == len(kernels)
    for kernel in kernels:
        assert f'kernel_name = "{kernel}"' in text, kernel


# --- precision -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "want"),
    [
        (None, lax.Precision.DEFAULT),
        ("default", lax.Precision.DEFAULT),
        ("bfloat16", lax.Precision.DEFAULT),
        ("highest", lax.Precision.HIGHEST),
        ("float32", lax.Precision.HIGHEST),
        ("high", lax.Precision.HIGHEST),  # Mosaic has no three-pass product: more, not less
        ((lax.Precision.HIGHEST, lax.Precision.HIGHEST), lax.Precision.HIGHEST),
        ((lax.Precision.HIGHEST, lax.Precision.DEFAULT), None),  # the blockwise path's
        (lax.DotAlgorithmPreset.F32_F32_F32, None),
    ],
)
def test_the_kernels_precision_for_each_a_call_can_ask(precision, want):
    assert ft.kernel_precision(precision) == want


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_highest_reaches_every_float32_product_in_the_kernels(dtype):
    q, k, v = (x.astype(dtype) for x in _qkv(21))
    kw = {"is_causal": True, "dropout_rate": 0.1, "dropout_rng": jax.random.key(0)}

    def grad(precision, q, k, v):
        loss = lambda q, k, v: jnp.sum(  # noqa: E731
            dm.dot_product_attention(q, k, v, algorithm="pallas", precision=precision, **kw)
        )
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    with testing.tpu_kernels():
        default = str(jax.make_jaxpr(functools.partial(grad, None))(q, k, v))
        highest = str(jax.make_jaxpr(functools.partial(grad, "highest"))(q, k, v))
        with jax.default_matmul_precision("highest"):
            context = str(jax.make_jaxpr(functools.partial(grad, None))(q, k, v))
    assert "dropmask_flash_dkdv" in highest
    assert "HIGHEST" not in default
    # bfloat16 operands are exact in one pass: no product asks for more.
    assert ("HIGHEST" in highest) == (dtype == np.float32)
    if dtype == np.float32:  # (the context also reaches XLA's products around the kernels)
        assert "HIGHEST" in context


def test_a_highest_default_precision_asks_no_bfloat16_product_for_more():
    """Under ``jax.default_matmul_precision("highest")`` a product whose precision is
    left unnamed asks for a float32 contraction, which Mosaic refuses for bfloat16
    operands ("Bad lhs type" when the program compiles on a v5e): every product of the
    attention kernels and the dropout kernels' spreading of bytes names its own. Read
    from the interpreted kernels' lowering, where each product is a ``dot_general``."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(23))
    kw = {"is_causal": True, "dropout_rate": 0.1, "dropout_rng": jax.random.key(0)}

    def step(q, k, v):
        attend = lambda q, k, v: dm.dot_product_attention(  # noqa: E731
            q, k, v, algorithm="pallas", block_q=16, block_k=128, **kw
        )
        out, pull = jax.vjp(attend, q, k, v)
        x = jnp.ones((64, 1024), jnp.bfloat16)
        dropped = dm.dropout(x, 0.1, jax.random.key(1))  # the dropout kernel
        grads = jax.grad(lambda x: jnp.sum(dm.dropout(x, 0.1, jax.random.key(2))))(x)  # bytes
        return out, pull(out), dropped, grads

    with testing.tpu_kernels(), jax.default_matmul_precision("highest"):
        text = jax.jit(step).lower(q, k, v).as_text()
    products = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    narrow = [line for line in products if "bf16>" in line.split(" : ")[-1].split("->")[0]]
    assert len(narrow) >= 8, products  # the attention kernels' and the bytes' spreading
    asking = [line.strip() for line in narrow if "precision = [DEFAULT, DEFAULT]" not in line]
    assert not asking, asking


def test_a_precision_the_kernels_cannot_honour_takes_the_blockwise_path():
    q, k, v = _qkv(22)
    kw = {"precision": lax.DotAlgorithmPreset.F32_F32_F32}
    assert not _uses_kernels("pallas", q, k, v, kw)
    want = jax.jit(functools.partial(_run, "blockwise", kw=kw))(q, k, v)
    _assert_same(_on_tpu_kernels("pallas", q, k, v, kw), want, {"rtol": 0, "atol": 0})
