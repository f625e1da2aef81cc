"""Every function the docs offer as an ``attention_fn``, run inside Flax's own modules.

Linen's ``MultiHeadDotProductAttention`` passes an ``attention_fn`` only the keywords its
signature names, so a keyword left to ``**kwargs`` is silently dropped; NNX's
``MultiHeadAttention`` passes them all. Each function is therefore run in both modules,
for self- and cross-attention, a causal mask, a padding mask and the decode cache, against
the same module on Flax's own attention with dropout off: outputs and gradients (of the
inputs and the parameters) agree within the tolerances below. Neither module passes a
``bias``; the bias is compared on the functions themselves.
"""

from __future__ import annotations

import functools
import inspect
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.covering import covering

import dropmask

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADS, WIDTH, Q_LEN, KV_LEN = 2, 8, 5, 7
ATOL, RTOL = 2e-6, 2e-5
GRAD_ATOL, GRAD_RTOL = 2e-5, 2e-4

# Every attention function the docs and README pass as ``attention_fn=``, by the name
# written there; ``test_every_documented_attention_fn_is_tested`` keeps this in step.
ATTENTION_FNS = {
    "dot_product_attention": dropmask.dot_product_attention,
    "dot_product_attention(algorithm='blockwise')": functools.partial(
        dropmask.dot_product_attention, algorithm="blockwise", block_q=2, block_k=3
    ),
    "drop_head_attention": dropmask.drop_head_attention,
}


def _documented_names() -> set[str]:
    texts = [p.read_text() for p in (ROOT / "docs").glob("*.md")] + [
        (ROOT / "README.md").read_text()
    ]
    found = set()
    for text in texts:
        for m in re.finditer(r"attention_fn\s*=\s*(?:`\s*)?([A-Za-z_][\w.]*)(\(\s*[\w.]+)?", text):
            name = (m.group(2) or "").lstrip("(").strip() or m.group(1)
            found.add(name.rsplit(".", 1)[-1])
    return found


def test_every_documented_attention_fn_is_tested():
    documented = _documented_names() - {"partial"}
    tested = {name.split("(")[0] for name in ATTENTION_FNS}
    assert documented and documented <= tested, documented - tested


def _linen_passes() -> set[str]:
    """The keywords Linen's module passes an attention function taking Flax's set."""
    seen: set[str] = set()

    def record(query, key, value, **kw):
        seen.update(kw)
        return nn.dot_product_attention(query, key, value, **kw)

    record.__signature__ = inspect.signature(nn.dot_product_attention)  # type: ignore[attr-defined]
    x = jnp.ones((1, 3, WIDTH))
    layer = nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=record)
    layer.init(jax.random.key(0), x, mask=jnp.ones((1, 1, 3, 3), bool), deterministic=True)
    return seen


@pytest.mark.parametrize("name", ATTENTION_FNS)
def test_signature_names_every_keyword_flax_passes(name):
    fn = ATTENTION_FNS[name]
    params = inspect.signature(fn).parameters
    nnx_passes = {"mask", "dropout_rng", "dropout_rate", "broadcast_dropout"}
    nnx_passes |= {"deterministic", "dtype", "precision", "module", "is_causal"}
    missing = (_linen_passes() | nnx_passes) - set(params)
    assert not missing, f"{name} leaves {sorted(missing)} to **kwargs"


# --- cases -----------------------------------------------------------------------------


def _inputs(cross: bool):
    kq, kkv = jax.random.split(jax.random.key(7))
    xq = jax.random.normal(kq, (2, Q_LEN, WIDTH), jnp.float32)
    xkv = jax.random.normal(kkv, (2, KV_LEN if cross else Q_LEN, WIDTH), jnp.float32)
    return xq, (xkv if cross else xq)


def _mask(kind: str, xq, xkv):
    if kind == "none":
        return None
    if kind == "causal":
        return nn.make_causal_mask(jnp.ones(xq.shape[:2]))
    # Padding of the keys only: every query keeps a valid key (a query with none is
    # where dropmask outputs zeros and Flax a uniform average, a documented difference).
    lengths = jnp.array([xkv.shape[1], 3])
    kv_valid = jnp.arange(xkv.shape[1])[None, :] < lengths[:, None]
    return nn.make_attention_mask(jnp.ones(xq.shape[:2], bool), kv_valid)


