"""``dropmask.linen.swap_dropout``: Flax's Linen dropout routed through dropmask."""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.covering import covering

import dropmask
from dropmask import linen as dl
from dropmask.audit import audit_model

RNGS = {"dropout": jax.random.key(1)}


def _equal(a, b) -> bool:
    return all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


class Block(nn.Module):
    drop: type = nn.Dropout

    @nn.compact
    def __call__(self, x, deterministic):
        x = nn.Dense(x.shape[-1])(x)
        x = self.drop(0.3, name="drop")(x, deterministic=deterministic)
        return self.drop(0.5, broadcast_dims=(0,), name="wide")(jnp.tanh(x), deterministic)


class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic):
        body = nn.scan(
            lambda m, c, _: (m(c, deterministic), None),
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            length=3,
        )
        return body(Block(), x, None)[0]


class Remat(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic):
        return nn.remat(Block, static_argnums=(2,))()(x, deterministic)


class Vmapped(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic):
        vblock = nn.vmap(
            Block,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=(0, None),
        )
        return vblock()(x, deterministic)


MODELS = {"plain": Block, "scan": Scanned, "remat": Remat, "vmap": Vmapped}


# Every model under jit; eagerly, the plain block. The swap acts when a module is
# called, at trace time, the same with or without jit around it: the eager case checks
# that nothing depends on being traced, and the transforms add only the jitted programs.
# Fast: a scanned model and the eager call; the other transforms are slow.
@pytest.mark.parametrize(
    ("name", "jit"),
    covering(
        [(name, True) for name in MODELS] + [("plain", False)],
        [("scan", True), ("plain", False)],
        unpack=True,
    ),
)
def test_impl_flax_is_bit_identical_to_not_swapping(name, jit):
    model = MODELS[name]()
    x = jax.random.normal(jax.random.key(0), (4, 6, 8))
    params = model.init(jax.random.key(2), x, True)

    def loss(p, key):
        return jnp.sum(model.apply(p, x, False, rngs={"dropout": key}) ** 2)

    fn = jax.value_and_grad(loss)
    fn = jax.jit(fn) if jit else fn
    expected = fn(params, jax.random.key(3))
    with dl.swap_dropout(impl="flax"):
        got = (jax.jit(jax.value_and_grad(loss)) if jit else jax.value_and_grad(loss))(
            params, jax.random.key(3)
        )
    assert _equal(got, expected)
    assert float(expected[0]) != float(model.apply(params, x, True).sum() ** 2)  # dropout ran


