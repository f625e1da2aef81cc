"""Zoneout and weight dropout in MaskedRNN / Bidirectional (Linen and NNX) and dropmask.zoneout."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dropmask
from dropmask import linen as dl
from dropmask import nnx as dn

LENGTHS = jnp.array([5, 3, 1, 4])
KEY = jax.random.key(7)


def _inputs(seed=0, shape=(4, 5, 3), dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


class _Counter(nn.Module):
    """Adds 1 to every unit of the carry: zoneout's effect is the count of updates."""

    @nn.compact
    def __call__(self, carry, x):
        del x
        new = carry + 1.0
        return new, new

    def initialize_carry(self, key, input_shape):
        del key
        return jnp.zeros(input_shape, jnp.float32)


class _Readout(nn.Module):
    """Keeps its carry; outputs ``x @ h.kernel``, so one-hot inputs read the kernel out."""

    units: int

    @nn.compact
    def __call__(self, carry, x):
        return carry, nn.Dense(self.units, use_bias=False, name="h")(x)

    def initialize_carry(self, key, input_shape):
        del key
        return jnp.zeros(input_shape[:1], jnp.float32)


def _lstm(**kw):
    rnn = dl.MaskedRNN(nn.LSTMCell(4), return_carry=True, **kw)
    params = rnn.init(jax.random.key(0), _inputs(), lengths=LENGTHS, deterministic=True)
    return rnn, params


