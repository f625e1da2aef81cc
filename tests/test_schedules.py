"""Rate schedules: values, traced steps, and one compilation for a whole run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dropmask


def test_schedule_values():
    steps = range(6)
    assert [float(dropmask.early_dropout(s, 0.5, until=3)) for s in steps] == [0.5] * 3 + [0.0] * 3
    assert [float(dropmask.late_dropout(s, 0.5, start=3)) for s in steps] == [0.0] * 3 + [0.5] * 3
    warm = [float(dropmask.linear_warmdown(s, 0.5, until=4)) for s in steps]
    np.testing.assert_allclose(warm, [0.5, 0.375, 0.25, 0.125, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(dropmask.depth_rates(0.4, 4)), [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(
        np.asarray(dropmask.depth_rates(0.3, 4, rule="timm")), [0.0, 0.1, 0.2, 0.3], atol=1e-7
    )


def test_a_whole_run_schedule_compiles_the_train_step_once():
    """The rate is a run-time value: every step of the schedule runs one program."""
    w0 = jnp.ones((8, 8))

    @jax.jit
    def step(w, step, key):
        rate = dropmask.early_dropout(step, 0.5, until=4)
        heads = dropmask.depth_rates(dropmask.linear_warmdown(step, 0.3, until=6), 2)

        def loss(w):
            h = dropmask.dropout(w, rate, jax.random.fold_in(key, step))
            h = dropmask.drop_block(h[None, ..., None], heads[1], key, block_size=2)[0, ..., 0]
            return jnp.sum(h**2)

        return w - 0.01 * jax.grad(loss)(w)

    w = w0
    before = step._cache_size()
    for s in range(10):
        w = step(w, jnp.int32(s), jax.random.key(0))
    assert step._cache_size() - before == 1
    # Early dropout: from step 4 the rate is 0 and the dropout an identity.
    np.testing.assert_array_equal(
        np.asarray(dropmask.dropout(w0, dropmask.early_dropout(5, 0.5, until=4), None)),
        np.asarray(w0),
    )


def test_schedules_take_traced_steps_and_rates():
    f = jax.jit(lambda s, r: dropmask.linear_warmdown(s, r, until=10))
    assert float(f(jnp.int32(5), jnp.float32(0.4))) == pytest.approx(0.2)
    g = jax.vmap(lambda s: dropmask.early_dropout(s, 0.1, until=2))
    np.testing.assert_allclose(np.asarray(g(jnp.arange(4))), [0.1, 0.1, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: dropmask.early_dropout(1.5, 0.1, until=2), dropmask.DropmaskTypeError, "step"),
        (lambda: dropmask.early_dropout(1, 0.1, until=-1), dropmask.DropmaskValueError, "until"),
        (lambda: dropmask.late_dropout(1, 1.5, start=2), dropmask.RateError, "late_dropout"),
        (lambda: dropmask.linear_warmdown(1, 0.1, until=0), dropmask.DropmaskValueError, "until"),
        (lambda: dropmask.depth_rates(0.1, 4, rule="cubic"), dropmask.DropmaskValueError, "rule"),
        (lambda: dropmask.depth_rates(0.1, 0), dropmask.DropmaskValueError, "num_layers"),
        (
            lambda: dropmask.early_dropout(jnp.arange(2), 0.1, until=2),
            dropmask.DropmaskTypeError,
            "scalar",
        ),
    ],
)
def test_schedule_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


SCHEDULES = [
    ("early_dropout", lambda s: dropmask.early_dropout(s, 0.1, until=2)),
    ("late_dropout", lambda s: dropmask.late_dropout(s, 0.1, start=2)),
    ("linear_warmdown", lambda s: dropmask.linear_warmdown(s, 0.1, until=2)),
]


@pytest.mark.parametrize("step", [-1, np.int32(-3), jnp.int32(-1)], ids=repr)
@pytest.mark.parametrize(("caller", "schedule"), SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_a_negative_step_known_now_is_refused(caller, schedule, step):
    with pytest.raises(dropmask.DropmaskValueError, match=rf"{caller}: step must be >= 0"):
        schedule(step)
    # A traced step is a run-time value: nothing can be checked before it runs.
    assert jax.jit(schedule)(0) == schedule(0)


BOUNDARIES = [
    ("early_dropout", "until", lambda s, b: dropmask.early_dropout(s, 0.1, until=b)),
    ("late_dropout", "start", lambda s, b: dropmask.late_dropout(s, 0.1, start=b)),
    ("linear_warmdown", "until", lambda s, b: dropmask.linear_warmdown(s, 0.1, until=b)),
]


@pytest.mark.parametrize(("caller", "name", "schedule"), BOUNDARIES, ids=[b[0] for b in BOUNDARIES])
def test_a_step_or_boundary_past_int32_is_refused_naming_it(caller, name, schedule):
    # Each raised JAX's OverflowError ("Python integer 2147483648 out of bounds for
    # int32"), naming no argument; the int32 limit itself is served.
    top = 2**31 - 1
    for step, boundary, bad in [
        (2**31, 5, "step"),
        (jnp.uint32(2**31), 5, "step"),
        (3, 2**31, name),
    ]:
        with pytest.raises(
            dropmask.DropmaskValueError,
            match=rf"^{caller}: {bad} must be at most 2\*\*31 - 1 = {top} .*got 2147483648\.",
        ):
            schedule(step, boundary)
    late = caller == "late_dropout"
    np.testing.assert_allclose(float(schedule(top, top)), 0.1 if late else 0.0, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(0, top)), 0.0 if late else 0.1, rtol=1e-6)
