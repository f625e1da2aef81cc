"""The functional dropout family: semantics, dtypes, transformations, errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.covering import covering

import dropmask

IMPLS = ("fast", "flax")
FLOATS = (jnp.float16, jnp.bfloat16, jnp.float32)


def _x(shape=(64, 32), dtype=jnp.float32):
    return jax.random.normal(jax.random.key(42), shape, dtype=jnp.float32).astype(dtype)


# --- bit-identity with Flax -----------------------------------------------------


# Each shape and each rate once: Flax draws the mask at the shape and compares it with
# the rate, two things apart.
@pytest.mark.parametrize(
    ("shape", "rate"), [((7,), 0.05), ((4, 5), 0.3), ((3, 4, 5), 0.5), ((2, 3, 4, 5), 0.9)]
)
def test_flax_impl_bit_identical_to_linen(shape, rate):
    x, key = _x(shape), jax.random.key(7)
    ours = dropmask.dropout(x, rate, key, impl="flax")
    theirs = nn.Dropout(rate, deterministic=False).apply({}, x, rng=key)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


@pytest.mark.parametrize("broadcast_dims", [(0,), (-1,), (0, 2), (1,)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_flax_impl_bit_identical_with_broadcast_dims(broadcast_dims, dtype):
    x, key = _x((4, 6, 8), dtype), jax.random.key(3)
    ours = dropmask.dropout(x, 0.25, key, broadcast_dims=broadcast_dims, impl="flax")
    theirs = nn.Dropout(0.25, broadcast_dims=broadcast_dims, deterministic=False).apply(
        {}, x, rng=key
    )
    assert ours.dtype == theirs.dtype == dtype
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))


def test_flax_impl_bit_identical_to_nnx():
    x = _x((16, 16))
    theirs = nnx.Dropout(0.4, rngs=nnx.Rngs(dropout=11))
    key = nnx.Rngs(dropout=11)["dropout"].fork()()
    np.testing.assert_array_equal(
        np.asarray(dropmask.dropout(x, 0.4, key, impl="flax")), np.asarray(theirs(x))
    )


def test_flax_impl_gradients_match_flax():
    x, key = _x((8, 8)), jax.random.key(5)
    ours = jax.grad(lambda x: jnp.sum(jnp.sin(dropmask.dropout(x, 0.3, key, impl="flax"))))(x)
    layer = nn.Dropout(0.3, deterministic=False)
    theirs = jax.grad(lambda x: jnp.sum(jnp.sin(layer.apply({}, x, rng=key))))(x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


# --- semantics ------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_rate_zero_and_deterministic_return_input_itself(impl):
    x = _x()
    assert dropmask.dropout(x, 0.0, None, impl=impl) is x
    assert dropmask.dropout(x, 0.7, None, deterministic=True, impl=impl) is x


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_rate_one_gives_zeros_and_zero_gradients(impl, dtype):
    x, key = _x(dtype=dtype), jax.random.key(0)
    y = dropmask.dropout(x, 1.0, key, impl=impl)
    assert y.dtype == dtype and not np.asarray(y, np.float32).any()
    # no randomness is drawn at rate 1, so (as in Flax) no key is needed
    assert not np.asarray(dropmask.dropout(x, 1.0, None, impl=impl), np.float32).any()
    g = jax.grad(lambda x: dropmask.dropout(x, 1.0, key, impl=impl).astype(jnp.float32).sum())(x)
    assert np.isfinite(np.asarray(g, np.float32)).all() and not np.asarray(g, np.float32).any()


@pytest.mark.parametrize("impl", IMPLS)
def test_traced_rate_one_is_nan_free_and_does_not_recompile(impl):
    x, key = _x(), jax.random.key(0)
    traces = []

    @jax.jit
    def loss(x, rate):
        traces.append(1)
        return jnp.sum(dropmask.dropout(x, rate, key, impl=impl) ** 2)

    for rate in (0.0, 0.2, 0.5, 1.0):
        value, grad = jax.value_and_grad(loss)(x, jnp.float32(rate))
        assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
    assert len(traces) == 1
    assert float(loss(x, jnp.float32(1.0))) == 0.0
    np.testing.assert_allclose(float(loss(x, jnp.float32(0.0))), float(jnp.sum(x**2)), rtol=1e-6)


def test_traced_rate_out_of_range_poisons_output_instead_of_clipping():
    y = jax.jit(lambda r: dropmask.dropout(_x(), r, jax.random.key(0)))(jnp.float32(1.5))
    assert np.isnan(np.asarray(y)).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", (*FLOATS, jnp.float64))
def test_dtype_preserved(impl, dtype):
    with jax.enable_x64(dtype == jnp.float64):
        x = jnp.ones((32, 32), dtype)
        assert dropmask.dropout(x, 0.3, jax.random.key(1), impl=impl).dtype == dtype


@pytest.mark.parametrize("impl", IMPLS)
def test_kept_values_scaled_by_realised_keep_probability(impl):
    x = jnp.ones((256, 256))
    y = np.asarray(dropmask.dropout(x, 0.1, jax.random.key(2), impl=impl))
    kept = y[y != 0]
    np.testing.assert_allclose(kept, 1 / 0.9, rtol=1e-5)
    # unbiased: mean within 4 sigma of 1 (per-element variance rate/(1-rate))
    sigma = np.sqrt(0.1 / 0.9 / y.size)
    assert abs(y.mean() - 1.0) < 4 * sigma


def test_bf16_fast_scaling_is_not_rounded_to_bf16_first():
    # 1/0.9 rounds to 1.109375 in bf16; scaling in f32 then rounding once is closer.
    x = jnp.full((64, 64), 3.0, jnp.bfloat16)
    y = np.asarray(dropmask.dropout(x, 0.1, jax.random.key(0)), np.float32)
    kept = y[y != 0]
    expected = float(jnp.asarray(3.0 / 0.9, jnp.bfloat16))
    np.testing.assert_array_equal(kept, expected)


_BROADCAST_DIMS = [(0,), (1,), (-1,), (0, 2)]


# Fast: each broadcast_dims once, the generators in turn.
@pytest.mark.parametrize(
    ("broadcast_dims", "impl"),
    covering(
        [(dims, impl) for dims in _BROADCAST_DIMS for impl in IMPLS],
        [(dims, IMPLS[i % 2]) for i, dims in enumerate(_BROADCAST_DIMS)],
        unpack=True,
    ),
    ids=[f"broadcast_dims{i}-{impl}" for i in range(len(_BROADCAST_DIMS)) for impl in IMPLS],
)
def test_broadcast_dims_share_mask_exactly(impl, broadcast_dims):
    x = jnp.ones((6, 7, 8))
    y = np.asarray(
        dropmask.dropout(x, 0.5, jax.random.key(4), broadcast_dims=broadcast_dims, impl=impl)
    )
    for axis in broadcast_dims:
        first = np.take(y, [0], axis=axis)
        np.testing.assert_array_equal(y, np.broadcast_to(first, y.shape))
    assert 0 < (y == 0).mean() < 1


@pytest.mark.parametrize("impl", IMPLS)
def test_jit_matches_eager_and_vmap_over_keys_matches_loop(impl):
    x = _x((8, 16))
    keys = jax.random.split(jax.random.key(9), 5)
    eager = [dropmask.dropout(x, 0.3, k, impl=impl) for k in keys]
    jitted = jax.jit(lambda k: dropmask.dropout(x, 0.3, k, impl=impl))
    vmapped = jax.vmap(lambda k: dropmask.dropout(x, 0.3, k, impl=impl))(keys)
    # Flax divides by keep_prob, which XLA may turn into a multiply under jit: the
    # masks agree exactly but values only to 1 ulp. "fast" multiplies in both.
    check = np.testing.assert_array_equal
    if impl == "flax":
        check = lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-7)  # noqa: E731
    for i, k in enumerate(keys):
        check(np.asarray(jitted(k)), np.asarray(eager[i]))
        check(np.asarray(vmapped[i]), np.asarray(eager[i]))
        np.testing.assert_array_equal(np.asarray(jitted(k)) != 0, np.asarray(eager[i]) != 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_gradient_is_mask_times_scale(impl):
    x, key = _x((16, 16)), jax.random.key(6)
    mask = np.asarray(dropmask.keep_mask(key, x.shape, 0.4, impl=impl))
    g = jax.grad(lambda x: dropmask.dropout(x, 0.4, key, impl=impl).sum())(x)
    np.testing.assert_allclose(np.asarray(g), mask / 0.6, rtol=1e-4)
    y = dropmask.dropout(x, 0.4, key, impl=impl)
    np.testing.assert_array_equal(np.asarray(y) != 0, mask & (np.asarray(x) != 0))


def test_fast_composes_with_remat_scan_jvp_and_higher_order_grad():
    key, x = jax.random.key(1), _x((4, 8))

    def f(x):
        return jnp.sum(jnp.tanh(dropmask.dropout(x, 0.5, key)) ** 2)

    g = jax.grad(f)(x)
    np.testing.assert_allclose(np.asarray(jax.grad(jax.checkpoint(f))(x)), np.asarray(g))
    _, tangent = jax.jvp(f, (x,), (jnp.ones_like(x),))
    np.testing.assert_allclose(float(tangent), float(jnp.sum(g)), rtol=1e-5)
    h = jax.hessian(lambda v: f(v.reshape(4, 8)))(x.ravel())
    assert h.shape == (32, 32) and np.isfinite(np.asarray(h)).all()

    def body(carry, k):
        return carry + dropmask.dropout(x, 0.5, k).sum(), None

    keys = jax.random.split(key, 3)
    total, _ = jax.lax.scan(body, 0.0, keys)
    expected = sum(float(dropmask.dropout(x, 0.5, k).sum()) for k in keys)
    np.testing.assert_allclose(float(total), expected, rtol=1e-5)


# --- variants -------------------------------------------------------------------


def test_drop_path_one_decision_per_example():
    x = jnp.ones((64, 5, 3))
    y = np.asarray(dropmask.drop_path(x, 0.5, jax.random.key(0)))
    per_example = y.reshape(64, -1)
    assert all(len(set(row.tolist())) == 1 for row in per_example)
    assert set(np.unique(y).tolist()) == {0.0, 2.0}
    assert dropmask.drop_path(x, 0.5, None, deterministic=True) is x


@pytest.mark.parametrize("impl", IMPLS)
def test_word_dropout_replaces_with_unk_at_rate(impl):
    tokens = jnp.arange(1, 200_001, dtype=jnp.int32)
    out = np.asarray(dropmask.word_dropout(tokens, 0.2, jax.random.key(0), unk_id=0, impl=impl))
    replaced = out == 0
    sigma = np.sqrt(0.2 * 0.8 / out.size)
    assert abs(replaced.mean() - 0.2) < 4 * sigma
    np.testing.assert_array_equal(out[~replaced], np.asarray(tokens)[~replaced])
    assert out.dtype == np.int32


def test_word_dropout_flax_impl_matches_sst2_example_layer():
    tokens = jnp.arange(50, dtype=jnp.int32).reshape(5, 10)
    key = jax.random.key(3)
    drop = jax.random.bernoulli(key, p=0.3, shape=tokens.shape)
    expected = jnp.where(drop, jnp.array([1]), tokens)  # the SST-2 WordDropout's last line
    ours = dropmask.word_dropout(tokens, 0.3, key, unk_id=1, impl="flax")
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(expected))


def test_gaussian_dropout_moments():
    x = jnp.ones((400_000,))
    y = np.asarray(dropmask.gaussian_dropout(x, 0.2, jax.random.key(0)))
    var = 0.2 / 0.8
    assert abs(y.mean() - 1) < 4 * np.sqrt(var / y.size)
    assert abs(y.var() - var) < 4 * var * np.sqrt(2 / y.size)


@pytest.mark.parametrize("impl", IMPLS)
def test_alpha_dropout_preserves_standardised_moments(impl):
    x = jax.random.normal(jax.random.key(1), (400_000,))
    y = np.asarray(dropmask.alpha_dropout(x, 0.2, jax.random.key(2), impl=impl))
    assert abs(y.mean()) < 0.01 and abs(y.std() - 1) < 0.01
    assert not np.asarray(dropmask.alpha_dropout(x, 1.0, jax.random.key(2))).any()


@pytest.mark.parametrize("fn", [dropmask.gaussian_dropout, dropmask.alpha_dropout])
@pytest.mark.parametrize("dtype", FLOATS)
def test_variants_dtype_jit_vmap_grad(fn, dtype):
    x, key = _x((4, 8), dtype), jax.random.key(0)
    y = jax.jit(lambda x: fn(x, 0.3, key))(x)
    assert y.dtype == dtype
    ys = jax.vmap(lambda k: fn(x, 0.3, k))(jax.random.split(key, 3))
    assert ys.shape == (3, 4, 8)
    g = jax.grad(lambda x: fn(x, 0.3, key).astype(jnp.float32).sum())(x)
    assert np.isfinite(np.asarray(g, np.float32)).all()


# --- errors ---------------------------------------------------------------------


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_bad_rate(rate):
    with pytest.raises(dropmask.RateError, match=r"rate must be in \[0, 1\]"):
        dropmask.dropout(jnp.ones(3), rate, jax.random.key(0))
    with pytest.raises(dropmask.RateError):
        dropmask.keep_mask(jax.random.key(0), (3,), rate)


def test_gaussian_rate_one_rejected():
    with pytest.raises(dropmask.RateError, match=r"\[0, 1\)"):
        dropmask.gaussian_dropout(jnp.ones(3), 1.0, jax.random.key(0))


def test_axis_out_of_range():
    with pytest.raises(dropmask.AxisError, match="axis 3.*2 dimensions"):
        dropmask.dropout(jnp.ones((2, 2)), 0.5, jax.random.key(0), broadcast_dims=(3,))
    # Flax merges a repeated axis; so do we, in every API.
    x, key = jnp.ones((2, 40)), jax.random.key(0)
    np.testing.assert_array_equal(
        np.asarray(dropmask.dropout(x, 0.5, key, broadcast_dims=(1, -1))),
        np.asarray(dropmask.dropout(x, 0.5, key, broadcast_dims=(1,))),
    )


def test_integer_input_points_to_word_dropout():
    with pytest.raises(TypeError, match="word_dropout"):
        dropmask.dropout(jnp.arange(4), 0.5, jax.random.key(0))


def test_missing_key_in_training_mode():
    with pytest.raises(dropmask.MissingKeyError, match="deterministic=True"):
        dropmask.dropout(jnp.ones(4), 0.5)


def test_unk_id_out_of_dtype_range():
    with pytest.raises(ValueError, match=r"int8 \(range \[-128, 127\]\)"):
        dropmask.word_dropout(jnp.arange(4, dtype=jnp.int8), 0.5, jax.random.key(0), unk_id=300)
    with pytest.raises(TypeError, match="integer token ids"):
        dropmask.word_dropout(jnp.ones(4), 0.5, jax.random.key(0), unk_id=0)


def test_bad_impl():
    with pytest.raises(ValueError, match="impl must be one of"):
        dropmask.dropout(jnp.ones(4), 0.5, jax.random.key(0), impl="torch")  # type: ignore[arg-type]


def test_errors_raised_before_any_work():
    # raised at trace time: no array is computed inside jit before the error
    with pytest.raises(dropmask.RateError):
        jax.jit(lambda x: dropmask.dropout(x, 2.0, jax.random.key(0))).lower(jnp.ones(3))


# --- rates: one encoding per rate type; traced rates outside [0, 1] ----------------


@pytest.mark.parametrize("impl", IMPLS)
def test_jax_scalar_rate_gives_the_same_mask_eagerly_and_under_jit(impl):
    x, key = _x((16, 40)), jax.random.key(11)
    # A run-time rate is an input: one program of each serves every rate.
    dropout = jax.jit(lambda x, r: dropmask.dropout(x, r, key, impl=impl))
    keep_mask = jax.jit(lambda r: dropmask.keep_mask(key, (16, 40), r, impl=impl))
    alpha = jax.jit(lambda r: dropmask.alpha_dropout(x, r, key, impl=impl))
    for rate in (0.1, 0.3, 0.5, 0.77):
        r = jnp.float32(rate)
        eager = dropmask.dropout(x, r, key, impl=impl)
        np.testing.assert_array_equal(np.asarray(eager), np.asarray(dropout(x, r)), str(rate))
        mask_eager = dropmask.keep_mask(key, (16, 40), r, impl=impl)
        np.testing.assert_array_equal(np.asarray(mask_eager), np.asarray(keep_mask(r)), str(rate))
        a = dropmask.alpha_dropout(x, r, key, impl=impl)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(alpha(r)), str(rate))


def test_alpha_dropouts_constants_are_the_same_bits_for_a_static_and_a_run_time_rate():
    # At every keep probability the fast generator realises (a threshold over 2**16): the
    # host's constants (a static rate) equal the program's (a JAX scalar rate), which XLA
    # rewrote (an FMA, a reassociated sum, rsqrt) to differ by up to 5e-7.
    from dropmask._dropout import _alpha_constants

    realised = np.arange(2**16 + 1, dtype=np.float32) / np.float32(2**16)
    program = jax.jit(jax.vmap(lambda r: _alpha_constants(r, jnp.float32)))(realised)
    host = np.array([_alpha_constants(float(r), np.float32) for r in realised]).T
    for got, want in zip(program, host, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_python_float_and_jax_scalar_rates_are_each_one_encoding():
    # A Python (or NumPy) number is compiled in; a JAX scalar is a run-time value, even
    # when concrete. Both keep each element with the same probability to 1e-3.
    key = jax.random.key(2)
    static = dropmask.keep_mask(key, (256, 256), 0.1)
    numpy_rate = dropmask.keep_mask(key, (256, 256), np.float32(0.1))
    np.testing.assert_array_equal(np.asarray(static), np.asarray(numpy_rate))
    runtime = dropmask.keep_mask(key, (256, 256), jnp.float32(0.1))
    for mask in (static, runtime):
        assert abs(float(mask.mean()) - 0.9) < 4 * np.sqrt(0.09 / 256**2)


_OUT_OF_RANGE = (-0.5, 1.5, float("nan"))


# Fast: each rate once, the generators in turn.
@pytest.mark.parametrize(
    ("rate", "impl"),
    covering(
        [(rate, impl) for rate in _OUT_OF_RANGE for impl in IMPLS],
        [(rate, IMPLS[i % 2]) for i, rate in enumerate(_OUT_OF_RANGE)],
        unpack=True,
    ),
    ids=[f"{rate}-{impl}" for rate in _OUT_OF_RANGE for impl in IMPLS],
)
def test_traced_rate_out_of_range_drops_everything_in_integer_and_bool_outputs(impl, rate):
    key, tokens = jax.random.key(0), jnp.arange(64, dtype=jnp.int32).reshape(4, 16)
    mask = jax.jit(lambda r: dropmask.keep_mask(key, (4, 16), r, impl=impl))(jnp.float32(rate))
    assert not np.asarray(mask).any()  # nothing kept: never clipped to a valid rate
    words = jax.jit(lambda r: dropmask.word_dropout(tokens, r, key, unk_id=-1, impl=impl))(
        jnp.float32(rate)
    )
    np.testing.assert_array_equal(np.asarray(words), np.full((4, 16), -1))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, r, k: dropmask.dropout(x, r, k),
        lambda x, r, k: dropmask.dropout(x, r, k, impl="flax"),
        lambda x, r, k: dropmask.alpha_dropout(x, r, k),
        lambda x, r, k: dropmask.gaussian_dropout(x, r, k),
        lambda x, r, k: dropmask.keep_mask(k, x.shape, r),
        lambda x, r, k: dropmask.word_dropout(x.astype(jnp.int32), r, k, unk_id=0),
    ],
)
def test_traced_rate_out_of_range_is_a_checkify_error(fn):
    from jax.experimental import checkify

    x, key = _x((4, 8)), jax.random.key(0)
    checked = checkify.checkify(jax.jit(lambda r: fn(x, r, key)), errors=checkify.user_checks)
    err, _ = checked(jnp.float32(1.5))
    assert err.get() is not None and "rate must be in [0, 1], got 1.5" in err.get()
    err, _ = checked(jnp.float32(0.5))
    assert err.get() is None


# --- complex inputs ----------------------------------------------------------------


# Fast: each generator once, a static and a run-time rate in turn.
@pytest.mark.parametrize(
    ("rate", "impl"),
    covering(
        [(rate, impl) for rate in (0.3, "traced") for impl in IMPLS],
        [(0.3, "fast"), ("traced", "flax")],
        unpack=True,
    ),
)
def test_complex_input_one_mask_for_real_and_imaginary_parts(impl, rate):
    re, im = _x((8, 40)), _x((8, 40)) * 3.0 + 1.0
    z, key = jax.lax.complex(re, im), jax.random.key(4)
    if rate == "traced":
        out = jax.jit(lambda z, r: dropmask.dropout(z, r, key, impl=impl))(z, jnp.float32(0.3))
        real = jax.jit(lambda x, r: dropmask.dropout(x, r, key, impl=impl))(re, jnp.float32(0.3))
    else:
        out = dropmask.dropout(z, rate, key, impl=impl)
        real = dropmask.dropout(re, rate, key, impl=impl)
    assert out.dtype == jnp.complex64
    if impl == "flax" and rate != "traced":
        # Flax's own arithmetic: a complex divide, within an ulp of the real one
        np.testing.assert_allclose(np.asarray(out.real), np.asarray(real), rtol=1e-6, atol=0)
    else:
        np.testing.assert_array_equal(np.asarray(out.real), np.asarray(real))
    kept = np.asarray(real) != 0
    np.testing.assert_array_equal(np.asarray(out.imag) != 0, kept)
    assert 0 < kept.mean() < 1


def test_complex_flax_impl_bit_identical_to_flax_and_inf_does_not_leak():
    z = jax.lax.complex(_x((6, 10)), _x((6, 10)) + 2.0)
    key = jax.random.key(9)
    ours = dropmask.dropout(z, 0.4, key, impl="flax")
    theirs = nn.Dropout(0.4, deterministic=False).apply({}, z, rng=key)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    # fast impl: an infinite imaginary part stays in its own part of its own element
    z_inf = z.at[0, 0].set(jax.lax.complex(jnp.float32(1.0), jnp.float32(jnp.inf)))
    out = np.asarray(dropmask.dropout(z_inf, 0.4, key))
    assert np.isfinite(out.real).all()
    assert np.isfinite(out.imag[1:]).all()


def test_complex_gaussian_dropout_same_noise_on_both_parts():
    re = _x((4, 8))
    z, key = jax.lax.complex(re, 2.0 * re), jax.random.key(1)
    out = dropmask.gaussian_dropout(z, 0.3, key)
    np.testing.assert_array_equal(
        np.asarray(out.real), np.asarray(dropmask.gaussian_dropout(re, 0.3, key))
    )
    np.testing.assert_allclose(np.asarray(out.imag), 2.0 * np.asarray(out.real), rtol=1e-6)


# --- broadcast_dims: what Flax accepts -----------------------------------------------


@pytest.mark.parametrize("dims", [1, [1], (1,), range(1, 2), np.array([1]), (1, 1), (-1,)])
def test_broadcast_dims_accepts_what_flax_accepts(dims):
    x, key = _x((4, 40)), jax.random.key(0)
    want = dropmask.dropout(x, 0.5, key, broadcast_dims=(1,))
    np.testing.assert_array_equal(
        np.asarray(dropmask.dropout(x, 0.5, key, broadcast_dims=dims)), np.asarray(want)
    )
    flax_ours = dropmask.dropout(x, 0.5, key, broadcast_dims=dims, impl="flax")
    if not isinstance(dims, int):  # Flax itself needs an iterable
        theirs = nn.Dropout(0.5, broadcast_dims=dims, deterministic=False).apply({}, x, rng=key)
        np.testing.assert_array_equal(np.asarray(flax_ours), np.asarray(theirs))