CASES = [
    ("self", "none"),
    ("self", "causal"),
    ("self", "padding"),
    ("cross", "none"),
    ("cross", "padding"),
]


def _close(got, want, atol, rtol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol, rtol=rtol)


# The fast suite's cases: self-attention causal and cross-attention padded (a mask of
# each kind, each length relation); the slow suite adds no mask and the other pairings.
FAST_CASES = [("self", "causal"), ("cross", "padding")]
_NAMES = list(ATTENTION_FNS)


# Fast: each function with one of FAST_CASES, in turn (Linen passes the same keywords
# in every case; both mask kinds and length relations still reach its module).
@pytest.mark.parametrize(
    ("name", "case"),
    covering(
        [(name, case) for name in _NAMES for case in CASES],
        [(name, FAST_CASES[i % 2]) for i, name in enumerate(_NAMES)],
        unpack=True,
    ),
    ids=[f"{name}-{'-'.join(case)}" for name in _NAMES for case in CASES],
)
def test_linen_module_matches_flax_attention(name, case):
    cross, mask_kind = case[0] == "cross", case[1]
    xq, xkv = _inputs(cross)
    mask = _mask(mask_kind, xq, xkv)

    def layer(fn):
        # A rate above zero with deterministic=True: the function must read both.
        return nn.MultiHeadDotProductAttention(
            num_heads=HEADS, dropout_rate=0.5, deterministic=True, attention_fn=fn
        )

    params = layer(nn.dot_product_attention).init(jax.random.key(0), xq, xkv, mask=mask)

    def run(fn, params, xq, xkv):
        return layer(fn).apply(params, xq, xkv, mask=mask)

    def loss(fn, params, xq, xkv):
        return jnp.sum(jnp.sin(run(fn, params, xq, xkv)))

    _close(
        run(ATTENTION_FNS[name], params, xq, xkv),
        run(nn.dot_product_attention, params, xq, xkv),
        ATOL,
        RTOL,
    )
    grads = jax.grad(functools.partial(loss, ATTENTION_FNS[name]), argnums=(0, 1, 2))
    want = jax.grad(functools.partial(loss, nn.dot_product_attention), argnums=(0, 1, 2))
    _close(grads(params, xq, xkv), want(params, xq, xkv), GRAD_ATOL, GRAD_RTOL)
    if mask_kind != "none":  # the mask reached the function: without it the output differs
        unmasked = layer(ATTENTION_FNS[name]).apply(params, xq, xkv)
        assert not np.allclose(
            np.asarray(unmasked),
            np.asarray(run(nn.dot_product_attention, params, xq, xkv)),
            atol=1e-3,
        )


def _nnx_layer(fn, decode=False):
    return nnx.MultiHeadAttention(
        HEADS,
        WIDTH,
        dropout_rate=0.5,
        deterministic=True,
        attention_fn=fn,
        decode=decode,
        rngs=nnx.Rngs(0),
    )


_NNX_CASES = [*CASES, ("self", "is_causal")]


# Fast: the functions with is_causal (a keyword NNX alone passes; the blockwise path is
# dot_product_attention's own function, slow), and each with the one of FAST_CASES that
# Linen's test above does not run it with: each function meets both.
@pytest.mark.parametrize(
    ("name", "case"),
    covering(
        [(name, case) for name in _NAMES for case in _NNX_CASES],
        [
            *[(name, ("self", "is_causal")) for name in _NAMES if "blockwise" not in name],
            *[(name, FAST_CASES[(i + 1) % 2]) for i, name in enumerate(_NAMES)],
        ],
        unpack=True,
    ),
    ids=[f"{name}-{'-'.join(case)}" for name in _NAMES for case in _NNX_CASES],
)
def test_nnx_module_matches_flax_attention(name, case):
    cross, mask_kind = case[0] == "cross", case[1]
    xq, xkv = _inputs(cross)
    is_causal = mask_kind == "is_causal"
    mask = None if is_causal else _mask(mask_kind, xq, xkv)
    ours, theirs = _nnx_layer(ATTENTION_FNS[name]), _nnx_layer(nnx.dot_product_attention)

    def loss(module, xq, xkv):
        return jnp.sum(jnp.sin(module(xq, xkv, mask=mask, is_causal=is_causal)))

    _close(
        ours(xq, xkv, mask=mask, is_causal=is_causal),
        theirs(xq, xkv, mask=mask, is_causal=is_causal),
        ATOL,
        RTOL,
    )
    got = nnx.grad(loss, argnums=(0, 1, 2))(ours, xq, xkv)
    want = nnx.grad(loss, argnums=(0, 1, 2))(theirs, xq, xkv)
    _close(nnx.state(got[0]), nnx.state(want[0]), GRAD_ATOL, GRAD_RTOL)
    _close(got[1:], want[1:], GRAD_ATOL, GRAD_RTOL)