def test_default_impl_draws_dropmask_masks_one_per_site_and_step():
    x = jnp.ones((64, 256))
    params = Block().init(jax.random.key(0), x, True)
    ours = Block(drop=functools.partial(dl.Dropout, impl="fast"))
    with dl.swap_dropout():
        swapped = jax.jit(lambda k: Block().apply(params, x, False, rngs={"dropout": k}))
        steps = [swapped(jax.random.key(s)) for s in range(2)]
    own = jax.jit(lambda k: ours.apply(params, x, False, rngs={"dropout": k}))
    for s, y in enumerate(steps):  # the very masks dropmask's own layers draw
        # Jitted as the swapped call is: eagerly, tanh runs in a fusion of its own and
        # may round differently in the last bit.
        np.testing.assert_array_equal(y, own(jax.random.key(s)))
    flax = Block().apply(params, x, False, rngs={"dropout": jax.random.key(0)})
    assert not np.array_equal(steps[0], flax)
    assert not np.array_equal(steps[0] == 0, steps[1] == 0)  # a new mask per step

    sites = {}

    def keep_of(name, rate):
        def capture(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            if isinstance(context.module, dl.Dropout) and context.module.name == name:
                sites[name] = (out != 0, rate)
            return out

        return capture

    with dl.swap_dropout(), nn.intercept_methods(keep_of("drop", 0.3)):
        Block().apply(params, x, False, rngs=RNGS)
    kept, rate = sites["drop"]
    n = kept.size
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(float(kept.mean()) - (1 - rate)) < 4 * sigma


class Sub(nn.Dropout):
    """A subclass that does its own work and then calls Flax's."""

    @nn.compact
    def __call__(self, inputs, deterministic=None, rng=None):
        return super().__call__(2.0 * inputs, deterministic, rng)


def test_subclass_is_routed_once_after_its_own_code():
    x = jnp.ones((8, 32))
    layer = Sub(0.5, deterministic=False)
    calls = []

    def count(next_fun, args, kwargs, context):
        if isinstance(context.module, dl.Dropout) and context.method_name == "__call__":
            calls.append(context.module.name)
        return next_fun(*args, **kwargs)

    expected = layer.apply({}, x, rngs=RNGS)
    with dl.swap_dropout(impl="flax"), nn.intercept_methods(count):
        got = layer.apply({}, x, rngs=RNGS)
    np.testing.assert_array_equal(got, expected)
    assert len(calls) == 1
    assert set(np.unique(np.asarray(got))) == {0.0, 4.0}  # 2x, then 1/keep


def test_nested_swaps_the_innermost_decides_and_dropmask_layers_are_untouched():
    x = jnp.ones((16, 64))
    params = Block().init(jax.random.key(0), x, True)
    apply = functools.partial(Block().apply, params, x, False, rngs=RNGS)
    flax = apply()
    with dl.swap_dropout():
        fast = apply()
        with dl.swap_dropout(impl="flax"):
            np.testing.assert_array_equal(apply(), flax)
        np.testing.assert_array_equal(apply(), fast)
    assert not np.array_equal(fast, flax)
    np.testing.assert_array_equal(apply(), flax)  # nothing left active
    ours = Block(drop=functools.partial(dl.Dropout, impl="fast"))
    with dl.swap_dropout(impl="flax"):
        np.testing.assert_array_equal(ours.apply(params, x, False, rngs=RNGS), fast)


def test_one_swap_object_entered_again_nested_or_in_turn_restores_each_time():
    x = jnp.ones((16, 64))
    params = Block().init(jax.random.key(0), x, True)
    apply = functools.partial(Block().apply, params, x, False, rngs=RNGS)
    flax = apply()
    fast_swap, flax_swap = dl.swap_dropout(), dl.swap_dropout(impl="flax")

    @flax_swap
    def recurse(n):
        return apply() if n == 0 else recurse(n - 1)

    with fast_swap:
        fast = apply()
        with flax_swap, fast_swap:  # entered again inside another: it decides again
            with fast_swap:
                np.testing.assert_array_equal(apply(), fast)
            np.testing.assert_array_equal(apply(), fast)
            np.testing.assert_array_equal(recurse(2), flax)
            np.testing.assert_array_equal(apply(), fast)
        np.testing.assert_array_equal(apply(), fast)
    assert not np.array_equal(fast, flax)
    np.testing.assert_array_equal(apply(), flax)  # nothing left active
    assert dl.swapped(nn.Dropout(0.1)) is False
    with fast_swap:  # in turn, once left
        np.testing.assert_array_equal(apply(), fast)
    np.testing.assert_array_equal(apply(), flax)


def test_works_as_a_decorator_and_checks_its_arguments_when_made():
    x = jnp.ones((4, 8))
    layer = nn.Dropout(0.5, deterministic=False)

    @dl.swap_dropout(impl="flax")
    def run():
        return layer.apply({}, x, rngs=RNGS)

    np.testing.assert_array_equal(run(), layer.apply({}, x, rngs=RNGS))
    with pytest.raises(dropmask.DropmaskError, match="impl must be one of"):
        dl.swap_dropout(impl="fastest")
    with pytest.raises(dropmask.DropmaskError, match="attention must be a bool"):
        dl.swap_dropout(attention="yes")  # pyright: ignore[reportArgumentType]


class Attend(nn.Module):
    attention_fn: object = nn.dot_product_attention

    @nn.compact
    def __call__(self, x, deterministic):
        mha = nn.MultiHeadDotProductAttention(
            num_heads=2,
            dropout_rate=0.3,
            broadcast_dropout=False,
            attention_fn=self.attention_fn,  # pyright: ignore[reportArgumentType]
        )
        return mha(x, deterministic=deterministic)


def test_attention_uses_dropmask_attention_only_when_asked_and_only_for_flax_default():
    x = jax.random.normal(jax.random.key(0), (2, 16, 8))
    params = Attend().init(jax.random.key(1), x, True)
    ours = Attend(functools.partial(dropmask.dot_product_attention, impl="fast"))
    flax = Attend().apply(params, x, False, rngs=RNGS)
    want = ours.apply(params, x, False, rngs=RNGS)
    assert not np.allclose(flax, want, atol=1e-3)
    with dl.swap_dropout():
        np.testing.assert_array_equal(Attend().apply(params, x, False, rngs=RNGS), flax)
    with dl.swap_dropout(attention=True):
        np.testing.assert_array_equal(Attend().apply(params, x, False, rngs=RNGS), want)
        custom = Attend(functools.partial(nn.dot_product_attention, broadcast_dropout=False))
        np.testing.assert_array_equal(custom.apply(params, x, False, rngs=RNGS), flax)
        grads = jax.grad(lambda p: Attend().apply(p, x, False, rngs=RNGS).sum())(params)
    want_grads = jax.grad(lambda p: ours.apply(p, x, False, rngs=RNGS).sum())(params)
    assert _equal(grads, want_grads)


def _audit_sites(model, params, x, *, swap_inside: bool, impl: str = "fast"):
    def call(module, x, train):
        if swap_inside:
            with dl.swap_dropout(impl, attention=True):
                return module(x, train)
        return module(x, train)

    report = audit_model(
        model,
        params,
        x,
        train_kwargs={"train": True},
        eval_kwargs={"train": False},
        method=call,
    )
    return [(s.path, s.kind, s.module) for s in report.sites], report.codes


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        x = nn.Dropout(0.2)(nn.Dense(32)(x), deterministic=not train)
        return Attend()(x[None], not train)[0]


# Fast: each impl once, swapped around the audit and inside the audited call in turn.
@pytest.mark.parametrize(
    ("swap_inside", "impl"),
    covering(
        [(inside, impl) for inside in (False, True) for impl in ("fast", "flax")],
        [(False, "fast"), (True, "flax")],
        unpack=True,
    ),
)
def test_audit_sees_each_swapped_site_once_as_dropmask(swap_inside, impl):
    x = jnp.ones((16, 8))
    params = Net().init(jax.random.key(0), x, False)
    if swap_inside:
        sites, codes = _audit_sites(Net(), params, x, swap_inside=True, impl=impl)
    else:
        with dl.swap_dropout(impl, attention=True):  # pyright: ignore[reportArgumentType]
            sites, codes = _audit_sites(Net(), params, x, swap_inside=False)
    assert sites == [
        ("Dropout_0", "dropout", "Dropout"),
        ("Attend_0/MultiHeadDotProductAttention_0", "attention", "MultiHeadDotProductAttention"),
    ]
    assert "rate-mismatch" not in codes and "mask-ignores-key" not in codes
    assert dl.swapped(nn.Dropout(0.1)) is False  # nothing active outside


# --- a Transformer written as Flax's WMT example writes it, unchanged -----------------


class WmtEncoderLayer(nn.Module):
    """Flax's WMT ``Encoder1DBlock`` and ``MlpBlock``: dropout after attention, in the
    MLP, and on the attention weights (``broadcast_dropout=False``)."""

    rate: float = 0.1
    deterministic: bool = False

    @nn.compact
    def __call__(self, inputs):
        x = nn.LayerNorm()(inputs)
        x = nn.MultiHeadDotProductAttention(
            num_heads=4,
            broadcast_dropout=False,
            dropout_rate=self.rate,
            deterministic=self.deterministic,
        )(x)
        x = nn.Dropout(rate=self.rate)(x, deterministic=self.deterministic)
        x = x + inputs
        y = nn.LayerNorm()(x)
        y = nn.Dense(64)(y)
        y = nn.relu(y)
        y = nn.Dropout(rate=self.rate)(y, deterministic=self.deterministic)
        y = nn.Dense(inputs.shape[-1])(y)
        y = nn.Dropout(rate=self.rate)(y, deterministic=self.deterministic)
        return x + y


class WmtEncoder(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(50, 32)(tokens)
        x = nn.Dropout(rate=0.1)(x, deterministic=False)
        for _ in range(2):
            x = WmtEncoderLayer()(x)
        return nn.Dense(50)(nn.LayerNorm()(x))


def _train(steps: int = 3):
    model = WmtEncoder()
    tokens = jax.random.randint(jax.random.key(0), (4, 12), 0, 50)
    params = model.init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, tokens)
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, key):
        def loss(p):
            logits = model.apply(p, tokens, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt)
        return optax.apply_updates(params, updates), opt, value

    losses = []
    for s in range(steps):
        params, opt, value = step(params, opt, jax.random.fold_in(jax.random.key(3), s))
        losses.append(float(value))
    return params, losses


