"""masked_scan and flip_sequences, against lax.scan on each sequence cut to its length."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen.recurrent import flip_sequences as flax_flip
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
from tests.covering import covering

import dropmask as dm

BATCH, TIME, FEATURES, HIDDEN = 3, 4, 2, 3
_rng = np.random.default_rng(0)
PARAMS = {
    "w": jnp.asarray(_rng.normal(size=(HIDDEN, HIDDEN)) * 0.5, jnp.float32),
    "u": jnp.asarray(_rng.normal(size=(FEATURES, HIDDEN)), jnp.float32),
}


def cell(params, carry, x):
    new = jnp.tanh(carry @ params["w"] + x @ params["u"])
    return new, (new * 2.0, jnp.sum(x))


def _loss(final, ys):
    return jnp.sum(final) + jnp.sum(ys[0] * 0.3) + jnp.sum(ys[1])


@functools.partial(jax.jit, static_argnames="reverse")
def ours(params, init, xs, mask, reverse=False):
    """Loss, outputs and gradients of a vmapped masked_scan over [batch, time, ...]."""

    def run(params, init, xs):
        def one(c0, x, m):
            return dm.masked_scan(functools.partial(cell, params), c0, x, m, reverse=reverse)

        final, ys = jax.vmap(one)(init, xs, mask)
        return _loss(final, ys), (final, ys)

    (loss, out), grads = jax.value_and_grad(run, argnums=(0, 1, 2), has_aux=True)(params, init, xs)
    return loss, out, grads


@functools.partial(jax.jit, static_argnames="reverse")
def reference(params, init, xs, reverse=False):
    """The same on one unpadded sequence ``xs: [length, features]`` with plain lax.scan."""

    def run(params, init, xs):
        final, ys = lax.scan(functools.partial(cell, params), init, xs, reverse=reverse)
        return _loss(final, ys), (final, ys)

    (loss, out), grads = jax.value_and_grad(run, argnums=(0, 1, 2), has_aux=True)(params, init, xs)
    return loss, out, grads


@given(
    st.lists(st.integers(0, TIME), min_size=BATCH, max_size=BATCH),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_masked_scan_equals_scan_on_each_cut_sequence(lengths, seed, reverse):
    rng = np.random.default_rng(seed)
    lengths = np.array(lengths)
    mask = np.arange(TIME) < lengths[:, None]
    xs = rng.normal(size=(BATCH, TIME, FEATURES)).astype(np.float32)
    junk = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), size=xs.shape)
    xs = np.where(mask[..., None], xs, junk)
    init = rng.normal(size=(BATCH, HIDDEN)).astype(np.float32)
    with jax.debug_nans(True):
        _, (final, (ys, sums)), (g_params, g_init, g_xs) = ours(PARAMS, init, xs, mask, reverse)
    g_xs = np.asarray(g_xs)
    assert (g_xs[~mask] == 0).all() and np.isfinite(g_xs).all()
    want_gw = jax.tree.map(jnp.zeros_like, PARAMS)
    for i, n in enumerate(lengths):
        _, (f_ref, (ys_ref, sums_ref)), (gp, gi, gx) = reference(
            PARAMS, init[i], xs[i, :n], reverse
        )
        tol = {"rtol": 1e-5, "atol": 1e-6}
        np.testing.assert_allclose(final[i], f_ref, **tol)
        np.testing.assert_allclose(ys[i, :n], ys_ref, **tol)
        np.testing.assert_allclose(sums[i, :n], sums_ref, **tol)
        assert (ys[i, n:] == 0).all() and (sums[i, n:] == 0).all()
        np.testing.assert_allclose(g_init[i], gi, **tol)
        np.testing.assert_allclose(g_xs[i, :n], gx, **tol)
        want_gw = jax.tree.map(jnp.add, want_gw, gp)
        if n == 0:
            np.testing.assert_array_equal(final[i], init[i])  # length 0 returns init
    for name in PARAMS:
        np.testing.assert_allclose(g_params[name], want_gw[name], rtol=1e-5, atol=1e-5)


def test_recipe_scan_body_and_time_major_layout():
    """The hand-written recipe (where on carry and output), and the time-major layout."""

    def recipe_body(carry, inputs):
        hidden, x, m = carry[0], inputs[0], inputs[1]
        potential = hidden * 0.9 + x * 0.1
        new = jnp.where(m, potential, hidden)
        return (new,), jnp.where(m, new * 2.0, 0.0)

    def step(hidden, x):
        new = hidden * 0.9 + x * 0.1
        return new, new * 2.0

    inputs = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]])
    mask = dm.sequence_mask(jnp.array([3, 2]), 4)
    (recipe_final,), recipe_out = lax.scan(recipe_body, (jnp.zeros(2),), (inputs.T, mask.T))
    final, out = dm.masked_scan(step, jnp.zeros(2), inputs.T, mask.T)
    np.testing.assert_allclose(final, recipe_final, rtol=1e-6)
    np.testing.assert_allclose(out, recipe_out, rtol=1e-6)
    vfinal, vout = jax.vmap(lambda x, m: dm.masked_scan(step, 0.0, x, m))(inputs, mask)
    np.testing.assert_allclose(vfinal, final, rtol=1e-6)
    np.testing.assert_allclose(vout, out.T, rtol=1e-6)


def test_flax_rnn_cell_plugs_in_and_fixes_length_zero():
    gru = nn.GRUCell(features=HIDDEN)
    xs = jax.random.normal(jax.random.key(0), (BATCH, TIME, FEATURES))
    lengths = jnp.array([TIME, 2, 0])
    carry0 = gru.initialize_carry(jax.random.key(1), (BATCH, FEATURES))
    params = gru.init(jax.random.key(2), carry0, xs[:, 0])
    rnn = nn.RNN(gru, return_carry=True)
    flax_carry, flax_out = jax.jit(rnn.apply)(
        {"params": {"cell": params["params"]}}, xs, seq_lengths=lengths, initial_carry=carry0
    )
    mask = dm.sequence_mask(lengths, TIME)

    def step(c, x):
        return gru.apply(params, c, x)

    time_major = jax.jit(lambda c, x, m: dm.masked_scan(step, c, x, m))
    carry, out = time_major(carry0, xs.swapaxes(0, 1), mask.T)
    out = out.swapaxes(0, 1)
    valid = np.asarray(mask)
    np.testing.assert_allclose(
        np.asarray(out)[valid], np.asarray(flax_out)[valid], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(carry[:2], flax_carry[:2], rtol=1e-5, atol=1e-6)
    # Where Flax goes wrong: a length-0 sequence gets the last carry, padded outputs are non-zero.
    np.testing.assert_array_equal(carry[2], carry0[2])
    assert not np.allclose(flax_carry[2], carry0[2])
    assert (np.asarray(out)[~valid] == 0).all() and not (np.asarray(flax_out)[~valid] == 0).all()


@given(st.lists(st.integers(0, 4), min_size=3, max_size=3))
def test_flip_sequences(lengths):
    lengths = np.array(lengths, np.int32)
    x = np.arange(len(lengths) * 4 * 2).reshape(len(lengths), 4, 2)
    flipped = np.asarray(dm.flip_sequences(x, lengths))
    for i, n in enumerate(lengths):
        np.testing.assert_array_equal(flipped[i, :n], x[i, :n][::-1])
        np.testing.assert_array_equal(flipped[i, n:], x[i, n:])
    np.testing.assert_array_equal(dm.flip_sequences(flipped, lengths), x)
    # Flax agrees on the valid prefix (it also permutes the padding, and for length 0
    # flips the whole row).
    flax = np.asarray(flax_flip(jnp.asarray(x), jnp.asarray(lengths), 1, False))
    for i, n in enumerate(lengths):
        np.testing.assert_array_equal(flipped[i, :n], flax[i, :n])
    tm = dm.flip_sequences(x.swapaxes(0, 1), lengths, time_major=True)
    np.testing.assert_array_equal(np.asarray(tm).swapaxes(0, 1), flipped)


def _log_step(c, x):
    # d/dc = log(x): infinite at x = 0, the classic substitute for padding.
    new = c * jnp.log(x) + x
    return new, new * x


def _log_loss(scan):
    def loss(init, xs):
        final, ys = scan(init, xs)
        return jnp.sum(final) + 0.5 * jnp.sum(ys)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


# Fast: each padding side once, the directions in turn.
@pytest.mark.parametrize(
    ("side", "reverse"),
    covering(
        [(side, r) for side in ("right", "left") for r in (False, True)],
        [("right", False), ("left", True)],
        unpack=True,
    ),
    ids=[f"{side}-{r}" for side in ("right", "left") for r in (False, True)],
)
def test_masked_scan_gradients_stay_finite_where_the_step_is_singular_at_zero(reverse, side):
    rng = np.random.default_rng(3)
    lengths = [4, 2, 1]
    seqs = [rng.uniform(0.5, 2.0, size=(n, 2)).astype(np.float32) for n in lengths]
    padded, _ = dm.pad_sequences(seqs, max_len=6, side=side, pad_value=0.0)
    mask = jnp.asarray(np.asarray(padded)[..., 0] != 0)
    init = jnp.asarray(rng.uniform(0.5, 1.5, size=(3, 2)), jnp.float32)

    def masked(init, xs):
        return jax.vmap(lambda c, x, m: dm.masked_scan(_log_step, c, x, m, reverse=reverse))(
            init, xs, mask
        )

    value, (g_init, g_xs) = _log_loss(masked)(init, jnp.asarray(padded))
    assert np.isfinite(value) and np.isfinite(g_init).all() and np.isfinite(g_xs).all()
    for i, n in enumerate(lengths):
        one = lambda c, x: lax.scan(_log_step, c, x, reverse=reverse)  # noqa: E731
        want_value, (want_init, want_xs) = _log_loss(one)(init[i], jnp.asarray(seqs[i]))
        rows = slice(0, n) if side == "right" else slice(6 - n, 6)
        np.testing.assert_allclose(g_init[i], want_init, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g_xs[i, rows], want_xs, rtol=1e-5, atol=1e-6)
        assert (np.delete(np.asarray(g_xs[i]), np.arange(6)[rows], axis=0) == 0).all()


def test_masked_scan_time_major_singular_step_and_fill_input():
    # Time-major batch [time, batch, features], one sequence with no valid step.
    xs = jnp.asarray(np.random.default_rng(4).uniform(0.5, 2.0, size=(3, 3, 2)), jnp.float32)
    mask = jnp.array([[True, True, False], [True, False, False], [False, False, False]])
    xs = jnp.where(mask[..., None], xs, jnp.nan)  # garbage in the padding
    init = jnp.ones((3, 2))

    def scan(init, xs, **kw):
        return dm.masked_scan(_log_step, init, xs, mask, **kw)

    _, (g_init, g_xs) = _log_loss(functools.partial(scan, fill_input=1.0))(init, xs)
    assert np.isfinite(g_init).all() and np.isfinite(g_xs).all()
    np.testing.assert_array_equal(g_init[2], [1.0, 1.0])  # the empty sequence returns init
    # Without a valid step there is nothing to replay: the default fill 0 is log's pole.
    _, (g_init, _) = _log_loss(scan)(init, xs)
    assert np.isfinite(g_init[:2]).all() and not np.isfinite(g_init[2]).all()
    tree = functools.partial(scan, fill_input=jnp.ones(2))
    np.testing.assert_array_equal(
        _log_loss(tree)(init, xs)[1][0],
        _log_loss(functools.partial(scan, fill_input=1.0))(init, xs)[1][0],
    )
    with pytest.raises(dm.MaskShapeError, match="fill_input leaf of shape"):
        scan(init, xs, fill_input=jnp.ones(5))


@pytest.mark.parametrize(("dtype", "n", "steps"), [(np.uint8, 250, 300), (np.int8, 120, 200)])
def test_flip_sequences_with_narrow_integer_lengths(dtype, n, steps):
    x = np.arange(2 * steps).reshape(2, steps)
    lengths = np.array([n, 3], dtype)
    want = x.copy()
    want[0, :n] = x[0, :n][::-1]
    want[1, :3] = x[1, :3][::-1]
    np.testing.assert_array_equal(dm.flip_sequences(x, lengths), want)
    np.testing.assert_array_equal(jax.jit(dm.flip_sequences)(x, lengths), want)


def test_flip_sequences_traced_out_of_range_lengths_stay_in_the_row():
    x = jnp.arange(10).reshape(2, 5)
    flipped = jax.jit(dm.flip_sequences)(x, jnp.array([9, -3], jnp.int8))
    assert flipped.tolist() == [[4, 3, 2, 1, 0], [5, 6, 7, 8, 9]]


def test_flip_sequences_under_jit_and_grad():
    x = jnp.arange(6.0).reshape(2, 3)
    lengths = jnp.array([2, 3])
    flip = jax.jit(dm.flip_sequences)
    assert flip(x, lengths).tolist() == [[1.0, 0.0, 2.0], [5.0, 4.0, 3.0]]
    weights = jnp.arange(6.0).reshape(2, 3)
    grad = jax.grad(lambda v: jnp.sum(flip(v, lengths) * weights))(x)
    assert grad.tolist() == [[1.0, 0.0, 2.0], [5.0, 4.0, 3.0]]
    assert dm.flip_sequences(jnp.ones(4), jnp.array(2)).shape == (4,)


def test_errors():
    f = lambda c, x: (c + x, x)  # noqa: E731
    with pytest.raises(dm.DtypeError, match="mask must be boolean"):
        dm.masked_scan(f, 0.0, jnp.ones(3), jnp.ones(3))
    with pytest.raises(dm.MaskShapeError, match="needs a leading time axis"):
        dm.masked_scan(f, 0.0, jnp.ones(3), jnp.array(True))
    with pytest.raises(dm.MaskShapeError, match=r"every xs leaf must start with \(4,\)"):
        dm.masked_scan(f, 0.0, jnp.ones(3), jnp.ones(4, bool))
    with pytest.raises(dm.MaskShapeError, match=r"init \(carry\) leaf must start with \(2,\)"):
        dm.masked_scan(f, jnp.zeros(3), jnp.ones((4, 2)), jnp.ones((4, 2), bool))
    with pytest.raises(dm.MaskShapeError, match="every output leaf must start with those batch"):
        dm.masked_scan(
            lambda c, x: (c + x, jnp.sum(x)), jnp.zeros(2), jnp.ones((4, 2)), jnp.ones((4, 2), bool)
        )
    with pytest.raises(dm.MaskShapeError, match=r"x must be \[\*batch, time, \.\.\.\] with batch"):
        dm.flip_sequences(jnp.ones((2, 3)), jnp.array([1, 1, 1]))
    with pytest.raises(ValueError, match=r"lengths must be in \[0, 3\]"):
        dm.flip_sequences(jnp.ones((2, 3)), jnp.array([1, 4]))
    with pytest.raises(dm.DtypeError, match="lengths must be integers"):
        dm.flip_sequences(jnp.ones((2, 3)), jnp.array([1.0, 2.0]))


def test_masked_scan_edge_inputs():
    step = lambda c, x: (c + x, c)  # noqa: E731
    carry, ys = dm.masked_scan(step, 1.0, jnp.zeros((0,)), jnp.zeros((0,), bool))
    assert float(carry) == 1.0 and ys.shape == (0,)
    carry, ys = dm.masked_scan(step, 0.0, jnp.array([1.0, 9.0, 2.0]), [True, False, True])
    assert float(carry) == 3.0 and ys.tolist() == [0.0, 0.0, 1.0]
    count = lambda c, _: (c + 1, c)  # noqa: E731  # xs=None, as in lax.scan
    carry, _ = dm.masked_scan(count, 0, None, jnp.array([True, False, True]))
    assert int(carry) == 2
    xs = jnp.array([1.0, 2.0, 3.0], jnp.bfloat16)
    carry, ys = dm.masked_scan(step, jnp.bfloat16(0), xs, jnp.array([True, False, True]))
    assert carry.dtype == ys.dtype == jnp.bfloat16 and float(carry) == 4.0


def test_an_error_in_the_scanned_function_names_what_that_function_called():
    def step(carry, x):
        return carry, dm.dropout(x, 1.5, jax.random.key(0))  # the user's own bad rate

    with pytest.raises(dm.RateError, match=r"^dropout: rate must be in"):
        dm.masked_scan(step, 0.0, jnp.ones((3, 2)), jnp.ones(3, bool))