# dropmask.zoneout, the functional core.


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_zoneout_evaluation_is_the_expectation(dtype):
    prev = (_inputs(1, (3, 4), dtype), _inputs(2, (3, 4), dtype))
    new = (_inputs(3, (3, 4), dtype), _inputs(4, (3, 4), dtype))
    out = dropmask.zoneout(prev, new, (0.5, 0.05), deterministic=True)
    tol = 1e-6 if dtype == jnp.float32 else 1e-2
    for o, a, b, r in zip(out, prev, new, (0.5, 0.05), strict=True):
        assert o.dtype == dtype
        want = r * np.asarray(a, np.float32) + (1 - r) * np.asarray(b, np.float32)
        np.testing.assert_allclose(np.asarray(o, np.float32), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_zoneout_keeps_each_unit_at_rate_within_4_sigma(dtype, rate):
    batch, units = 4096, 8
    prev, new = jnp.zeros((batch, units), dtype), jnp.ones((batch, units), dtype)
    out = jax.jit(lambda k: dropmask.zoneout(prev, new, rate, k))(KEY)
    assert out.dtype == dtype
    kept = np.mean(np.asarray(out, np.float32) == 0.0, axis=0)  # per unit
    sigma = np.sqrt(rate * (1 - rate) / batch)
    assert np.all(np.abs(kept - rate) < 4 * sigma), (kept, rate)


def test_zoneout_values_are_prev_or_new_and_gradients_split_by_the_mask():
    prev, new = _inputs(1, (64, 4)), _inputs(2, (64, 4))
    out = dropmask.zoneout(prev, new, 0.3, KEY)
    took_new = np.asarray(out == new)
    assert np.all(took_new | np.asarray(out == prev))
    g_prev, g_new = jax.grad(lambda a, b: jnp.sum(dropmask.zoneout(a, b, 0.3, KEY)), (0, 1))(
        prev, new
    )
    np.testing.assert_array_equal(np.asarray(g_new), took_new.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(g_prev), (~took_new).astype(np.float32))


def test_zoneout_under_vmap_over_keys_equals_separate_calls():
    prev, new = _inputs(1, (8, 4)), _inputs(2, (8, 4))
    keys = jax.random.split(KEY, 3)
    mapped = jax.vmap(lambda k: dropmask.zoneout(prev, new, 0.5, k))(keys)
    for i in range(3):
        np.testing.assert_array_equal(mapped[i], dropmask.zoneout(prev, new, 0.5, keys[i]))
    assert not np.array_equal(mapped[0], mapped[1])


def test_zoneout_errors_come_before_any_work():
    a = jnp.zeros((2, 3))
    with pytest.raises(dropmask.RateError, match="zoneout must be in"):
        dropmask.zoneout(a, a, 1.5, KEY)
    with pytest.raises(dropmask.MissingKeyError):
        dropmask.zoneout(a, a, 0.5)
    with pytest.raises(dropmask.MaskShapeError, match="prev and new"):
        dropmask.zoneout(a, jnp.zeros((2, 4)), 0.5, KEY)
    with pytest.raises(dropmask.DropmaskValueError, match="one per carry leaf"):
        dropmask.zoneout((a, a, a), (a, a, a), (0.1, 0.2), KEY)
    with pytest.raises(dropmask.DtypeError):
        dropmask.zoneout(jnp.zeros(3, jnp.int32), jnp.ones(3, jnp.int32), 0.5, KEY)


# Zoneout in MaskedRNN.


def test_masked_rnn_zoneout_statistics_per_unit_within_4_sigma():
    batch, steps, units, rate = 1024, 6, 4, 0.3
    rnn = dl.MaskedRNN(_Counter(), zoneout=rate, return_carry=True)
    x = jnp.zeros((batch, steps, units))
    carry, _ = rnn.apply({}, x, deterministic=False, rng=KEY)
    # Each unit is updated at each step with probability 1 - rate, independently.
    mean = np.mean(np.asarray(carry), axis=0)
    sigma = np.sqrt(steps * rate * (1 - rate) / batch)
    assert np.all(np.abs(mean - steps * (1 - rate)) < 4 * sigma), mean
    # The masks differ across time steps: a repeated mask would make the counts 0 or 6.
    assert 0.5 < np.mean((np.asarray(carry) > 0) & (np.asarray(carry) < steps))


def test_masked_rnn_zoneout_evaluation_is_the_expectation_step_by_step():
    rates = (0.5, 0.05)
    rnn, params = _lstm(zoneout=rates)
    x = _inputs()
    (c, h), y = rnn.apply(params, x, deterministic=True)
    cell_params = {"params": params["params"]["cell"]}
    carry = nn.LSTMCell(4).initialize_carry(jax.random.key(0), x[:, 0].shape)
    for t in range(x.shape[1]):
        new, _ = nn.LSTMCell(4).apply(cell_params, carry, x[:, t])
        carry = tuple(r * a + (1 - r) * b for r, a, b in zip(rates, carry, new, strict=True))
        np.testing.assert_allclose(y[:, t], carry[1], atol=1e-6)
    np.testing.assert_allclose(c, carry[0], atol=1e-6)
    np.testing.assert_allclose(h, carry[1], atol=1e-6)


def test_masked_rnn_training_output_is_the_zoned_hidden_state():
    rnn, params = _lstm(zoneout=(0.5, 0.5))
    (_, h), y = rnn.apply(params, _inputs(), deterministic=False, rng=KEY)
    np.testing.assert_array_equal(y[:, -1], h)


# Weight dropout in MaskedRNN.


def _read_kernel(rate, rng, steps=4, units=6):
    """Outputs ``[units, steps, units]``: at each step, the (dropped) kernel of ``h``."""
    rnn = dl.MaskedRNN(_Readout(units), weight_dropout=rate)
    x = jnp.broadcast_to(jnp.eye(units)[:, None], (units, steps, units))
    params = rnn.init(jax.random.key(0), x, deterministic=True)
    kernel = params["params"]["cell"]["h"]["kernel"]
    return rnn.apply(params, x, deterministic=False, rng=rng), kernel, rnn, params, x


def test_weight_dropout_mask_is_constant_across_time_and_new_per_step():
    rate = 0.5
    y, kernel, rnn, params, x = _read_kernel(rate, KEY)
    for t in range(1, y.shape[1]):
        np.testing.assert_array_equal(y[:, t], y[:, 0])
    kept = np.asarray(y[:, 0] != 0)
    np.testing.assert_allclose(
        np.asarray(y[:, 0])[kept], np.asarray(kernel)[kept] / (1 - rate), rtol=1e-6
    )
    assert 0 < kept.sum() < kept.size
    # The next training step's key (fold_in(key, step), as the training loop derives it)
    # gives another mask.
    other = rnn.apply(params, x, deterministic=False, rng=jax.random.fold_in(KEY, 1))
    assert not np.array_equal(np.asarray(other[:, 0] != 0), kept)
    # In evaluation the kernel is used as is.
    np.testing.assert_allclose(rnn.apply(params, x, deterministic=True)[:, 0], kernel, atol=0)


def test_weight_dropout_keeps_kernel_elements_at_one_minus_rate_within_4_sigma():
    rate, units = 0.3, 64
    y, *_ = _read_kernel(rate, KEY, steps=2, units=units)
    dropped = np.mean(np.asarray(y[:, 0]) == 0)
    sigma = np.sqrt(rate * (1 - rate) / units**2)
    assert abs(dropped - rate) < 4 * sigma, dropped


def test_weight_dropout_drops_only_recurrent_kernels_of_flax_cells():
    rnn, params = _lstm(weight_dropout=0.5)
    grads = jax.grad(
        lambda p: jnp.sum(rnn.apply(p, _inputs(), deterministic=False, rng=KEY)[1] ** 2)
    )(params)["params"]["cell"]
    # Some elements of each recurrent kernel get no gradient (dropped), input kernels all do.
    for name in ("hi", "hf", "hg", "ho"):
        assert np.any(np.asarray(grads[name]["kernel"]) == 0), name
    for name in ("ii", "if", "ig", "io"):
        assert np.all(np.asarray(grads[name]["kernel"]) != 0), name


# Both: padding, transforms, dtypes.


@pytest.mark.parametrize(
    "kw", [{"zoneout": (0.3, 0.1)}, {"weight_dropout": 0.4}], ids=["zoneout", "weight"]
)
def test_a_padded_step_changes_nothing(kw):
    rnn, params = _lstm(**kw)
    x = _inputs().at[:, 3:].set(jnp.nan)
    lengths = jnp.array([3, 3, 3, 3])
    carry, y = rnn.apply(params, x, lengths=lengths, deterministic=False, rng=KEY)
    cut_carry, cut_y = rnn.apply(params, x[:, :3], deterministic=False, rng=KEY)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), carry, cut_carry)
    np.testing.assert_array_equal(y[:, :3], cut_y)
    np.testing.assert_array_equal(y[:, 3:], 0)
    # A padded step in the middle holds the carry: the next valid step starts from it.
    mask = jnp.array([[True, False, True, True, True]] * 4)
    held, _ = rnn.apply(params, _inputs(), mask=mask, deterministic=True)
    compact, _ = rnn.apply(params, _inputs()[:, jnp.array([0, 2, 3, 4])], deterministic=True)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), held, compact)