# A training run: the value and gradient of one step are bit-identical in
# test_impl_flax_is_bit_identical_to_not_swapping, and Flax's attention in
# test_impl_flax_attention_is_flax_attention_bit_for_bit.
@pytest.mark.slow
def test_wmt_transformer_trains_bit_identically_with_impl_flax():
    want = _train()
    with dl.swap_dropout(impl="flax"):
        got = _train()
    assert _equal(got, want)
    with dl.swap_dropout(attention=True):
        params, losses = _train()
    assert losses[-1] < losses[0]
    assert not _equal(params, want[0])


class EncoderLayer(nn.Module):
    """``WmtEncoderLayer``'s sites, with the dropout class and attention function as
    fields: Flax's by default, dropmask's when given."""

    drop: Any = nn.Dropout
    attention_fn: Any = nn.dot_product_attention

    @nn.compact
    def __call__(self, inputs):
        x = nn.MultiHeadDotProductAttention(
            num_heads=4, broadcast_dropout=False, dropout_rate=0.1,
            attention_fn=self.attention_fn, deterministic=False,
        )(inputs)  # fmt: skip
        x = inputs + self.drop(rate=0.1)(x, deterministic=False)
        y = self.drop(rate=0.1)(nn.relu(nn.Dense(64)(x)), deterministic=False)
        return x + nn.Dense(inputs.shape[-1])(y)


