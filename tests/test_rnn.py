"""MaskedRNN and Bidirectional (Linen and NNX) against Flax's RNNs, padding and keys."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from flax import nnx

import dropmask
from dropmask import linen as dl
from dropmask import nnx as dn

LENGTHS = jnp.array([6, 3, 1, 4])
ATOL = 1e-6


def _inputs(seed=0, shape=(4, 6, 3)):
    return jax.random.normal(jax.random.key(seed), shape)


def _valid(lengths, steps):
    return (np.arange(steps)[None] < np.asarray(lengths)[:, None])[..., None]


# Every direction, each cell in two of them: the carry's structure (LSTM's pair, GRU's
# array) and the direction reach the masked scan apart, and the NNX test below runs the
# LSTM in all three directions. Fast: every direction once, each cell; the LSTM reversed
# in order is slow.
@pytest.mark.parametrize(
    ("cell", "reverse", "keep_order"),
    [
        (nn.LSTMCell, False, False),
        pytest.param(nn.LSTMCell, True, True, marks=pytest.mark.slow),
        (nn.GRUCell, True, False),
        (nn.GRUCell, True, True),
    ],
)
def test_linen_equals_flax_rnn_for_positive_lengths(cell, reverse, keep_order):
    x = _inputs()
    ours = dl.MaskedRNN(cell(5), reverse=reverse, keep_order=keep_order, return_carry=True)
    flax_rnn = nn.RNN(cell(5), reverse=reverse, keep_order=keep_order, return_carry=True)
    params = ours.init(jax.random.key(1), x, lengths=LENGTHS)
    # The same parameter tree, so one set of parameters drives both (its structure,
    # traced without running Flax's initialisation).
    assert jax.tree.structure(params) == jax.tree.structure(
        jax.eval_shape(lambda: flax_rnn.init(jax.random.key(1), x, seq_lengths=LENGTHS))
    )
    carry, y = ours.apply(params, x, lengths=LENGTHS)
    flax_carry, flax_y = flax_rnn.apply(params, x, seq_lengths=LENGTHS)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL), carry, flax_carry)
    valid = _valid(LENGTHS, 6)
    np.testing.assert_allclose(np.where(valid, y, 0), np.where(valid, flax_y, 0), atol=ATOL)
    np.testing.assert_array_equal(np.where(valid, 0, y), 0)  # padding outputs are 0
    # A mask with the same valid steps gives the same result.
    mask = dropmask.sequence_mask(LENGTHS, 6)
    carry_m, y_m = ours.apply(params, x, mask=mask)
    np.testing.assert_array_equal(y_m, y)
    jax.tree.map(np.testing.assert_array_equal, carry_m, carry)


def test_length_zero_returns_the_initial_carry_where_flax_does_not():
    x, lengths = _inputs(shape=(2, 5, 3)), jnp.array([5, 0])
    ours = dl.MaskedRNN(nn.LSTMCell(4), return_carry=True)
    params = ours.init(jax.random.key(0), x, lengths=lengths)
    (c, h), y = ours.apply(params, x, lengths=lengths)
    np.testing.assert_array_equal(c[1], 0)
    np.testing.assert_array_equal(h[1], 0)
    np.testing.assert_array_equal(y[1], 0)
    # Flax slices the carry at index lengths - 1 = -1: the carry after the last,
    # padded step, though the sequence has no valid step.
    (_, flax_h), _ = nn.RNN(nn.LSTMCell(4), return_carry=True).apply(params, x, seq_lengths=lengths)
    assert float(jnp.abs(flax_h[1]).max()) > 1e-3
    # A given initial carry comes back unchanged.
    init = (jnp.full((2, 4), 0.5), jnp.full((2, 4), -0.25))
    (c0, h0), _ = ours.apply(params, x, lengths=lengths, initial_carry=init)
    np.testing.assert_array_equal(c0[1], 0.5)
    np.testing.assert_array_equal(h0[1], -0.25)


def test_holes_in_the_mask_equal_the_compacted_sequence():
    x = _inputs(shape=(1, 6, 3))
    mask = jnp.array([[False, True, True, False, True, False]])
    rnn = dl.MaskedRNN(nn.GRUCell(4), return_carry=True)
    params = rnn.init(jax.random.key(0), x, mask=mask)
    carry, y = rnn.apply(params, x, mask=mask)
    compact_carry, compact_y = rnn.apply(params, x[:, jnp.array([1, 2, 4])])
    np.testing.assert_allclose(carry, compact_carry, atol=ATOL)
    np.testing.assert_allclose(y[:, jnp.array([1, 2, 4])], compact_y, atol=ATOL)
    np.testing.assert_array_equal(y[:, jnp.array([0, 3, 5])], 0)


def test_non_finite_padding_reaches_no_output_or_gradient():
    x = _inputs()
    rnn = dl.Bidirectional(dl.MaskedRNN(nn.LSTMCell(4)), dl.MaskedRNN(nn.LSTMCell(4)))
    params = rnn.init(jax.random.key(0), x, lengths=LENGTHS)

    def loss(params, inputs):
        return jnp.sum(rnn.apply(params, inputs, lengths=LENGTHS) ** 2)

    # One program each for the loss and its gradient, run on every input.
    value, grad = jax.jit(loss), jax.jit(jax.grad(loss, argnums=(0, 1)))
    clean_params, clean_x = grad(params, x)
    for bad in (jnp.nan, jnp.inf):
        padded = jnp.where(_valid(LENGTHS, 6), x, bad)
        np.testing.assert_array_equal(value(params, padded), value(params, x))
        g_params, g_x = grad(params, padded)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL), g_params, clean_params
        )
        np.testing.assert_allclose(g_x, clean_x, atol=ATOL)
        np.testing.assert_array_equal(np.where(_valid(LENGTHS, 6), 0, g_x), 0)


def test_jit_vmap_grad():
    x = _inputs()
    rnn = dl.MaskedRNN(nn.LSTMCell(4), reverse=True)
    params = rnn.init(jax.random.key(0), x, lengths=LENGTHS)
    eager = rnn.apply(params, x, lengths=LENGTHS)
    jitted = jax.jit(lambda p, x, n: rnn.apply(p, x, lengths=n))(params, x, LENGTHS)
    np.testing.assert_allclose(jitted, eager, atol=ATOL)
    # vmap over an outer axis of batches equals each batch on its own.
    xs, ns = jnp.stack([x, x[::-1]]), jnp.stack([LENGTHS, LENGTHS[::-1]])
    mapped = jax.vmap(lambda x, n: rnn.apply(params, x, lengths=n))(xs, ns)
    np.testing.assert_allclose(
        mapped[1], rnn.apply(params, x[::-1], lengths=LENGTHS[::-1]), atol=ATOL
    )
    small = _inputs(shape=(2, 3, 2))
    small_params = rnn.init(jax.random.key(1), small, lengths=jnp.array([3, 1]))
    jax.test_util.check_grads(  # jit: the numerical check evaluates the function many times
        jax.jit(lambda p: jnp.sum(rnn.apply(p, small, lengths=jnp.array([3, 1])) ** 2)),
        (small_params,),
        order=1,
        modes=("rev",),
        atol=1e-2,
        rtol=1e-2,
    )


class _DropoutCell(nn.Module):
    """Output ``dropout(x_t)``; the carry counts steps."""

    @nn.compact
    def __call__(self, carry, x):
        return carry + 1, dl.Dropout(0.5, deterministic=False)(x)

    @nn.nowrap
    def initialize_carry(self, key, input_shape):
        del key
        return jnp.zeros(input_shape[:1])


def test_dropout_in_a_linen_cell_draws_a_new_mask_per_step_from_the_dropout_stream():
    x = jnp.ones((2, 6, 64))
    rnn = dl.MaskedRNN(_DropoutCell())
    y = rnn.apply({}, x, lengths=jnp.array([6, 4]), rngs={"dropout": jax.random.key(0)})
    again = rnn.apply({}, x, lengths=jnp.array([6, 4]), rngs={"dropout": jax.random.key(0)})
    other = rnn.apply({}, x, lengths=jnp.array([6, 4]), rngs={"dropout": jax.random.key(1)})
    np.testing.assert_array_equal(y, again)
    assert not np.array_equal(y, other)
    kept = np.asarray(y[0] != 0)  # [time, features]
    assert all(not np.array_equal(kept[0], kept[t]) for t in range(1, 6))
    np.testing.assert_array_equal(y[1, 4:], 0)
    assert np.any(np.asarray(y[1, :4]) == 0)  # the mask reaches every row
    with pytest.raises(dl.MissingStreamError, match="dropout"):
        rnn.apply({}, x)


def test_linen_bidirectional_equals_flax_and_reverses_only_the_valid_prefix():
    x = _inputs()
    ours = dl.Bidirectional(dl.MaskedRNN(nn.GRUCell(3)), dl.MaskedRNN(nn.GRUCell(3)))
    params = ours.init(jax.random.key(0), x, lengths=LENGTHS)
    flax_bi = nn.Bidirectional(nn.RNN(nn.GRUCell(3)), nn.RNN(nn.GRUCell(3)))
    renamed = {
        "params": {
            "forward_rnn": params["params"]["forward_rnn"],
            "backward_rnn": params["params"]["backward_rnn"],
        }
    }
    y = ours.apply(params, x, lengths=LENGTHS)
    valid = _valid(LENGTHS, 6)
    np.testing.assert_allclose(
        np.where(valid, y, 0),
        np.where(valid, flax_bi.apply(renamed, x, seq_lengths=LENGTHS), 0),
        atol=ATOL,
    )
    # The backward half is the forward cell run on each flipped valid prefix.
    backward = dl.MaskedRNN(nn.GRUCell(3))
    bparams = {"params": params["params"]["backward_rnn"]}
    flipped = dropmask.flip_sequences(x, LENGTHS)
    expected = dropmask.flip_sequences(backward.apply(bparams, flipped, lengths=LENGTHS), LENGTHS)
    np.testing.assert_allclose(y[..., 3:], expected, atol=ATOL)


def test_errors_name_the_argument():
    rnn = dl.MaskedRNN(nn.GRUCell(3))
    x = _inputs()
    with pytest.raises(dropmask.DropmaskValueError, match="not both"):
        rnn.init(jax.random.key(0), x, lengths=LENGTHS, mask=jnp.ones((4, 6), bool))
    with pytest.raises(dropmask.MaskShapeError, match=r"bool\[batch, time\]"):
        rnn.init(jax.random.key(0), x, mask=jnp.ones((4, 5), bool))
    with pytest.raises(dropmask.MaskShapeError, match=r"lengths must be \[batch\]"):
        rnn.init(jax.random.key(0), x, lengths=jnp.array([1, 2]))
    with pytest.raises(dropmask.MaskShapeError, match=r"\[batch, time, \.\.\.\]"):
        rnn.init(jax.random.key(0), jnp.ones(3))
    with pytest.raises(dropmask.DtypeError):
        rnn.init(jax.random.key(0), x, mask=jnp.ones((4, 6)))


@pytest.mark.parametrize(("reverse", "keep_order"), [(False, False), (True, False), (True, True)])
def test_nnx_equals_flax_rnn_and_keeps_the_initial_carry(reverse, keep_order):
    x = _inputs()
    cell = nnx.LSTMCell(3, 5, rngs=nnx.Rngs(0))
    ours = dn.MaskedRNN(cell, reverse=reverse, keep_order=keep_order, return_carry=True)
    flax_rnn = nnx.RNN(cell, reverse=reverse, keep_order=keep_order, return_carry=True)
    carry, y = ours(x, lengths=LENGTHS)
    flax_carry, flax_y = flax_rnn(x, seq_lengths=LENGTHS)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL), carry, flax_carry)
    valid = _valid(LENGTHS, 6)
    np.testing.assert_allclose(np.where(valid, y, 0), np.where(valid, flax_y, 0), atol=ATOL)
    (c0, h0), y0 = ours(x, lengths=jnp.array([6, 0, 1, 0]))
    np.testing.assert_array_equal(h0[jnp.array([1, 3])], 0)
    np.testing.assert_array_equal(y0[jnp.array([1, 3])], 0)


def test_nnx_grad_through_padding_and_dropout_stream():
    class Cell(nnx.Module):
        def __init__(self, rngs):
            self.gru = nnx.GRUCell(3, 4, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def initialize_carry(self, shape):
            return jnp.zeros((*shape[:-1], 4))

        def __call__(self, carry, x):
            return self.gru(carry, self.drop(x))

    model = dn.Bidirectional(
        dn.MaskedRNN(Cell(nnx.Rngs(0, dropout=1))), dn.MaskedRNN(Cell(nnx.Rngs(2, dropout=3)))
    )
    x = _inputs()
    padded = jnp.where(_valid(LENGTHS, 6), x, jnp.nan)

    def loss(model, inputs):
        return jnp.sum(model(inputs, lengths=LENGTHS) ** 2)

    model.eval()
    grads = nnx.grad(loss)(model, padded)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    np.testing.assert_array_equal(loss(model, padded), loss(model, x))
    model.train()
    first, second = model(x, lengths=LENGTHS), model(x, lengths=LENGTHS)
    assert not np.array_equal(first, second)  # each call draws new masks
    assert bool(jnp.all(jnp.isfinite(first)))
    jitted = nnx.jit(lambda m, x: m(x, lengths=LENGTHS))(model, x)
    assert jitted.shape == (4, 6, 8)


def test_bf16_inputs_give_flax_rnn_dtypes_and_values():
    x = _inputs().astype(jnp.bfloat16)
    ours = dl.MaskedRNN(nn.LSTMCell(4, dtype=jnp.bfloat16), return_carry=True)
    flax_rnn = nn.RNN(nn.LSTMCell(4, dtype=jnp.bfloat16), return_carry=True)
    params = ours.init(jax.random.key(0), x, lengths=LENGTHS)
    (carry, y), (flax_carry, flax_y) = (
        ours.apply(params, x, lengths=LENGTHS),
        flax_rnn.apply(params, x, seq_lengths=LENGTHS),
    )
    assert jax.tree.map(lambda a: a.dtype, (carry, y)) == jax.tree.map(
        lambda a: a.dtype, (flax_carry, flax_y)
    )
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-2), carry, flax_carry)


def test_nnx_bidirectional_equals_flax():
    x = _inputs()
    forward, backward = (nnx.GRUCell(3, 4, rngs=nnx.Rngs(seed)) for seed in (0, 1))
    ours = dn.Bidirectional(dn.MaskedRNN(forward), dn.MaskedRNN(backward))
    flax_bi = nnx.Bidirectional(nnx.RNN(forward), nnx.RNN(backward))
    valid = _valid(LENGTHS, 6)
    y, flax_y = ours(x, lengths=LENGTHS), flax_bi(x, seq_lengths=LENGTHS)
    np.testing.assert_allclose(np.where(valid, y, 0), np.where(valid, flax_y, 0), atol=ATOL)
    np.testing.assert_array_equal(np.where(valid, 0, y), 0)


def _linen_bi():
    return dl.Bidirectional(dl.MaskedRNN(nn.GRUCell(4)), dl.MaskedRNN(nn.GRUCell(4)))


def _nnx_bi():
    cells = (nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), nnx.GRUCell(3, 4, rngs=nnx.Rngs(1)))
    return dn.Bidirectional(dn.MaskedRNN(cells[0]), dn.MaskedRNN(cells[1]))


_X = jnp.ones((2, 5, 3))
_BOTH = {"mask": jnp.ones((2, 5), bool), "lengths": jnp.array([5, 2])}
_LINEN_RNN = dl.MaskedRNN(nn.GRUCell(4))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: _LINEN_RNN.init(jax.random.key(0), _X, lengths=jnp.array([5.0, 2.0])),
            r"^dropmask\.linen\.MaskedRNN: lengths must be integers.*astype",
        ),
        (
            lambda: _LINEN_RNN.init(jax.random.key(0), _X, lengths=jnp.array([9, 2])),
            r"^dropmask\.linen\.MaskedRNN: lengths must be in \[0, 5\].*pad_sequences",
        ),
        (
            lambda: _LINEN_RNN.init(jax.random.key(0), jnp.ones((2, 5))),
            r"^dropmask\.linen\.MaskedRNN: initial_carry leaves must be \[batch.*x\[\.\.\., None\]",
        ),
        (
            lambda: _linen_bi().init(jax.random.key(0), _X, **_BOTH),
            r"^dropmask\.linen\.Bidirectional: pass mask or lengths, not both",
        ),
        (
            lambda: _linen_bi().init(jax.random.key(0), _X, initial_carry=jnp.zeros((2, 4))),
            r"^dropmask\.linen\.Bidirectional: initial_carry must be a \(forward, backward\) pair",
        ),
        (
            lambda: _linen_bi().init(jax.random.key(0), _X, init_key=3),
            r"^dropmask\.linen\.Bidirectional: init_key must be one PRNG key.*jax\.random\.key",
        ),
        (
            lambda: _nnx_bi()(_X, **_BOTH),
            r"^dropmask\.nnx\.Bidirectional: pass mask or lengths, not both",
        ),
        (
            lambda: _nnx_bi()(_X, initial_carry=jnp.zeros((2, 4))),
            r"^dropmask\.nnx\.Bidirectional: initial_carry must be a \(forward, backward\) pair",
        ),
    ],
)
def test_errors_name_the_public_layer_and_argument(call, match):
    with pytest.raises(dropmask.DropmaskError, match=match):
        call()