def test_gradients_are_finite_through_padding():
    # Bidirectional: its forward half is the MaskedRNN alone, its backward half the
    # same on flipped prefixes; a NaN that leaked through either reaches the gradient.
    kw = {"zoneout": (0.3, 0.1), "weight_dropout": 0.4}
    rnn = dl.Bidirectional(dl.MaskedRNN(nn.LSTMCell(4), **kw), dl.MaskedRNN(nn.LSTMCell(4), **kw))
    x = _inputs()
    params = rnn.init(jax.random.key(0), x, lengths=LENGTHS, deterministic=True)
    padded = jnp.where(np.arange(5)[None, :, None] < LENGTHS[:, None, None], x, jnp.nan)

    def loss(p, inputs):
        y = rnn.apply(p, inputs, lengths=LENGTHS, deterministic=False, rng=KEY)
        return jnp.sum(y**2)

    g_params, g_x = jax.grad(loss, (0, 1))(params, padded)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(g_params))
    assert bool(jnp.all(jnp.isfinite(g_x)))
    np.testing.assert_array_equal(jnp.where(jnp.isnan(padded), g_x, 0), 0)


def test_jit_and_vmap_over_keys_match_eager():
    rnn, params = _lstm(zoneout=(0.3, 0.1), weight_dropout=0.4)
    x = _inputs()

    def run(k):
        return rnn.apply(params, x, lengths=LENGTHS, deterministic=False, rng=k)[1]

    keys = jax.random.split(KEY, 2)
    eager = [run(k) for k in keys]
    np.testing.assert_allclose(jax.jit(run)(keys[0]), eager[0], atol=1e-6)
    mapped = jax.vmap(run)(keys)
    for i in range(2):
        np.testing.assert_allclose(mapped[i], eager[i], atol=1e-6)
    assert not np.allclose(eager[0], eager[1])


