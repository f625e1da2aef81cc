"""dropmask.training: TrainState with a key, per-step and per-stream keys."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state

from dropmask import DropmaskError
from dropmask import linen as dl
from dropmask.training import TrainState, step_key, step_rngs, stream_id, stream_key


class _Model(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, training: bool) -> jax.Array:
        x = nn.Dense(8)(x)
        return dl.Dropout(0.5, deterministic=not training)(x)


def _bits(key: jax.Array) -> np.ndarray:
    return np.asarray(jax.random.key_data(key))


@pytest.fixture
def state() -> TrainState:
    params_key, dropout_key = jax.random.split(jax.random.key(0))
    model = _Model()
    params = model.init(params_key, jnp.ones((2, 4)), training=False)["params"]
    return TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(0.1), key=dropout_key
    )


def _loss(state: TrainState, params: dict, x: jax.Array) -> jax.Array:
    y = state.apply_fn({"params": params}, x, training=True, rngs=state.rngs("dropout"))
    return jnp.mean(y**2)


@jax.jit
def _train_step(state: TrainState, x: jax.Array) -> TrainState:
    return state.apply_gradients(grads=jax.grad(lambda p: _loss(state, p, x))(state.params))


def test_apply_gradients_keeps_key_and_advances_step(state):
    new = state.apply_gradients(grads=jax.tree.map(jnp.ones_like, state.params))
    assert new.step == 1
    np.testing.assert_array_equal(_bits(new.key), _bits(state.key))
    assert isinstance(new, TrainState)


def test_is_a_pytree_through_jit(state):
    x = jnp.ones((2, 4))
    new = _train_step(_train_step(state, x), x)
    assert isinstance(new, TrainState)
    assert int(new.step) == 2
    np.testing.assert_array_equal(_bits(new.key), _bits(state.key))
    # The key is a leaf (so it is traced, not baked in as a constant) next to the params.
    leaves = jax.tree.leaves(state)
    assert any(
        isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        for leaf in leaves
    )
    roundtrip = jax.jit(lambda s: s)(state)
    np.testing.assert_array_equal(_bits(roundtrip.key), _bits(state.key))


def test_jitted_step_compiles_once(state):
    traces = []

    @jax.jit
    def step(state: TrainState) -> TrainState:
        traces.append(state.step)  # runs only while tracing
        return state.apply_gradients(grads=jax.tree.map(jnp.ones_like, state.params))

    for _ in range(3):
        state = step(state)
    # Flax's create starts at Python 0, a different signature from the int32 array
    # that apply_gradients returns, and would trace twice.
    assert len(traces) == 1
    assert int(state.step) == 3 and state.step.dtype == jnp.int32


def test_train_step_is_reproducible_and_key_dependent(state):
    x = jnp.ones((2, 4))
    a, b = _train_step(state, x), _train_step(state, x)
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
    other = _train_step(state.replace(key=jax.random.key(42)), x)
    kernels = (a.params["Dense_0"]["kernel"], other.params["Dense_0"]["kernel"])
    assert not np.array_equal(*kernels)


def _rule(key: jax.Array, step: int, name: str) -> np.ndarray:
    return _bits(jax.random.fold_in(jax.random.fold_in(key, stream_id(name)), step))


def test_step_key_is_the_stream_rule_and_differs_per_step(state):
    keys = [state.replace(step=s).step_key() for s in range(20)]
    assert len({_bits(k).tobytes() for k in keys}) == 20
    for s, k in enumerate(keys):
        np.testing.assert_array_equal(_bits(k), _rule(state.key, s, "dropout"))
        # One rule: step_key, rngs and stream_key agree for every stream.
        rngs = state.replace(step=s).rngs("dropout", "lstm")
        np.testing.assert_array_equal(_bits(rngs["dropout"]), _bits(k))
        np.testing.assert_array_equal(
            _bits(state.replace(step=s).step_key("lstm")), _bits(rngs["lstm"])
        )
        np.testing.assert_array_equal(_bits(stream_key(state.key, s, "lstm")), _bits(rngs["lstm"]))
    # Same value eagerly, under jit (traced step) and through the function form.
    jitted = jax.jit(lambda st: st.step_key())(state.replace(step=jnp.int32(7)))
    np.testing.assert_array_equal(_bits(jitted), _bits(keys[7]))
    np.testing.assert_array_equal(_bits(step_key(state.replace(step=7))), _bits(keys[7]))


class _TwoStreams(nn.Module):
    """Dropout on the ``'dropout'`` stream plus noise drawn from an ``'lstm'`` stream."""

    extra_stream: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        dropped = dl.Dropout(0.5, deterministic=False)(x)
        if self.extra_stream:
            noise = jax.random.normal(self.make_rng("lstm"), x.shape)
            return dropped, x + noise
        return dropped, x


def test_adding_an_lstm_stream_keeps_the_dropout_masks(state):
    x = jnp.ones((4, 64))
    for step in range(3):
        stepped = state.replace(step=jnp.int32(step))
        alone, _ = _TwoStreams(False).apply({}, x, rngs=stepped.rngs("dropout"))
        both, noisy = _TwoStreams(True).apply({}, x, rngs=stepped.rngs("dropout", "lstm"))
        np.testing.assert_array_equal(np.asarray(alone), np.asarray(both))
        assert 0.3 < float(jnp.mean(alone == 0)) < 0.7  # the mask is real
        assert not np.array_equal(np.asarray(noisy), np.asarray(x))  # the stream is used


def test_step_key_under_vmap_gives_one_key_per_member(state):
    keys = jax.random.split(jax.random.key(1), 4)
    stepped = jax.vmap(lambda k: step_key(state.replace(key=k, step=3)))(keys)
    assert stepped.shape == (4,)
    for i in range(4):
        np.testing.assert_array_equal(_bits(stepped[i]), _rule(keys[i], 3, "dropout"))


def test_step_key_works_on_the_guides_hand_written_state(state):
    class GuideState(train_state.TrainState):
        key: jax.Array

    guide = GuideState.create(
        apply_fn=state.apply_fn, params=state.params, tx=optax.sgd(0.1), key=state.key
    ).replace(step=5)
    np.testing.assert_array_equal(_bits(step_key(guide)), _bits(state.replace(step=5).step_key()))
    np.testing.assert_array_equal(_bits(step_key(guide)), _rule(state.key, 5, "dropout"))
    assert set(step_rngs(guide, "dropout", "lstm")) == {"dropout", "lstm"}


def test_rngs_streams_are_distinct_order_free_and_per_step(state):
    both = state.rngs("dropout", "lstm")
    assert list(both) == ["dropout", "lstm"]
    assert not np.array_equal(_bits(both["dropout"]), _bits(both["lstm"]))
    # A stream's key depends on its name only, not on the other streams requested.
    np.testing.assert_array_equal(
        _bits(state.rngs("lstm", "dropout")["dropout"]), _bits(both["dropout"])
    )
    np.testing.assert_array_equal(_bits(state.rngs("dropout")["dropout"]), _bits(both["dropout"]))
    nxt = state.replace(step=1).rngs("dropout", "lstm")
    for name in both:
        assert not np.array_equal(_bits(nxt[name]), _bits(both[name]))


def test_rngs_streams_draw_uncorrelated_numbers(state):
    rngs = state.rngs("dropout", "lstm", "noise")
    n = 20_000
    draws = np.stack([np.asarray(jax.random.normal(rngs[k], (n,))) for k in rngs])
    corr = np.corrcoef(draws)[np.triu_indices(3, k=1)]
    # Independent streams: sample correlation ~ N(0, 1/n); 4 sigma bound.
    assert np.all(np.abs(corr) < 4 / np.sqrt(n)), corr


def test_stream_id_is_stable_across_processes():
    # Pinned: changing it would silently change every user's masks after an upgrade.
    assert stream_id("dropout") == 2458513353
    assert stream_id("lstm") == 2119426233


def test_raw_uint32_keys_are_accepted(state):
    raw = state.replace(key=jax.random.PRNGKey(3), step=2)
    np.testing.assert_array_equal(
        np.asarray(raw.step_key()), _rule(jax.random.PRNGKey(3), 2, "dropout")
    )
    created = TrainState.create(
        apply_fn=state.apply_fn, params=state.params, tx=optax.sgd(0.1), key=jax.random.PRNGKey(3)
    )
    assert created.key.shape == (2,)


@pytest.mark.parametrize(
    "bad_key, match",
    [
        (0, "one PRNG key"),
        (jnp.zeros((2,), jnp.int32), "one PRNG key"),
        (jax.random.split(jax.random.key(0), 3), "one PRNG key"),
    ],
)
def test_create_rejects_non_keys(state, bad_key, match):
    with pytest.raises(DropmaskError, match=match):
        TrainState.create(
            apply_fn=state.apply_fn, params=state.params, tx=optax.sgd(0.1), key=bad_key
        )


def test_create_requires_key(state):
    with pytest.raises(DropmaskError, match="needs key="):
        TrainState.create(apply_fn=state.apply_fn, params=state.params, tx=optax.sgd(0.1))


def test_rngs_errors(state):
    with pytest.raises(DropmaskError, match="at least one stream name"):
        state.rngs()
    with pytest.raises(DropmaskError, match="must be a str"):
        state.rngs("dropout", 3)


@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_stream_name_is_refused(state, name):
    for call in (lambda: state.rngs("dropout", name), lambda: state.step_key(name)):
        with pytest.raises(DropmaskError, match=r"stream_id: name must be a non-empty.*'dropout'"):
            call()


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        # A leading axis of 1 broadcast into the parameters (Flax's TrainState does).
        (lambda g: jax.tree.map(lambda x: x[None], g), r"got float32\(1, 8\) at \['Dense_0'\]"),
        (
            lambda g: jax.tree.map(lambda x: x.astype(jnp.bfloat16), g),
            r"got bfloat16\(8,\) at .*, where params has float32\(8,\)",
        ),
        (
            lambda g: {"Dense_0": {"kernel": g["Dense_0"]["kernel"]}},
            r"lacks \['Dense_0'\]\['bias'\]",
        ),
    ],
)
def test_apply_gradients_refuses_grads_unlike_params(state, wrong, match):
    grads = jax.tree.map(jnp.ones_like, state.params)
    with pytest.raises(DropmaskError, match=r"TrainState.apply_gradients: grads must .*" + match):
        state.apply_gradients(grads=wrong(grads))
    with pytest.raises(DropmaskError, match=r"TrainState.apply_gradients: grads must"):
        jax.jit(lambda s, g: s.apply_gradients(grads=g))(state, wrong(grads))