def test_swapped_step_traces_to_the_program_of_dropmask_layers():
    # The switch acts at trace time only: a swapped step is dropmask's own step, equation
    # for equation, so it runs at the speed of dropmask's layers (docs/swap.md).
    x = jax.random.normal(jax.random.key(0), (2, 8, 32))
    flax_style = EncoderLayer()
    ours = EncoderLayer(drop=dl.Dropout, attention_fn=dropmask.dot_product_attention)
    params = flax_style.init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, x)

    def grad_of(model):
        def loss(p, key):
            return jnp.sum(model.apply(p, x, rngs={"dropout": key}) ** 2)

        return jax.grad(loss)

    with dl.swap_dropout(attention=True):
        swapped = jax.make_jaxpr(grad_of(flax_style))(params, jax.random.key(3))
    want = jax.make_jaxpr(grad_of(ours))(params, jax.random.key(3))
    unswapped = jax.make_jaxpr(grad_of(flax_style))(params, jax.random.key(3))
    assert str(swapped) == str(want)
    assert str(unswapped) != str(want)  # Flax's own dropout traces to another program


# --- every attention module the swap reaches, against Flax's own ----------------------

# The attention modules docs/swap.md names: Flax's and its subclasses.
ATTENTION = {
    "MultiHeadDotProductAttention": nn.MultiHeadDotProductAttention,
    "MultiHeadAttention": nn.MultiHeadAttention,
    "SelfAttention": nn.SelfAttention,
}
B, LQ, LK, F = 3, 5, 4, 8
# (dropout_rate, deterministic, padded): each pair of two of them appears once, and the
# mode that drops weights (0.1, False) runs with a padding mask, where a query sees no key.
MODES = [(0.0, True, 1), (0.0, False, 0), (0.1, True, 0), (0.1, False, 1)]


