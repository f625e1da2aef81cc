"""Every bad argument is named, with what was expected, what was given, and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.covering import covering
from tests.mask_sites import SITES, site_input

import dropmask
from dropmask import _checks
from dropmask import linen as dl
from dropmask import nnx as dnnx

X = jnp.ones((2, 8))
TOKENS = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)
KEY = jax.random.key(0)

# Each public dropout variant as (name the errors must carry, call(x_or_tokens, rate, key, **kw)).
VARIANTS = [
    ("dropout", lambda x, r, k, **kw: dropmask.dropout(x, r, k, **kw), X),
    ("drop_path", lambda x, r, k, **kw: dropmask.drop_path(x, r, k, **kw), X),
    ("alpha_dropout", lambda x, r, k, **kw: dropmask.alpha_dropout(x, r, k, **kw), X),
    ("gaussian_dropout", lambda x, r, k, **kw: dropmask.gaussian_dropout(x, r, k, **kw), X),
    (
        "word_dropout",
        lambda x, r, k, **kw: dropmask.word_dropout(x, r, k, unk_id=0, **kw),
        TOKENS,
    ),
]
BAD_RATES = ["0.5", "1.5", [0.1, 0.2], None, 0.5j, np.array([0.1, 0.2]), jnp.ones(2) * 0.1, True]


@pytest.mark.parametrize("rate", BAD_RATES, ids=repr)
@pytest.mark.parametrize(("caller", "call", "x"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_rate_that_is_not_a_real_scalar_is_a_type_error_naming_rate(caller, call, x, rate):
    with pytest.raises(dropmask.DropmaskTypeError, match=rf"^{caller}: rate must be a real number"):
        call(x, rate, jax.random.key(0))
    with pytest.raises(TypeError, match=r"e\.g\. rate=0\.1"):
        call(x, rate, jax.random.key(0))


@pytest.mark.parametrize("rate", ["0.5", [0.1, 0.2], None])
def test_rate_type_checked_by_keep_mask_and_modules(rate):
    key = jax.random.key(0)
    with pytest.raises(dropmask.DropmaskTypeError, match="keep_mask: rate must be a real number"):
        dropmask.keep_mask(key, (2, 3), rate)
    with pytest.raises(TypeError, match="dropmask.linen.Dropout: rate must be a real number"):
        dl.Dropout(rate).apply({}, X, deterministic=False, rngs={"dropout": key})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dropmask.nnx.Dropout: rate must be a real number"):
        dnnx.Dropout(rate, rngs=nnx.Rngs(dropout=0))  # type: ignore[arg-type]


def test_int_seed_as_key_says_a_seed_is_not_a_key():
    with pytest.raises(dropmask.DropmaskTypeError, match=r"dropout: key must be one PRNG key"):
        dropmask.dropout(X, 0.5, 0)
    with pytest.raises(TypeError, match=r"pass key=jax\.random\.key\(7\)"):
        dropmask.dropout(X, 0.5, 7)
    with pytest.raises(TypeError, match=r"keep_mask: key must be one PRNG key"):
        dropmask.keep_mask(0, (3,), 0.5)
    with pytest.raises(
        TypeError, match=r"dropmask.linen.Dropout: rng must be.*rng=jax\.random\.key\(0\)"
    ):
        dl.Dropout(0.5, deterministic=False).apply({}, X, rng=0)
    with pytest.raises(TypeError, match="one key"):  # a batch of keys: vmap over them
        dropmask.dropout(X, 0.5, jax.random.split(jax.random.key(0), 2))


def test_rate_none_names_rate():
    with pytest.raises(TypeError, match=r"dropout: rate must be .* got None"):
        dropmask.dropout(X, None, jax.random.key(0))  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [(3.7,), (2, 2.0), 3.5, "3", (-1, 2), (True, 2)])
def test_keep_mask_non_integer_shape_is_rejected_not_truncated(shape):
    with pytest.raises(dropmask.DropmaskTypeError, match=r"keep_mask: shape must be a tuple of"):
        dropmask.keep_mask(jax.random.key(0), shape, 0.5)


def test_keep_mask_accepts_numpy_ints_and_an_int():
    key = jax.random.key(0)
    a = dropmask.keep_mask(key, (np.int64(2), 40), 0.5)
    b = dropmask.keep_mask(key, (2, 40), 0.5)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert dropmask.keep_mask(key, 5, 0.5).shape == (5,)


@pytest.mark.parametrize(("caller", "call", "x"), VARIANTS[:1] + VARIANTS[2:])
def test_broadcast_dims_none_is_a_type_error_with_the_fix(caller, call, x):
    with pytest.raises(
        dropmask.DropmaskTypeError, match=rf"{caller}: broadcast_dims.*broadcast_dims=\(\)"
    ):
        call(x, 0.5, jax.random.key(0), broadcast_dims=None)


def test_list_input_is_a_type_error_with_the_fix():
    with pytest.raises(
        dropmask.DropmaskTypeError, match=r"dropout: x must be an array, got a list"
    ):
        dropmask.dropout([1.0, 2.0], 0.5, jax.random.key(0))
    with pytest.raises(TypeError, match=r"jnp\.asarray\(tokens\)"):
        dropmask.word_dropout([1, 2], 0.5, jax.random.key(0), unk_id=0)


@pytest.mark.parametrize(("caller", "call", "x"), VARIANTS[:1] + VARIANTS[2:])
def test_scalar_input_with_an_axis_says_it_has_no_axes(caller, call, x):
    scalar = x[0, 0]
    with pytest.raises(dropmask.AxisError, match=rf"{caller}: broadcast_dims names axis 0.*0-d"):
        call(scalar, 0.5, jax.random.key(0), broadcast_dims=(0,))
    # without an axis, a scalar is fine
    assert call(scalar, 0.5, jax.random.key(0)).shape == ()


def test_drop_path_of_a_scalar_has_no_batch_axis():
    with pytest.raises(dropmask.AxisError, match=r"drop_path: batch_axis names axis 0.*0-d"):
        dropmask.drop_path(jnp.float32(1.0), 0.5, jax.random.key(0))


def test_linen_misspelt_stream_names_expected_and_given_streams():
    with pytest.raises(dropmask.MissingKeyError) as info:
        dl.Dropout(0.5, deterministic=False).apply({}, X, rngs={"dropuot": jax.random.key(0)})
    message = str(info.value)
    assert "dropmask.linen.Dropout" in message
    assert "stream 'dropout'" in message
    assert (
        "The rngs given are ['dropuot']; 'dropuot' looks like a misspelling of 'dropout'" in message
    )
    assert "rngs={'dropout': jax.random.key(0)}" in message


def test_errors_name_the_function_called_not_an_internal_one():
    key = jax.random.key(0)
    with pytest.raises(dropmask.RateError, match=r"^drop_path: rate must be in \[0, 1\]"):
        dropmask.drop_path(X, 1.5, key)
    with pytest.raises(dropmask.RateError, match=r"^dropmask.linen.DropPath: rate must be in"):
        dl.DropPath(1.5, deterministic=False).apply({}, X, rngs={"dropout": key})
    with pytest.raises(dropmask.RateError, match=r"^dropmask.nnx.AlphaDropout: rate must be in"):
        dnnx.AlphaDropout(-0.5)
    with pytest.raises(dropmask.AxisError, match=r"^dropmask.nnx.Dropout: broadcast_dims"):
        dnnx.Dropout(0.5, broadcast_dims=(5,), rngs=nnx.Rngs(dropout=0))(X)
    with pytest.raises(
        dropmask.DtypeError, match=r"^dropmask.linen.AlphaDropout expects a floating"
    ):
        dl.AlphaDropout(0.5, deterministic=False).apply({}, X * 1j, rngs={"dropout": key})


_ROUNDING = (1e-6, 1 - 1e-6)


def _fast_rounding(index, site):
    """The ``index``-th site's rate in the fast suite: the two in turn, or the one it
    refuses where it refuses one only."""
    turn = _ROUNDING[index % 2]
    return turn if turn in site.refuses or not site.refuses else site.refuses[0]


# Fast: each site once, the two rates in turn (a site that refuses one only, with that
# one; a site that refuses neither, accepting its rate in turn).
@pytest.mark.parametrize(
    ("rate", "site"),
    covering(
        [(rate, site) for rate in _ROUNDING for site in SITES],
        [(_fast_rounding(i, site), site) for i, site in enumerate(SITES)],
        unpack=True,
    ),
    ids=[f"{site.id}-{rate}" for rate in _ROUNDING for site in SITES],
)
def test_a_rate_that_would_round_to_0_or_1_names_the_caller_and_its_argument(site, rate):
    """The "fast" generator draws probabilities to 2**-16, so a rate within 2**-17 of 0
    or 1 is refused; the error names the function or layer called and the rate as its
    user passed it, and speaks of nothing else (no other function, no "dropout" where
    the caller is not dropout). Where the site does not refuse it, the rate is
    accepted."""
    x = site_input(site)
    if rate not in site.refuses:
        # Refusals come as the call is traced, before any work: tracing is enough.
        jax.eval_shape(lambda x: site.call(x, rate, KEY), x)
        return
    with pytest.raises(dropmask.RateError) as info:
        site.call(x, rate, KEY)
    message = str(info.value)
    assert message.startswith(f"{site.name}: {site.arg}"), message
    said = message.removeprefix(f"{site.name}: ").replace(site.arg, "")
    assert "dropout" not in said, message
    assert "keep_mask" not in said, message


def test_every_error_is_a_dropmask_error_and_the_builtin_type():
    key = jax.random.key(0)
    cases = [
        (lambda: dropmask.dropout(X, "0.5", key), TypeError),
        (lambda: dropmask.dropout(X, 1.5, key), ValueError),
        (lambda: dropmask.dropout(X, 0.5, key, impl="torch"), ValueError),
        (lambda: dropmask.dropout(X, 0.5), ValueError),
        (lambda: dropmask.dropout(X, 0.5, key, global_shape=(4, 8)), ValueError),
        (lambda: dropmask.word_dropout(TOKENS, 0.5, key, unk_id=1.0), TypeError),
        (lambda: dnnx.Dropout(0.5, rngs=0), TypeError),  # type: ignore[arg-type]
        (lambda: dnnx.Dropout(0.5, deterministic=None)(X), ValueError),
        (
            lambda: dropmask.keep_mask(key, (4,), 0.5, global_shape=(8,), offset=(0,), impl="flax"),
            ValueError,
        ),
    ]
    for call, builtin in cases:
        with pytest.raises(dropmask.DropmaskError) as info:
            call()
        assert isinstance(info.value, builtin), info.value


def test_check_key_serves_train_state_callers():
    # One key check for every caller: a batch of keys, an int and None are refused.
    for bad in (jax.random.split(jax.random.key(0), 2), 3, jnp.zeros(3, jnp.float32)):
        with pytest.raises(dropmask.DropmaskTypeError, match="TrainState.create: key must be one"):
            _checks.check_key(bad, caller="TrainState.create")
    with pytest.raises(dropmask.MissingKeyError):
        _checks.check_key(None, caller="TrainState.create")
    _checks.check_key(jax.random.key(0), caller="TrainState.create")
    _checks.check_key(jax.random.PRNGKey(0), caller="TrainState.create")


# A block of 2 rows of a global [8, 8] array may start at rows 0 to 6.
OFFSET_CALLS = [
    ("dropout", lambda o: dropmask.dropout(X, 0.5, KEY, global_shape=(8, 8), offset=o)),
    ("drop_path", lambda o: dropmask.drop_path(X, 0.5, KEY, global_shape=(8, 8), offset=o)),
    (
        "word_dropout",
        lambda o: dropmask.word_dropout(TOKENS, 0.5, KEY, unk_id=0, global_shape=(8, 4), offset=o),
    ),
    (
        "drop_head",
        lambda o: dropmask.drop_head(
            jnp.ones((2, 3, 4, 5)), 0.5, KEY, global_shape=(8, 3, 4, 5), offset=(*o, 0, 0)
        ),
    ),
    (
        "drop_block",
        lambda o: dropmask.drop_block(
            jnp.ones((2, 8, 8, 3)),
            0.2,
            KEY,
            block_size=3,
            global_shape=(8, 8, 8, 3),
            offset=(o[0], 0, 0, 0),
        ),
    ),
    (
        "dropmask.nnx.Dropout",
        lambda o: dnnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))(X, global_shape=(8, 8), offset=o),
    ),
    ("keep_mask", lambda o: dropmask.keep_mask(KEY, (2, 8), 0.5, global_shape=(8, 8), offset=o)),
]


@pytest.mark.parametrize("offset", [(7, 0), (-1, 0), (jnp.int32(8), 0), (2.5, 0)], ids=repr)
@pytest.mark.parametrize(("caller", "call"), OFFSET_CALLS, ids=[c[0] for c in OFFSET_CALLS])
def test_static_offset_outside_global_shape_is_refused_now(caller, call, offset):
    with pytest.raises(dropmask.DropmaskValueError, match=rf"{caller}: offset\[0\] must be an int"):
        call(offset)


@pytest.mark.parametrize(("caller", "call"), OFFSET_CALLS, ids=[c[0] for c in OFFSET_CALLS])
def test_an_offset_in_range_is_accepted(caller, call):
    # Statically or as a JAX scalar, eagerly or traced.
    assert call((6, 0)).shape == call((jnp.int32(6), 0)).shape, caller
    assert jax.jit(lambda o: call((o, 0)))(6).shape == call((6, 0)).shape, caller


def test_user_error_writes_the_one_message_form():
    from dropmask._errors import user_error

    err = user_error(
        dropmask.RateError, "rate must be in [0, 1], got 1.5", " Pass 0.1. ", caller="f"
    )
    assert isinstance(err, dropmask.RateError)
    assert str(err) == "f: rate must be in [0, 1], got 1.5. Pass 0.1."
    assert str(user_error(ValueError, "x must be 1, got 2", caller=None)) == "x must be 1, got 2."


def test_every_user_error_in_the_library_is_built_by_user_error():
    import ast
    import pathlib

    from dropmask import _errors

    root = pathlib.Path(dropmask.__file__).parent
    kinds = {"ValueError", "TypeError", "MissingStreamError"} | {
        name for name in dir(_errors) if name.endswith("Error")
    }
    by_hand = []
    for path in sorted(root.rglob("*.py")):
        # The bundled examples are user code: they raise through the public classes.
        if path.name == "_errors.py" or "examples" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            exc = node.exc if isinstance(node, ast.Raise) else None
            if isinstance(exc, ast.Call) and getattr(exc.func, "id", None) in kinds:
                by_hand.append(f"{path.relative_to(root)}:{node.lineno}")
    assert by_hand == []
