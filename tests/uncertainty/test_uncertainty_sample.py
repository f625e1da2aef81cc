"""Monte Carlo dropout sampling: the key rule, chunks, Linen and NNX modes, errors."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.covering import covering

import dropmask
from dropmask import linen as dl
from dropmask import nnx as dnnx
from dropmask import uncertainty


def _f(x: jax.Array, key: jax.Array) -> jax.Array:
    return dropmask.dropout(x, 0.5, key=key)


X = jnp.arange(1.0, 13.0).reshape(3, 4)


def test_sample_i_is_f_with_fold_in_key_i() -> None:
    key = jax.random.key(3)
    samples = uncertainty.sample(_f, X, key, 5)
    for i in range(5):
        np.testing.assert_array_equal(samples[i], _f(X, jax.random.fold_in(key, i)))


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 7, 100])
def test_chunks_and_more_samples_do_not_change_a_sample(chunk_size: int | None) -> None:
    key = jax.random.key(0)
    reference = uncertainty.sample(_f, X, key, 7)
    np.testing.assert_array_equal(
        uncertainty.sample(_f, X, key, 7, chunk_size=chunk_size), reference
    )
    np.testing.assert_array_equal(uncertainty.sample(_f, X, key, 3), reference[:3])


def test_samples_differ_and_another_key_gives_others() -> None:
    a = uncertainty.sample(_f, X, jax.random.key(0), 4)
    b = uncertainty.sample(_f, X, jax.random.key(1), 4)
    assert len({np.asarray(s).tobytes() for s in a}) == 4
    assert not np.array_equal(a, b)


def test_raw_uint32_key_and_pytree_outputs() -> None:
    raw = jax.random.PRNGKey(0)

    def f(x: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
        return {"y": dropmask.dropout(x, 0.5, key=key), "s": x.sum()}

    out = uncertainty.sample(f, X, raw, 3, chunk_size=2)
    assert out["y"].shape == (3, 3, 4) and out["s"].shape == (3,)


# Fast: bfloat16, the dtype a sample could lose; float32 (slow) is the dtype every other
# test here samples in.
@pytest.mark.parametrize("dtype", covering([jnp.float32, jnp.bfloat16], [jnp.bfloat16]))
def test_jit_vmap_grad_and_dtype(dtype: jnp.dtype) -> None:
    key = jax.random.key(0)
    x = X.astype(dtype)
    eager = uncertainty.sample(_f, x, key, 4, chunk_size=3)
    assert eager.dtype == dtype
    jitted = jax.jit(lambda x, k: uncertainty.sample(_f, x, k, 4, chunk_size=3))(x, key)
    np.testing.assert_array_equal(jitted, eager)
    batched = jax.vmap(lambda row: uncertainty.sample(_f, row, key, 4))(x)
    for r in range(x.shape[0]):
        np.testing.assert_array_equal(batched[r], uncertainty.sample(_f, x[r], key, 4))
    grad = jax.grad(lambda x: uncertainty.sample(_f, x, key, 4).astype(jnp.float32).sum())(x)
    # Each element's gradient counts its kept samples, each scaled by 1 / keep_prob.
    kept = (eager != 0).sum(0).astype(jnp.float32)
    np.testing.assert_allclose(grad.astype(jnp.float32), 2.0 * kept, rtol=0, atol=0)


def test_keep_fraction_over_many_samples_within_4_sigma() -> None:
    samples = uncertainty.sample(_f, jnp.ones(64), jax.random.key(7), 400, chunk_size=64)
    n = samples.size
    kept = float((samples != 0).mean())
    assert abs(kept - 0.5) <= 4 * np.sqrt(0.25 / n)


def test_errors_name_the_argument() -> None:
    key = jax.random.key(0)
    with pytest.raises(dropmask.DropmaskValueError, match="num_samples must be >= 1"):
        uncertainty.sample(_f, X, key, 0)
    with pytest.raises(dropmask.DropmaskValueError, match="chunk_size must be >= 1"):
        uncertainty.sample(_f, X, key, 2, chunk_size=0)
    with pytest.raises(dropmask.DropmaskTypeError, match="key must be one PRNG key"):
        uncertainty.sample(_f, X, 0, 2)
    with pytest.raises(dropmask.DropmaskTypeError, match="f must be callable"):
        uncertainty.sample("f", X, key, 2)
    with pytest.raises(dropmask.DropmaskTypeError, match="num_samples must be a Python int"):
        uncertainty.sample(_f, X, key, 2.0)


# --- Linen ------------------------------------------------------------------------------


class _MLP(nn.Module):
    rate: float = 0.5

    @nn.compact
    def __call__(self, x: jax.Array, training: bool) -> jax.Array:
        x = nn.relu(nn.Dense(8)(x))
        x = dl.Dropout(self.rate, deterministic=not training)(x)
        return nn.Dense(3)(x)


class _FieldMode(nn.Module):
    """The mode is a field, as in Flax's WMT example."""

    deterministic: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dropout(0.5, deterministic=self.deterministic)(nn.Dense(8)(x))
        return nn.Dense(3)(x)