@pytest.mark.parametrize("deterministic", [False, True])
def test_bf16_cells_keep_their_dtype(deterministic):
    # LAPACK has no bf16 QR, so not the default orthogonal recurrent initializer.
    cell = nn.LSTMCell(
        4,
        dtype=jnp.bfloat16,
        param_dtype=jnp.bfloat16,
        recurrent_kernel_init=nn.initializers.lecun_normal(),
    )
    rnn = dl.MaskedRNN(cell, zoneout=(0.3, 0.1), weight_dropout=0.4, return_carry=True)
    x = _inputs(dtype=jnp.bfloat16)
    params = rnn.init(jax.random.key(0), x, lengths=LENGTHS, deterministic=True)
    (c, h), y = rnn.apply(params, x, lengths=LENGTHS, deterministic=deterministic, rng=KEY)
    assert c.dtype == h.dtype == y.dtype == jnp.bfloat16
    assert bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))


def test_regularizers_off_change_nothing_and_evaluation_draws_no_key():
    plain, params = _lstm()
    regularized = dl.MaskedRNN(
        nn.LSTMCell(4), return_carry=True, zoneout=0.0, weight_dropout=0.0, deterministic=False
    )
    x = _inputs()
    np.testing.assert_array_equal(
        plain.apply(params, x, lengths=LENGTHS)[1], regularized.apply(params, x, lengths=LENGTHS)[1]
    )
    weight_only = dl.MaskedRNN(nn.LSTMCell(4), return_carry=True, weight_dropout=0.5)
    np.testing.assert_array_equal(
        plain.apply(params, x, lengths=LENGTHS)[1],
        weight_only.apply(params, x, lengths=LENGTHS, deterministic=True)[1],
    )


def test_bidirectional_directions_draw_their_own_masks():
    kw = {"weight_dropout": 0.5}
    bi = dl.Bidirectional(dl.MaskedRNN(_Readout(6), **kw), dl.MaskedRNN(_Readout(6), **kw))
    x = jnp.broadcast_to(jnp.eye(6)[:, None], (6, 3, 6))
    params = bi.init(jax.random.key(0), x, deterministic=True)
    shared = params["params"]["forward_rnn"]
    params = {"params": {"forward_rnn": shared, "backward_rnn": shared}}
    y = bi.apply(params, x, deterministic=False, rngs={"dropout": KEY})
    assert not np.array_equal(np.asarray(y[:, 0, :6] == 0), np.asarray(y[:, 0, 6:] == 0))


# NNX, and Linen against NNX.


def _nnx_lstm_like(params, **kw):
    cell = nnx.LSTMCell(3, 4, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(cell)
    pure = nnx.to_pure_dict(state)
    linen_cell = params["params"]["cell"]
    for name, layer in pure.items():
        for leaf in layer:
            layer[leaf] = linen_cell["if" if name == "if_" else name][leaf]
    nnx.replace_by_pure_dict(state, pure)
    return dn.MaskedRNN(nnx.merge(graphdef, state), return_carry=True, **kw)


# Fast: drawing; deterministic (slow), each form equals Flax's RNN in tests/test_rnn.py.
@pytest.mark.parametrize("deterministic", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_linen_and_nnx_agree_for_the_same_key(deterministic):
    kw = {"zoneout": (0.3, 0.1), "weight_dropout": 0.4}
    rnn, params = _lstm(**kw)
    ours = _nnx_lstm_like(params, **kw)
    x = _inputs()
    a = rnn.apply(params, x, lengths=LENGTHS, deterministic=deterministic, rng=KEY)
    b = ours(x, lengths=LENGTHS, deterministic=deterministic, rngs=KEY)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, atol=1e-6), a, b)