def _attention_case(name, seed, q_lengths, kv_lengths, padded):
    """``(module, inputs, mask, cotangent)``; the mask pads queries and keys to their
    lengths, so a query past its length, and every query of a length-0 member, sees no
    key."""
    module = ATTENTION[name](num_heads=2, qkv_features=8, broadcast_dropout=False)
    kx, ky, kc = jax.random.split(jax.random.key(seed), 3)
    kv_len = LQ if name == "SelfAttention" else LK
    x = jax.random.normal(kx, (B, LQ, F))
    inputs = (x,) if name == "SelfAttention" else (x, jax.random.normal(ky, (B, LK, F)))
    mask = None
    if padded:
        q_valid = jnp.arange(LQ)[None] < jnp.asarray(q_lengths)[:, None]
        kv_valid = jnp.arange(kv_len)[None] < jnp.asarray(kv_lengths)[:, None]
        mask = nn.make_attention_mask(q_valid, kv_valid)
    return module, inputs, mask, jax.random.normal(kc, (B, LQ, F))


def _attention_value_and_grad(module, params, inputs, mask, cotangent, rate, det):
    module = module.clone(dropout_rate=rate)

    def loss(params, inputs):
        out = module.apply(params, *inputs, mask=mask, deterministic=det, rngs=RNGS)
        return jnp.sum(out * cotangent), out

    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, inputs)


# Flax warns that SelfAttention will be deprecated; the swap reaches it while it exists.
@pytest.mark.filterwarnings("ignore:SelfAttention will be deprecated:DeprecationWarning")
# Fast: Flax's class itself; its two subclasses (slow) reach the same swap.
@pytest.mark.parametrize("name", covering(ATTENTION, ["MultiHeadDotProductAttention"]))
@settings(max_examples=3)
@given(
    seed=st.integers(0, 2**16),
    q_lengths=st.lists(st.integers(0, LQ), min_size=B, max_size=B),
    kv_lengths=st.lists(st.integers(0, LQ), min_size=B, max_size=B),  # beyond LK: all valid
)
def test_impl_flax_attention_is_flax_attention_bit_for_bit(name, seed, q_lengths, kv_lengths):
    # Padding masks (queries with no valid key included), dropout 0 and 0.1,
    # deterministic or not: outputs and gradients are Flax's own, every bit.
    for rate, det, padded in MODES:
        module, inputs, mask, cotangent = _attention_case(name, seed, q_lengths, kv_lengths, padded)
        params = module.init(jax.random.key(2), *inputs, mask=mask, deterministic=True)
        run = functools.partial(
            _attention_value_and_grad, module, params, inputs, mask, cotangent, rate, det
        )
        want = run()
        with dl.swap_dropout(impl="flax", attention=True):
            assert dl.swapped(module)
            got = run()
        assert _equal(got, want), (rate, det, padded)


def test_default_impl_attention_differs_from_flax_only_where_docs_swap_md_says():
    # Without dropout: a query with no valid key attends to nothing (the module returns
    # its output projection's bias there; Flax, the projected mean of the values), and
    # every other output and gradient is Flax's within float32 round-off.
    x = jax.random.normal(jax.random.key(0), (B, LQ, F))
    valid = jnp.arange(LQ)[None] < jnp.array([LQ, 2, 0])[:, None]
    mask = nn.make_attention_mask(valid, valid)
    module = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8, dropout_rate=0.1)
    params = module.init(jax.random.key(1), x, mask=mask, deterministic=True)
    noise = jax.random.key(2)  # a bias that is not zero
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(noise, p.shape), params)

    def loss(params, x):
        out = module.apply(params, x, mask=mask, deterministic=True)
        return jnp.sum(jnp.where(valid[..., None], jnp.sin(out), 0.0)), out

    run = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    (_, want), want_grads = run(params, x)
    with dl.swap_dropout(attention=True):
        (_, got), grads = run(params, x)
    bias = params["params"]["out"]["bias"]
    empty = ~np.asarray(valid)
    np.testing.assert_array_equal(got[empty], np.broadcast_to(bias, got[empty].shape))
    assert np.abs(want[empty] - bias[None]).min() > 1e-3  # Flax's mean of the values
    np.testing.assert_allclose(got[~empty], want[~empty], rtol=1e-5, atol=1e-5)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
