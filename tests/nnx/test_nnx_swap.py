"""``dropmask.nnx.swap_dropout``: a built NNX model's Flax dropout replaced in place."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.covering import covering

import dropmask
from dropmask import nnx as dnnx
from dropmask.audit import audit_nnx_model


def _data(x):
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(x)
    return x


def _equal(a, b) -> bool:
    same = jax.tree.map(lambda u, v: np.array_equal(_data(u), _data(v)), a, b)
    return all(jax.tree.leaves(same))


class MaxTextDropout(nnx.Dropout):
    """Built as MaxText builds its dropout: keeps a fork of the whole ``nnx.Rngs``."""

    def __init__(self, rate, *, broadcast_dims=(), rngs: nnx.Rngs):  # no super().__init__
        self.rate = rate
        self.broadcast_dims = broadcast_dims
        self.deterministic = False
        self.rng_collection = "dropout"
        self.rngs = rngs.fork()


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, drop=nnx.Dropout):
        self.linear = nnx.Linear(16, 16, rngs=rngs)
        self.drop = drop(0.3, rngs=rngs)
        self.wide = MaxTextDropout(0.5, broadcast_dims=(-2,), rngs=rngs)

    def __call__(self, x):
        return self.wide(jnp.tanh(self.drop(self.linear(x))))


class Stack(nnx.Module):
    """Layers stacked with nnx.vmap (leading key axes) and applied with nnx.scan."""

    def __init__(self, rngs: nnx.Rngs, layers: int = 3):
        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def build(rngs):
            return Block(rngs)

        self.blocks = build(rngs)
        self.head = Block(rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)  # each layer its own keys
        def body(x, block):
            return block(x)

        return self.head(body(x, self.blocks))


class Parallel(nnx.Module):
    """One Block applied to a batch of inputs with nnx.vmap, a key per member."""

    def __init__(self, rngs: nnx.Rngs):
        self.block = Block(rngs)

    def __call__(self, x):
        @nnx.split_rngs(splits=x.shape[0], only="dropout")
        @nnx.vmap(in_axes=(nnx.StateAxes({"dropout": 0, ...: None}), 0))
        def each(block, x):
            return block(x)

        return each(self.block, x)


MODELS = {"plain": Block, "scan": Stack, "vmap": Parallel}


def _run(model, x, *, jit):
    def loss(model, x):
        return jnp.sum(model(x) ** 2)

    grad = nnx.value_and_grad(loss)
    grad = nnx.jit(grad) if jit else grad
    return [grad(model, x) for _ in range(2)]  # two steps: the streams advance


# Every model under nnx.jit; eagerly, the plain block. The swap replaces layers before
# any call, and a replaced layer draws the same when traced or not: the eager case
# checks that nothing depends on being traced, and the transforms add only the jitted
# programs. Fast: a scanned model and the eager call; the other transforms are slow.
@pytest.mark.parametrize(
    ("name", "jit"),
    covering(
        [(name, True) for name in MODELS] + [("plain", False)],
        [("scan", True), ("plain", False)],
        unpack=True,
    ),
)
def test_impl_flax_is_bit_identical_and_the_state_is_unchanged(name, jit):
    x = jax.random.normal(jax.random.key(0), (4, 8, 16))
    flax, ours = (MODELS[name](nnx.Rngs(0, dropout=1)) for _ in range(2))
    before = nnx.state(ours)
    replaced = dnnx.swap_dropout(ours, impl="flax")
    after = nnx.state(ours)
    assert jax.tree.structure(after) == jax.tree.structure(before)
    assert _equal(after, before)
    assert {r.kind for r in replaced} == {"dropout"}
    assert {r.module for r in replaced} == {"Dropout", "MaxTextDropout"}
    assert not any(isinstance(m, nnx.Dropout) for _, m in nnx.iter_graph(ours))
    assert _equal(_run(ours, x, jit=jit), _run(flax, x, jit=jit))
    assert _equal(nnx.state(ours), nnx.state(flax))  # the streams advanced alike


def test_default_impl_draws_dropmask_masks_and_follows_train_eval_and_view():
    x = jnp.ones((64, 16))
    model = Block(nnx.Rngs(0, dropout=1))
    dnnx.swap_dropout(model)
    ours = Block(nnx.Rngs(0, dropout=1), drop=functools.partial(dnnx.Dropout, impl="fast"))
    flax = Block(nnx.Rngs(0, dropout=1))
    first, second = model.drop(x), model.drop(x)
    np.testing.assert_array_equal(first, ours.drop(x))
    assert not np.array_equal(first, flax.drop(x))
    assert not np.array_equal(first == 0, second == 0)  # one mask per call
    kept = np.asarray(model.drop(jnp.ones((256, 256))) != 0)
    sigma = np.sqrt(0.3 * 0.7 / kept.size)
    assert abs(kept.mean() - 0.7) < 4 * sigma
    model.eval()
    np.testing.assert_array_equal(model(x), model.wide(jnp.tanh(model.linear(x))))
    np.testing.assert_array_equal(model.drop(x), x)
    model.train()
    assert not np.array_equal(model.drop(x), x)
    np.testing.assert_array_equal(nnx.view(model, deterministic=True).drop(x), x)


def test_audit_sees_the_swapped_layers_as_dropmask_layers_at_the_same_paths():
    x = jnp.ones((32, 16))
    flax, model = Block(nnx.Rngs(0, dropout=1)), Block(nnx.Rngs(0, dropout=1))
    dnnx.swap_dropout(model)
    want, got = audit_nnx_model(flax, x), audit_nnx_model(model, x)
    assert [(s.path, s.kind, s.rate) for s in got.sites] == [
        (s.path, s.kind, s.rate) for s in want.sites
    ]
    assert got.codes == want.codes
    layers = {path: type(m) for path, m in nnx.iter_modules(model)}
    assert {layers[(s.path,)] for s in got.sites} == {dnnx.Dropout}


class Attention(nnx.Module):
    def __init__(self, rngs, attention_fn=nnx.dot_product_attention):
        self.mha = nnx.MultiHeadAttention(
            2, 8, dropout_rate=0.3, broadcast_dropout=False, decode=False,
            attention_fn=attention_fn, rngs=rngs,
        )  # fmt: skip
        self.shared = self.mha

    def __call__(self, x):
        return self.mha(x, deterministic=False)


def test_attention_only_when_asked_and_only_for_flax_default():
    x = jax.random.normal(jax.random.key(0), (2, 16, 8))
    flax, model, custom = (Attention(nnx.Rngs(0, dropout=1)) for _ in range(3))
    ours = Attention(
        nnx.Rngs(0, dropout=1), functools.partial(dropmask.dot_product_attention, impl="fast")
    )
    assert dnnx.swap_dropout(model) == ()
    replaced = dnnx.swap_dropout(model, attention=True)
    assert replaced == (dnnx.Replaced("mha", "attention", "MultiHeadAttention"),)
    fn = functools.partial(nnx.dot_product_attention, broadcast_dropout=False)
    custom.mha.attention_fn = fn
    assert dnnx.swap_dropout(custom, attention=True) == ()
    got = model(x)
    np.testing.assert_array_equal(got, ours(x))
    assert not np.allclose(got, flax(x), atol=1e-3)


@pytest.mark.parametrize("impl", ["fast", "flax"])
def test_audit_sees_a_swapped_attention_as_an_attention_site(impl):
    x = jnp.ones((2, 16, 8))
    flax, model = Attention(nnx.Rngs(0, dropout=1)), Attention(nnx.Rngs(0, dropout=1))
    dnnx.swap_dropout(model, impl, attention=True)
    want, got = audit_nnx_model(flax, x), audit_nnx_model(model, x)
    assert [(s.path, s.kind, s.rate) for s in got.sites] == [("mha", "attention", 0.3)]
    assert [(s.path, s.kind, s.rate) for s in want.sites] == [("mha", "attention", 0.3)]
    assert got.codes == want.codes


def test_refuses_what_it_cannot_swap_safely_and_changes_nothing():
    class OwnCall(nnx.Dropout):
        def __call__(self, inputs, **kwargs):
            return super().__call__(2 * inputs, **kwargs)

    class Holder(nnx.Module):
        def __init__(self, rngs):
            self.ok = nnx.Dropout(0.1, rngs=rngs)
            self.own = OwnCall(0.1, rngs=rngs)

    holder = Holder(nnx.Rngs(0))
    with pytest.raises(dropmask.DropmaskError, match=r"own \(OwnCall\) must call as"):
        dnnx.swap_dropout(holder)
    assert type(holder.ok) is nnx.Dropout  # nothing changed
    with pytest.raises(dropmask.DropmaskError, match="got a Dropout itself"):
        dnnx.swap_dropout(nnx.Dropout(0.1))
    with pytest.raises(dropmask.DropmaskError, match="model must be an nnx.Module"):
        dnnx.swap_dropout(object())  # pyright: ignore[reportArgumentType]

    model = Block(nnx.Rngs(0, dropout=1))
    graphdef, state = nnx.split(model)

    @jax.jit
    def traced(state):
        dnnx.swap_dropout(nnx.merge(graphdef, state))
        return 0

    with pytest.raises(dropmask.DropmaskError, match="state is traced"):
        traced(state)
    lines = []
    try:
        traced(state)
    except dropmask.DropmaskError as err:
        lines = str(err).splitlines()
    assert len(lines) == 1


def test_checkpoint_saved_before_the_swap_restores_after_it(tmp_path):
    saved = Stack(nnx.Rngs(0, dropout=1))
    x = jax.random.normal(jax.random.key(0), (4, 8, 16))
    saved(x)  # the streams have advanced
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", nnx.state(saved))
    checkpointer.wait_until_finished()
    restored = Stack(nnx.Rngs(5, dropout=7))
    dnnx.swap_dropout(restored, impl="flax")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(restored))
    nnx.update(restored, checkpointer.restore(tmp_path / "state", abstract))
    assert _equal(restored(x), saved(x))


# --- a Transformer written as Flax's gemma example writes it, unchanged ---------------


class GemmaBlock(nnx.Module):
    """Flax's gemma ``Block``: RMSNorm, attention, residual, RMSNorm, gated MLP,
    residual; dropout on each residual branch as its training variants add it."""

    def __init__(self, width: int, *, rngs: nnx.Rngs):
        self.pre_attention_norm = nnx.RMSNorm(width, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            4, width, dropout_rate=0.1, broadcast_dropout=False, decode=False, rngs=rngs
        )
        self.pre_ffw_norm = nnx.RMSNorm(width, rngs=rngs)
        self.gating = nnx.Linear(width, 2 * 64, rngs=rngs)
        self.linear = nnx.Linear(64, width, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):
        y = self.attn(self.pre_attention_norm(x))
        x = x + self.dropout(y)
        gate, up = jnp.split(self.gating(self.pre_ffw_norm(x)), 2, axis=-1)
        return x + self.dropout(self.linear(nnx.gelu(gate) * up))


class Gemma(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.embedder = nnx.Embed(50, 32, rngs=rngs)
        self.layers = nnx.List([GemmaBlock(32, rngs=rngs) for _ in range(2)])
        self.final_norm = nnx.RMSNorm(32, rngs=rngs)

    def __call__(self, tokens):
        x = self.embedder(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.embedder.attend(self.final_norm(x))


def _train(swap=None, steps: int = 3):
    model = Gemma(rngs=nnx.Rngs(0, dropout=1))
    if swap is not None:
        swap(model)
    model.train()
    tokens = jax.random.randint(jax.random.key(0), (4, 12), 0, 50)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        def loss(model):
            logits = model(tokens)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    losses = [float(step(model, optimizer)) for _ in range(steps)]
    return nnx.state(model), losses


# A training run: the value and gradient of two steps are bit-identical in
# test_impl_flax_is_bit_identical_and_the_state_is_unchanged, and Flax's attention in
# test_impl_flax_attention_is_flax_attention_bit_for_bit.
@pytest.mark.slow
def test_gemma_transformer_trains_bit_identically_with_impl_flax():
    want = _train()
    assert _equal(_train(functools.partial(dnnx.swap_dropout, impl="flax")), want)
    state, losses = _train(functools.partial(dnnx.swap_dropout, attention=True))
    assert losses[-1] < losses[0]
    assert not _equal(state, want[0])


# --- Flax's attention under impl="flax", against Flax's own -------------------------

B, LQ, LK, F = 3, 5, 4, 8
# (dropout_rate, deterministic, padded): each pair of two of them appears once, and the
# mode that drops weights (0.1, False) runs with a padding mask, where a query sees no key.
MODES = [(0.0, True, 1), (0.0, False, 0), (0.1, True, 0), (0.1, False, 1)]


def _attention_value_and_grad(model, inputs, mask, cotangent, det):
    def loss(model, x, y):
        out = model(x, y, mask=mask, deterministic=det)
        return jnp.sum(out * cotangent), out

    return nnx.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(model, *inputs)


@settings(max_examples=3)
@given(
    seed=st.integers(0, 2**16),
    q_lengths=st.lists(st.integers(0, LQ), min_size=B, max_size=B),
    kv_lengths=st.lists(st.integers(0, LK), min_size=B, max_size=B),
)
def test_impl_flax_attention_is_flax_attention_bit_for_bit(seed, q_lengths, kv_lengths):
    # Padding masks (queries with no valid key included), dropout 0 and 0.1,
    # deterministic or not: outputs and gradients are Flax's own, every bit.
    kx, ky, kc = jax.random.split(jax.random.key(seed), 3)
    inputs = jax.random.normal(kx, (B, LQ, F)), jax.random.normal(ky, (B, LK, F))
    cotangent = jax.random.normal(kc, (B, LQ, F))
    q_valid = jnp.arange(LQ)[None] < jnp.asarray(q_lengths)[:, None]
    kv_valid = jnp.arange(LK)[None] < jnp.asarray(kv_lengths)[:, None]
    for rate, det, padded in MODES:
        flax, model = (
            nnx.MultiHeadAttention(
                2,
                F,
                qkv_features=8,
                dropout_rate=rate,
                broadcast_dropout=False,
                decode=False,
                rngs=nnx.Rngs(0, dropout=1),
            )  # fmt: skip
            for _ in range(2)
        )
        replaced = dnnx.swap_dropout(model, impl="flax", attention=True)
        assert replaced == (dnnx.Replaced("", "attention", "MultiHeadAttention"),)
        mask = nnx.make_attention_mask(q_valid, kv_valid) if padded else None
        want = _attention_value_and_grad(flax, inputs, mask, cotangent, det)
        got = _attention_value_and_grad(model, inputs, mask, cotangent, det)
        assert _equal(got, want), (rate, det, padded)


def test_default_impl_attention_differs_from_flax_only_where_docs_swap_md_says():
    # Without dropout: a query with no valid key attends to nothing (the module returns
    # its output projection's bias there; Flax, the projected mean of the values), and
    # every other output and gradient is Flax's within float32 round-off.
    x = jax.random.normal(jax.random.key(0), (B, LQ, F))
    valid = jnp.arange(LQ)[None] < jnp.array([LQ, 2, 0])[:, None]
    mask = nnx.make_attention_mask(valid, valid)
    flax, model = (
        nnx.MultiHeadAttention(
            2, F, qkv_features=8, dropout_rate=0.1, decode=False, rngs=nnx.Rngs(0, dropout=1)
        )
        for _ in range(2)
    )
    bias = jax.random.normal(jax.random.key(2), (F,))  # an output bias that is not zero
    for m in (flax, model):
        assert m.out.bias is not None
        m.out.bias[...] = bias
    dnnx.swap_dropout(model, attention=True)

    def loss(model, x):
        out = model(x, mask=mask, deterministic=True)
        return jnp.sum(jnp.where(valid[..., None], jnp.sin(out), 0.0)), out

    run = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    (_, want), want_grads = run(flax, x)
    (_, got), grads = run(model, x)
    empty = ~np.asarray(valid)
    np.testing.assert_array_equal(got[empty], np.broadcast_to(bias, got[empty].shape))
    assert np.abs(want[empty] - bias[None]).min() > 1e-3  # Flax's mean of the values
    np.testing.assert_allclose(got[~empty], want[~empty], rtol=1e-5, atol=1e-5)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