def test_nnx_follows_train_and_eval_and_advances_its_stream():
    rnn = dn.MaskedRNN(
        nnx.LSTMCell(3, 4, rngs=nnx.Rngs(0)), zoneout=(0.3, 0.1), rngs=nnx.Rngs(dropout=1)
    )
    x = _inputs()
    first, second = rnn(x, lengths=LENGTHS), rnn(x, lengths=LENGTHS)
    assert not np.allclose(first, second)
    rnn.eval()
    np.testing.assert_array_equal(rnn(x, lengths=LENGTHS), rnn(x, lengths=LENGTHS))
    rnn.train()
    assert not rnn.deterministic


def test_nnx_weight_dropout_and_jit():
    rnn = dn.MaskedRNN(
        nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), weight_dropout=0.5, rngs=nnx.Rngs(dropout=1)
    )
    x = _inputs()
    eager = rnn(x, lengths=LENGTHS, rngs=KEY)
    jitted = nnx.jit(lambda m, v: m(v, lengths=LENGTHS, rngs=KEY))(rnn, x)
    np.testing.assert_allclose(jitted, eager, atol=1e-6)
    plain = rnn(x, lengths=LENGTHS, deterministic=True)
    assert not np.allclose(eager, plain)
    grads = nnx.grad(lambda m: jnp.sum(m(x, lengths=LENGTHS, rngs=KEY) ** 2))(rnn)
    assert np.any(np.asarray(grads["cell"]["dense_h"]["kernel"][...]) == 0)


def test_nnx_bidirectional_with_regularizers():
    def make(rngs):
        return dn.MaskedRNN(
            nnx.LSTMCell(3, 4, rngs=rngs), zoneout=(0.3, 0.1), weight_dropout=0.4, rngs=rngs
        )

    rngs = nnx.Rngs(0, dropout=1)
    bi = dn.Bidirectional(make(rngs), make(rngs))
    y = bi(_inputs(), lengths=LENGTHS)
    assert y.shape == (4, 5, 8)
    np.testing.assert_array_equal(y[2, 1:], 0)
    np.testing.assert_array_equal(
        bi(_inputs(), lengths=LENGTHS, rngs=KEY), bi(_inputs(), lengths=LENGTHS, rngs=KEY)
    )


# Errors, in one line and before any work.


def test_errors_name_the_public_class_and_argument():
    x = _inputs()
    with pytest.raises(dropmask.DropmaskValueError, match="MaskedRNN: deterministic must be"):
        dl.MaskedRNN(nn.GRUCell(4), zoneout=0.2).init(jax.random.key(0), x)
    with pytest.raises(dropmask.MissingKeyError, match="stream 'dropout'"):
        rnn, params = _lstm(zoneout=0.2)
        rnn.apply(params, x, deterministic=False)
    with pytest.raises(dropmask.DropmaskValueError, match=r"one per carry leaf \(1 here\)"):
        dl.MaskedRNN(nn.GRUCell(4), zoneout=(0.1, 0.2)).init(
            jax.random.key(0), x, deterministic=True
        )
    with pytest.raises(dropmask.DropmaskValueError, match="recurrent_kernels"):
        dl.MaskedRNN(nn.GRUCell(4), weight_dropout=0.2, recurrent_kernels=("w",)).init(
            jax.random.key(0), x, deterministic=False
        )
    with pytest.raises(dropmask.RateError, match="nnx.MaskedRNN: zoneout must be in"):
        dn.MaskedRNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), zoneout=1.5)
    with pytest.raises(dropmask.RateError, match="weight_dropout must be in"):
        dn.MaskedRNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), weight_dropout=-0.1)
    with pytest.raises(dropmask.MissingKeyError, match="nnx.MaskedRNN: rngs must be given"):
        dn.MaskedRNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), zoneout=0.2)(x)


def _weight_dropout_init(cell, **kw):
    return dl.MaskedRNN(cell, weight_dropout=0.2, **kw).init(
        {"params": jax.random.key(0), "dropout": KEY}, _inputs(), deterministic=False
    )