class _TiedBatchNorm(nn.Module):
    tie: bool

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.Dense(8)(x)
        x = nn.BatchNorm(use_running_average=not train if self.tie else True)(x)
        return nn.Dropout(0.5, deterministic=not train)(x)


class _Noisy(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, training: bool) -> jax.Array:
        x = dl.Dropout(0.5, deterministic=not training)(x)
        if training:
            x = x + jax.random.normal(self.make_rng("noise"), x.shape)
        return x


def test_linen_sample_is_apply_with_the_key_rule() -> None:
    model, x = _MLP(), jnp.ones((5, 4))
    variables = model.init(jax.random.key(0), x, training=False)
    key = jax.random.key(1)
    logits = uncertainty.sample_linen(model, variables, x, key=key, num_samples=6, chunk_size=4)
    assert logits.shape == (6, 5, 3)
    for i in (0, 5):
        rngs = {"dropout": jax.random.fold_in(key, i)}
        np.testing.assert_allclose(
            logits[i], model.apply(variables, x, training=True, rngs=rngs), rtol=1e-6, atol=1e-6
        )
    assert float(jnp.std(logits, axis=0).max()) > 0

    def draw(variables: dict, key: jax.Array) -> jax.Array:
        return uncertainty.sample_linen(model, variables, x, key=key, num_samples=6, chunk_size=4)

    np.testing.assert_allclose(jax.jit(draw)(variables, key), logits, rtol=1e-6, atol=1e-6)
    grads = jax.jit(jax.grad(lambda v: uncertainty.mutual_information(draw(v, key)).mean()))(
        variables
    )
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))


def test_linen_config_selected_model_and_other_conventions() -> None:
    x = jnp.ones((2, 4))
    variables = _FieldMode(True).init(jax.random.key(0), x)
    logits = uncertainty.sample_linen(
        _FieldMode(False), variables, x, key=jax.random.key(1), num_samples=4, train_kwargs={}
    )
    assert float(jnp.std(logits, axis=0).max()) > 0
    variables = _TiedBatchNorm(tie=False).init(jax.random.key(0), x, train=False)
    out = uncertainty.sample_linen(
        _TiedBatchNorm(tie=False),
        variables,
        x,
        key=jax.random.key(1),
        num_samples=3,
        train_kwargs={"train": True},
    )
    assert out.shape == (3, 2, 8)


def test_linen_batch_norm_in_train_mode_raises_naming_it() -> None:
    x = jnp.ones((2, 4))
    model = _TiedBatchNorm(tie=True)
    variables = model.init(jax.random.key(0), x, train=False)
    with pytest.raises(dropmask.DropmaskValueError, match="batch_stats.*BatchNorm"):
        uncertainty.sample_linen(
            model, variables, x, key=jax.random.key(1), num_samples=2, train_kwargs={"train": True}
        )