# Fast: the dense functions; the blockwise path decodes one query a step in
# test_nnx_decode_cache_matches_flax_attention.
@pytest.mark.parametrize("name", covering(_NAMES, ["dot_product_attention", "drop_head_attention"]))
def test_linen_decode_cache_matches_flax_attention(name):
    x, _ = _inputs(False)

    def layer(fn):
        return nn.MultiHeadDotProductAttention(
            num_heads=HEADS, dropout_rate=0.5, deterministic=True, decode=True, attention_fn=fn
        )

    variables = layer(nn.dot_product_attention).init(jax.random.key(0), x)
    params = {"params": variables["params"]}

    def decode(fn):
        cache = variables["cache"]
        outs = []
        for t in range(Q_LEN):
            y, mutated = layer(fn).apply(
                {**params, "cache": cache}, x[:, t : t + 1], mutable=["cache"]
            )
            cache = mutated["cache"]
            outs.append(y)
        return jnp.concatenate(outs, axis=1)

    ours, theirs = decode(ATTENTION_FNS[name]), decode(nn.dot_product_attention)
    _close(ours, theirs, ATOL, RTOL)
    # Decoding step by step is causal attention over the whole sequence.
    full = nn.MultiHeadDotProductAttention(num_heads=HEADS).apply(
        params, x, mask=nn.make_causal_mask(jnp.ones(x.shape[:2]))
    )
    _close(ours, full, ATOL, RTOL)


@pytest.mark.parametrize("name", ATTENTION_FNS)
def test_nnx_decode_cache_matches_flax_attention(name):
    x, _ = _inputs(False)
    ours = _nnx_layer(ATTENTION_FNS[name], decode=True)
    theirs = _nnx_layer(nnx.dot_product_attention, decode=True)
    outs = {}
    for label, module in (("ours", ours), ("theirs", theirs)):
        module.init_cache(x.shape)
        outs[label] = jnp.concatenate([module(x[:, t : t + 1]) for t in range(Q_LEN)], axis=1)
    _close(outs["ours"], outs["theirs"], ATOL, RTOL)


@pytest.mark.parametrize("name", ATTENTION_FNS)
def test_bias_matches_flax_attention_function(name):
    # Neither module passes a bias; the functions take one as Flax's function does.
    kq, kk, kv, kb = jax.random.split(jax.random.key(3), 4)
    q = jax.random.normal(kq, (2, Q_LEN, HEADS, 4))
    k = jax.random.normal(kk, (2, KV_LEN, HEADS, 4))
    v = jax.random.normal(kv, (2, KV_LEN, HEADS, 4))
    bias = jax.random.normal(kb, (2, HEADS, Q_LEN, KV_LEN))

    def loss(fn, q, k, v, bias):
        return jnp.sum(jnp.sin(fn(q, k, v, bias=bias)))

    fn = ATTENTION_FNS[name]
    _close(fn(q, k, v, bias=bias), nn.dot_product_attention(q, k, v, bias=bias), ATOL, RTOL)
    grads = jax.grad(functools.partial(loss, fn), argnums=(0, 1, 2, 3))(q, k, v, bias)
    want = jax.grad(functools.partial(loss, nn.dot_product_attention), argnums=(0, 1, 2, 3))
    _close(grads, want(q, k, v, bias), GRAD_ATOL, GRAD_RTOL)