def test_recurrent_kernels_takes_one_name_or_a_tuple():
    # One name is one name, not its letters: "hr" drops GRUCell's hr only.
    one = _weight_dropout_init(nn.GRUCell(4), recurrent_kernels="hr")
    both = _weight_dropout_init(nn.GRUCell(4), recurrent_kernels=("hr", "hz"))
    assert jax.tree.structure(one) == jax.tree.structure(both)
    rnn = dl.MaskedRNN(nn.GRUCell(4), weight_dropout=0.5, recurrent_kernels="hr")
    params = rnn.init(jax.random.key(0), _inputs(), deterministic=True)
    grads = jax.grad(
        lambda p: rnn.apply(p, _inputs(), deterministic=False, rngs={"dropout": KEY}).sum()
    )(params)
    # Weight dropout zeroes a share of hr's kernel gradient and none of hz's.
    hr = grads["params"]["cell"]["hr"]["kernel"]
    hz = grads["params"]["cell"]["hz"]["kernel"]
    assert bool((hr == 0).any()) and not bool((hz == 0).any())
    layer = dn.MaskedRNN(
        nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), weight_dropout=0.2, recurrent_kernels="dense_h"
    )
    assert layer.recurrent_kernels == ("dense_h",)


@pytest.mark.parametrize("kernels", [("hr", "hq"), "hx", ("hr", 3), 7])
def test_recurrent_kernels_refuses_unknown_names_by_name(kernels):
    error = dropmask.DropmaskTypeError if kernels in (7, ("hr", 3)) else dropmask.DropmaskValueError
    with pytest.raises(error, match="recurrent_kernels") as info:
        _weight_dropout_init(nn.GRUCell(4), recurrent_kernels=kernels)
    if error is dropmask.DropmaskValueError:
        bad = "hq" if isinstance(kernels, tuple) else kernels
        assert repr(bad) in str(info.value) and "'hn'" in str(info.value)
    with pytest.raises(error, match="recurrent_kernels"):
        layer = dn.MaskedRNN(
            nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)),
            weight_dropout=0.2,
            recurrent_kernels=kernels if kernels != "hx" else "dense_x",
            rngs=nnx.Rngs(dropout=0),
        )
        layer(_inputs())


@pytest.mark.parametrize("zoneout", [(0.0, 0.0, 0.0), (0.1, 0.1, 0.1)])
def test_zoneout_tuples_are_length_checked_even_when_zero(zoneout):
    with pytest.raises(dropmask.DropmaskValueError, match=r"one per carry leaf \(2 here\)"):
        dl.MaskedRNN(nn.LSTMCell(4), zoneout=zoneout).init(
            jax.random.key(0), _inputs(), deterministic=True
        )
    with pytest.raises(dropmask.DropmaskValueError, match=r"one per carry leaf \(2 here\)"):
        dn.MaskedRNN(
            nnx.OptimizedLSTMCell(3, 4, rngs=nnx.Rngs(0)), zoneout=zoneout, deterministic=True
        )(_inputs())
    a = jnp.zeros(3)
    with pytest.raises(dropmask.DropmaskValueError, match=r"one per carry leaf \(2 here\)"):
        dropmask.zoneout((a, a), (a, a), zoneout, KEY)


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_traced_zoneout_rate_outside_0_1_gives_nan_and_a_checkify_error(deterministic):
    from jax.experimental import checkify

    prev, new = jnp.zeros(4), jnp.ones(4)

    def f(rate):
        return dropmask.zoneout(prev, new, rate, KEY, deterministic=deterministic)

    assert bool(jnp.isnan(jax.jit(f)(jnp.float32(1.5))).all())
    assert bool(jnp.isnan(jax.jit(f)(jnp.float32(-0.5))).all())
    assert bool(jnp.isfinite(jax.jit(f)(jnp.float32(0.5))).all())
    err, _ = checkify.checkify(jax.jit(f), errors=checkify.user_checks)(jnp.float32(1.5))
    with pytest.raises(checkify.JaxRuntimeError, match=r"zoneout must be in \[0, 1\]"):
        err.throw()