def test_linen_other_random_stream_raises() -> None:
    x = jnp.ones((2, 4))
    with pytest.raises(dropmask.DropmaskValueError, match="PRNG stream other than 'dropout'"):
        uncertainty.sample_linen(_Noisy(), {}, x, key=jax.random.key(1), num_samples=2)


def test_linen_wrong_model_type() -> None:
    with pytest.raises(dropmask.DropmaskTypeError, match="sample_nnx"):
        uncertainty.sample_linen(object(), {}, key=jax.random.key(0), num_samples=2)


# --- NNX --------------------------------------------------------------------------------


class _Net(nnx.Module):
    def __init__(self, rate: float, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.drop_a = dnnx.Dropout(rate, rngs=rngs)
        self.drop_b = nnx.Dropout(rate, rngs=rngs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = self.norm(self.linear(x))
        return self.drop_a(h), self.drop_b(h)


def _leaves(model: nnx.Module) -> list[np.ndarray]:
    state = nnx.state(model)
    return [
        np.asarray(jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v)
        for v in jax.tree.leaves(state)
    ]


def test_nnx_model_and_rng_state_unchanged_and_batch_norm_inferred() -> None:
    model = _Net(0.5, nnx.Rngs(0, dropout=1))
    model.train()
    before = _leaves(model)
    x = jax.random.normal(jax.random.key(2), (6, 4))
    a, b = uncertainty.sample_nnx(model, x, key=jax.random.key(3), num_samples=5, chunk_size=2)
    assert a.shape == (5, 6, 8)
    for old, new in zip(before, _leaves(model), strict=True):
        np.testing.assert_array_equal(old, new)
    assert model.drop_a.deterministic is False and model.norm.use_running_average is False
    # The two layers draw from their own streams: their masks differ.
    assert not np.array_equal(np.asarray(a) == 0, np.asarray(b) == 0)
    # Batch norm used its running averages: at rate 0 every sample is the eval output.
    still = _Net(0.0, nnx.Rngs(0, dropout=1))
    still.train()
    s, _ = uncertainty.sample_nnx(still, x, key=jax.random.key(3), num_samples=2)
    still.eval()
    expected, _ = still(x)
    np.testing.assert_allclose(s[0], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s[1], expected, rtol=1e-6, atol=1e-6)


def test_nnx_key_rule_chunks_and_jit() -> None:
    model = _Net(0.5, nnx.Rngs(0, dropout=1))
    x = jnp.ones((2, 4))
    key = jax.random.key(5)
    full, _ = uncertainty.sample_nnx(model, x, key=key, num_samples=5)
    short, _ = uncertainty.sample_nnx(model, x, key=key, num_samples=2, chunk_size=1)
    np.testing.assert_array_equal(short, full[:2])
    assert len({np.asarray(s).tobytes() for s in full}) == 5

    @nnx.jit
    def run(model: nnx.Module, x: jax.Array) -> jax.Array:
        return uncertainty.sample_nnx(model, x, key=key, num_samples=5, chunk_size=2)[0]

    np.testing.assert_allclose(run(model, x), full, rtol=1e-6, atol=1e-6)


def test_nnx_wrong_model_type() -> None:
    with pytest.raises(dropmask.DropmaskTypeError, match="sample_linen"):
        uncertainty.sample_nnx(_MLP(), jnp.ones(2), key=jax.random.key(0), num_samples=2)


def test_nnx_recurrent_weight_dropout_is_sampled() -> None:
    rnn = dnnx.MaskedRNN(
        nnx.SimpleCell(3, 4, rngs=nnx.Rngs(0)), weight_dropout=0.5, rngs=nnx.Rngs(dropout=1)
    )
    rnn.eval()
    x = jnp.ones((1, 5, 3))
    out = uncertainty.sample_nnx(rnn, x, key=jax.random.key(0), num_samples=3)
    assert out.shape == (3, 1, 5, 4)
    assert not np.allclose(out[0], out[1])
    assert rnn.deterministic is True
