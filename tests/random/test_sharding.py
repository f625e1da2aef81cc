"""The fast mask is the same for every sharding, and needs no communication."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tests.covering import covering

import dropmask
from dropmask import linen as dl
from dropmask import nnx as dnnx
from dropmask._random import _fast_mask

SHAPE = (64, 128)
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def _mesh(n: int) -> Mesh:
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return Mesh(np.array(jax.devices()[:n]), ("d",))


@functools.cache
def _reference(broadcast_dims=()):
    x = jnp.ones(SHAPE)
    return np.asarray(dropmask.dropout(x, 0.5, jax.random.key(0), broadcast_dims=broadcast_dims))


# Every device count with a mask of its own per element; a shared mask on 8 devices,
# where a broadcast axis is split the most ways. Fast: each device count once, the split
# axis in turn, and each shared mask split along its broadcast axis.
_NAMED = [(n, ()) for n in (1, 2, 4, 8)] + [(8, (0,)), (8, (1,))]


@pytest.mark.parametrize(
    ("axis", "n", "broadcast_dims"),
    covering(
        [(axis, *case) for axis in (0, 1) for case in _NAMED],
        [(i % 2, n, ()) for i, n in enumerate((1, 2, 4, 8))] + [(0, 8, (0,)), (1, 8, (1,))],
        unpack=True,
    ),
    ids=[f"{axis}-{n}-broadcast_dims{i}" for axis in (0, 1) for i, (n, _) in enumerate(_NAMED)],
)
def test_named_sharding_bit_identical_and_communication_free(n, axis, broadcast_dims):
    spec = PartitionSpec(*(("d" if i == axis else None) for i in range(2)))
    sharding = NamedSharding(_mesh(n), spec)
    x = jax.device_put(jnp.ones(SHAPE), sharding)
    f = jax.jit(
        lambda x, k: dropmask.dropout(x, 0.5, k, broadcast_dims=broadcast_dims),
        out_shardings=sharding,
    )
    key = jax.random.key(0)
    np.testing.assert_array_equal(np.asarray(f(x, key)), _reference(broadcast_dims))
    hlo = f.lower(x, key).compile().as_text()
    assert not any(op in hlo for op in COLLECTIVES), [op for op in COLLECTIVES if op in hlo]


# Fast: each path once, the split axis in turn.
@pytest.mark.parametrize(
    ("axis", "path"),
    covering(
        [(axis, path) for axis in (0, 1) for path in _fast_mask.PATHS],
        [(i % 2, path) for i, path in enumerate(_fast_mask.PATHS)],
        unpack=True,
    ),
    ids=[f"{axis}-{path}" for axis in (0, 1) for path in _fast_mask.PATHS],
)
def test_every_mask_path_is_bit_identical_and_communication_free_when_sharded(path, axis):
    """CPU and CUDA take different paths by default; each must shard like the others."""
    spec = PartitionSpec(*(("d" if i == axis else None) for i in range(2)))
    sharding = NamedSharding(_mesh(8), spec)
    words = _fast_mask.key_words(jax.random.key(0))
    thr = _fast_mask.threshold(0.9)
    f = jax.jit(
        lambda w: _fast_mask.keep_from_words(w, SHAPE, thr, path=path), out_shardings=sharding
    )
    want = _fast_mask.keep_from_words(words, SHAPE, thr, path="per_element")
    np.testing.assert_array_equal(np.asarray(f(words)), np.asarray(want))
    hlo = f.lower(words).compile().as_text()
    assert not any(op in hlo for op in COLLECTIVES), [op for op in COLLECTIVES if op in hlo]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_shard_map_with_global_offsets(n):
    mesh = _mesh(n)
    rows = SHAPE[0] // n

    def local(x, key):
        offset = (jax.lax.axis_index("d") * rows, 0)
        return dropmask.dropout(x, 0.5, key, global_shape=SHAPE, offset=offset)

    f = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(PartitionSpec("d"), PartitionSpec()),
            out_specs=PartitionSpec("d"),
        )
    )
    np.testing.assert_array_equal(np.asarray(f(jnp.ones(SHAPE), jax.random.key(0))), _reference())


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.relu(nn.Dense(32)(x))
        x = dl.Dropout(0.3, deterministic=not training)(x)
        return nn.Dense(4)(x)


def test_data_parallel_step_matches_single_device():
    mesh = _mesh(8)
    x = jax.random.normal(jax.random.key(0), (64, 8))
    y = jax.random.randint(jax.random.key(1), (64,), 0, 4)
    model = MLP()
    params = model.init(jax.random.key(2), x, training=False)
    tx = optax.sgd(0.1)

    def step(params, opt_state, x, y, key):
        def loss_fn(p):
            logits = model.apply(p, x, training=True, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    key = jax.random.fold_in(jax.random.key(3), 0)
    single = jax.jit(step)(params, tx.init(params), x, y, key)
    data = NamedSharding(mesh, PartitionSpec("d"))
    sharded = jax.jit(step)(
        params, tx.init(params), jax.device_put(x, data), jax.device_put(y, data), key
    )
    np.testing.assert_allclose(float(sharded[2]), float(single[2]), rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
        sharded[0],
        single[0],
    )


# Fast: each split axis once, the rates in turn.
@pytest.mark.parametrize(
    ("axis", "rate"),
    covering([(a, r) for a in (0, 1) for r in (0.1, 0.5)], [(0, 0.1), (1, 0.5)], unpack=True),
    ids=[f"{a}-{r}" for a in (0, 1) for r in (0.1, 0.5)],
)
def test_each_device_generates_only_its_own_words(axis, rate):
    """The packed parts (a byte per Threefry call, four to a word, at every rate) come
    out of a fusion of their own; it must be partitioned like the data (each device
    draws its local parts), not replicated on every device."""
    spec = PartitionSpec(*(("d" if i == axis else None) for i in range(2)))
    sharding = NamedSharding(_mesh(8), spec)
    x = jax.device_put(jnp.ones((256, 2048)), sharding)
    f = jax.jit(lambda x, k: dropmask.dropout(x, rate, k), out_shardings=sharding)
    hlo = f.lower(x, jax.random.key(0)).compile().as_text()
    lanes, kind = 8, "u8"
    local = (32, 2048 // lanes) if axis == 0 else (256, 2048 // 8 // lanes)

    def producers(shape: tuple[int, int]) -> list[str]:
        out = f"= {kind}[{shape[0]},{shape[1]}]"
        return [
            line
            for line in hlo.splitlines()
            if " fusion(" in line and out in line and "_jitted_flags" in line
        ]

    assert producers(local), hlo
    assert not producers((256, 2048 // lanes)), hlo  # the global parts, on one device


# --- modules inside shard_map: each device draws its block of one global mask ---------


def _mesh2d() -> Mesh:
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


SPECS = [
    PartitionSpec("data"),
    PartitionSpec(None, "model"),
    PartitionSpec("data", "model"),
    PartitionSpec(("data", "model")),
    PartitionSpec(None, ("model", "data")),
]


# Fast: every spec with a mask per element, and the mask shared along the batch axis
# with both axes split (the batch over "data"); the other shared-mask cases are slow.
@pytest.mark.parametrize(
    ("broadcast_dims", "spec"),
    covering(
        [(dims, spec) for dims in ((), (0,)) for spec in SPECS],
        [((), spec) for spec in SPECS] + [((0,), PartitionSpec("data", "model"))],
        unpack=True,
    ),
    ids=[f"broadcast_dims{i}-{spec}" for i in range(2) for spec in SPECS],
)
def test_linen_dropout_in_shard_map_equals_unsharded(spec, broadcast_dims):
    mesh, x, key = _mesh2d(), jax.random.normal(jax.random.key(1), SHAPE), jax.random.key(3)
    layer = dl.Dropout(0.3, broadcast_dims=broadcast_dims, deterministic=False)
    want = layer.apply({}, x, rngs={"dropout": key})
    sharded = layer.clone(shard_spec=spec)
    f = jax.jit(
        jax.shard_map(
            lambda x, k: sharded.apply({}, x, rngs={"dropout": k}),
            mesh=mesh,
            in_specs=(spec, PartitionSpec()),
            out_specs=spec,
        )
    )
    np.testing.assert_array_equal(np.asarray(f(x, key)), np.asarray(want))
    if broadcast_dims:
        return
    # without shard_spec every device would draw the same local mask
    same = jax.jit(
        jax.shard_map(
            lambda x, k: layer.apply({}, x, rngs={"dropout": k}),
            mesh=mesh,
            in_specs=(spec, PartitionSpec()),
            out_specs=spec,
        )
    )
    assert not np.array_equal(np.asarray(same(x, key)), np.asarray(want))


# Fast: a split batch and a feature axis split over a tuple of mesh axes; the block
# comes from shard_spec by the helper test_linen_dropout_in_shard_map_equals_unsharded
# runs on every spec.
@pytest.mark.parametrize(
    "spec",
    covering(SPECS, [PartitionSpec("data", "model"), PartitionSpec(None, ("model", "data"))]),
    ids=str,
)
def test_nnx_dropout_in_shard_map_equals_unsharded(spec):
    mesh, x = _mesh2d(), jax.random.normal(jax.random.key(1), SHAPE)
    key = jax.random.key(5)
    want = dnnx.Dropout(0.3)(x, rngs=key)
    layer = dnnx.Dropout(0.3, shard_spec=spec)
    f = jax.jit(
        jax.shard_map(
            lambda x, k: layer(x, rngs=k),
            mesh=mesh,
            in_specs=(spec, PartitionSpec()),
            out_specs=spec,
        )
    )
    np.testing.assert_array_equal(np.asarray(f(x, key)), np.asarray(want))


def test_modules_take_call_time_global_shape_and_offset():
    mesh, x, key = _mesh(8), jax.random.normal(jax.random.key(1), SHAPE), jax.random.key(3)
    rows = SHAPE[0] // 8
    linen_layer = dl.Dropout(0.5, deterministic=False)
    nnx_layer = dnnx.Dropout(0.5)

    def local(x, k):
        offset = (jax.lax.axis_index("d") * rows, 0)
        a = linen_layer.apply({}, x, rng=k, global_shape=SHAPE, offset=offset)
        b = nnx_layer(x, rngs=k, global_shape=SHAPE, offset=offset)
        return a, b

    spec = PartitionSpec("d")
    f = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=(spec, spec))
    )
    a, b = f(x, key)
    want = np.asarray(dropmask.dropout(x, 0.5, key))
    np.testing.assert_array_equal(np.asarray(a), want)
    np.testing.assert_array_equal(np.asarray(b), want)


def test_shard_spec_longer_than_the_input_is_rejected():
    mesh = _mesh(8)
    layer = dl.Dropout(0.5, deterministic=False, shard_spec=PartitionSpec(None, None, "d"))
    f = jax.shard_map(
        lambda x, k: layer.apply({}, x, rng=k),
        mesh=mesh,
        in_specs=(PartitionSpec("d"), PartitionSpec()),
        out_specs=PartitionSpec("d"),
    )
    with pytest.raises(
        dropmask.DropmaskValueError, match="shard_spec .* has 3 entries but the input has 2"
    ):
        jax.jit(f)(jnp.ones(SHAPE), jax.random.key(0))


# --- drop_path and alpha_dropout inside shard_map ----------------------------------------

# (mesh, spec): the batch axis or a feature axis split, on a 1-D and a 2-D mesh
BLOCK_CASES = [
    ("1d", PartitionSpec("d")),
    ("1d", PartitionSpec(None, "d")),
    *[("2d", spec) for spec in SPECS],
]
RATE = 0.3


# The layers compute their block from shard_spec with the helper every layer shares,
# which test_linen_dropout_in_shard_map_equals_unsharded runs on every spec of SPECS:
# a layer other than Dropout runs on a split batch axis, a split feature axis, and a
# feature axis split over a tuple of mesh axes.
LAYER_BLOCK_CASES = [BLOCK_CASES[0], BLOCK_CASES[1], BLOCK_CASES[-1]]


def _mesh_named(name: str) -> Mesh:
    return _mesh(8) if name == "1d" else _mesh2d()


def _block_of(spec: PartitionSpec, local_shape) -> tuple[tuple[int, ...], tuple]:
    """This device's ``(global_shape, offset)``, computed here from the mesh axes
    (row-major over a tuple of names) rather than by the library's own helper."""
    entries = tuple(spec) + (None,) * (len(local_shape) - len(spec))
    global_shape, offset = [], []
    for d, names in zip(local_shape, entries, strict=True):
        names = () if names is None else (names,) if isinstance(names, str) else tuple(names)
        index, size = 0, 1
        for name in names:
            index = index * jax.lax.axis_size(name) + jax.lax.axis_index(name)
            size *= jax.lax.axis_size(name)
        global_shape.append(d * size)
        offset.append(index * d)
    return tuple(global_shape), tuple(offset)


FUNCTIONAL = {
    "drop_path": lambda x, k, **kw: dropmask.drop_path(x, RATE, k, **kw),
    "alpha_dropout": lambda x, k, **kw: dropmask.alpha_dropout(x, RATE, k, **kw),
}
LINEN = {"drop_path": dl.DropPath, "alpha_dropout": dl.AlphaDropout}
NNX = {"drop_path": dnnx.DropPath, "alpha_dropout": dnnx.AlphaDropout}


def _in_shard_map(mesh, spec, local):
    return jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec)
    )


def _x_and_key():
    return jax.random.normal(jax.random.key(1), SHAPE), jax.random.key(7)


# Fast: drop_path (one decision per example) on every block; alpha_dropout, a mask per
# element as test_linen_dropout_in_shard_map_equals_unsharded draws on every spec, on
# the layers' LAYER_BLOCK_CASES.
@pytest.mark.parametrize(
    ("name", "mesh_name", "spec"),
    covering(
        [(name, *case) for name in sorted(FUNCTIONAL) for case in BLOCK_CASES],
        [("drop_path", *case) for case in BLOCK_CASES]
        + [("alpha_dropout", *case) for case in LAYER_BLOCK_CASES],
        unpack=True,
    ),
    ids=[f"{name}-{m}-{s}" for name in sorted(FUNCTIONAL) for m, s in BLOCK_CASES],
)
def test_functional_block_in_shard_map_equals_unsharded(name, mesh_name, spec):
    fn, (x, key) = FUNCTIONAL[name], _x_and_key()
    want = np.asarray(fn(x, key))

    def local(x, k):
        global_shape, offset = _block_of(spec, x.shape)
        return fn(x, k, global_shape=global_shape, offset=offset)

    got = np.asarray(_in_shard_map(_mesh_named(mesh_name), spec, local)(x, key))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("mesh_name", "spec"), LAYER_BLOCK_CASES, ids=str)
@pytest.mark.parametrize("name", sorted(LINEN))
def test_linen_layer_with_shard_spec_equals_unsharded(name, mesh_name, spec):
    (x, key), layer = _x_and_key(), LINEN[name](RATE, deterministic=False)
    want = np.asarray(layer.apply({}, x, rngs={"dropout": key}))
    sharded = layer.clone(shard_spec=spec)
    f = _in_shard_map(
        _mesh_named(mesh_name), spec, lambda x, k: sharded.apply({}, x, rngs={"dropout": k})
    )
    np.testing.assert_array_equal(np.asarray(f(x, key)), want)


@pytest.mark.parametrize(("mesh_name", "spec"), LAYER_BLOCK_CASES, ids=str)
@pytest.mark.parametrize("name", sorted(NNX))
def test_nnx_layer_with_shard_spec_equals_unsharded(name, mesh_name, spec):
    x, key = _x_and_key()
    want = np.asarray(NNX[name](RATE)(x, rngs=key))
    layer = NNX[name](RATE, shard_spec=spec)
    f = _in_shard_map(_mesh_named(mesh_name), spec, lambda x, k: layer(x, rngs=k))
    np.testing.assert_array_equal(np.asarray(f(x, key)), want)


@pytest.mark.parametrize("name", sorted(LINEN))
def test_drop_path_and_alpha_modules_take_call_time_block(name):
    mesh, spec, (x, key) = _mesh2d(), PartitionSpec("data", "model"), _x_and_key()
    linen_layer, nnx_layer = LINEN[name](RATE, deterministic=False), NNX[name](RATE)

    def local(x, k):
        global_shape, offset = _block_of(spec, x.shape)
        a = linen_layer.apply({}, x, rng=k, global_shape=global_shape, offset=offset)
        b = nnx_layer(x, rngs=k, global_shape=global_shape, offset=offset)
        return a, b

    f = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=(spec, spec))
    )
    a, b = f(x, key)
    want = np.asarray(FUNCTIONAL[name](x, key))
    np.testing.assert_array_equal(np.asarray(a), want)
    np.testing.assert_array_equal(np.asarray(b), want)


@pytest.mark.parametrize("spec", [PartitionSpec(None, "model"), PartitionSpec("data", "model")])
def test_drop_path_decision_is_shared_by_devices_splitting_features(spec):
    """Each device holds part of an example's features; all of them must drop it or keep
    it together, and the block is what makes the batch-split devices differ."""
    mesh, key = _mesh2d(), jax.random.key(7)
    x = jnp.ones(SHAPE)
    f = _in_shard_map(mesh, spec, lambda x, k: dnnx.DropPath(RATE, shard_spec=spec)(x, rngs=k))
    got = np.asarray(f(x, key))
    kept = got != 0
    np.testing.assert_array_equal(kept, np.broadcast_to(kept[:, :1], SHAPE))
    assert 0 < kept[:, 0].sum() < SHAPE[0], kept[:, 0]
    # the kept examples are scaled by the keep probability the threshold realises
    np.testing.assert_allclose(got[kept], got[kept][0], rtol=0, atol=0)
    np.testing.assert_allclose(got[kept][0], 1 / (1 - RATE), rtol=1e-3)


def test_drop_path_without_a_block_repeats_one_decision_per_device():
    """Guards the tests above: with the batch split and no block, each device would draw
    the same local decisions, which differ from the unsharded ones."""
    mesh, spec, (x, key) = _mesh(8), PartitionSpec("d"), _x_and_key()
    f = _in_shard_map(mesh, spec, lambda x, k: dropmask.drop_path(x, RATE, k))
    got = np.asarray(f(x, key)) != 0
    rows = SHAPE[0] // 8
    np.testing.assert_array_equal(got, np.tile(got[:rows], (8, 1)))
    assert not np.array_equal(got, np.asarray(dropmask.drop_path(x, RATE, key)) != 0)


@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_gradient_through_shard_map_equals_unsharded(name):
    mesh, spec, (x, key) = _mesh2d(), PartitionSpec("data", "model"), _x_and_key()
    fn, weights = FUNCTIONAL[name], jax.random.normal(jax.random.key(2), SHAPE)

    def local(x, k):
        global_shape, offset = _block_of(spec, x.shape)
        return fn(x, k, global_shape=global_shape, offset=offset)

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec)
    want = jax.grad(lambda x: jnp.sum(fn(x, key) * weights))(x)
    got = jax.jit(jax.grad(lambda x: jnp.sum(sharded(x, key) * weights)))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    dropped = np.asarray(fn(jnp.ones(SHAPE), key)) == np.asarray(fn(2 * jnp.ones(SHAPE), key))
    # dropped elements get no gradient; the test fails if nothing is dropped
    assert dropped.any() and (np.asarray(got)[dropped] == 0).all()


def _error(f) -> str:
    with pytest.raises(dropmask.DropmaskError) as info:
        f()
    return str(info.value)


BAD_BLOCKS = [
    {"global_shape": SHAPE, "offset": None},
    {"global_shape": (8, 128), "offset": (0, 0)},
    {"global_shape": SHAPE, "offset": (0,)},
    {"global_shape": (64.0, 128), "offset": (0, 0)},
]


@pytest.mark.parametrize("bad", BAD_BLOCKS, ids=str)
def test_bad_block_errors_match_dropout_and_name_the_caller(bad):
    x, key = jnp.ones((16, 128)), jax.random.key(0)
    base = _error(lambda: dropmask.dropout(x, RATE, key, **bad))
    assert base.startswith("dropout: "), base
    callers = {
        "drop_path": lambda: dropmask.drop_path(x, RATE, key, **bad),
        "alpha_dropout": lambda: dropmask.alpha_dropout(x, RATE, key, **bad),
        "dropmask.linen.DropPath": lambda: dl.DropPath(RATE, deterministic=False).apply(
            {}, x, rng=key, **bad
        ),
        "dropmask.nnx.AlphaDropout": lambda: dnnx.AlphaDropout(RATE)(x, rngs=key, **bad),
    }
    for name, call in callers.items():
        assert _error(call) == name + base.removeprefix("dropout"), name


def test_flax_impl_rejects_a_block_naming_the_caller():
    x, key = jnp.ones((16, 128)), jax.random.key(0)
    block = {"global_shape": (32, 128), "offset": (16, 0)}
    for name, fn in (("drop_path", dropmask.drop_path), ("alpha_dropout", dropmask.alpha_dropout)):
        with pytest.raises(dropmask.DropmaskValueError, match=f"^{name}: .*need impl='fast'"):
            fn(x, RATE, key, impl="flax", **block)


# --- word_dropout inside shard_map --------------------------------------------------------

UNK = 1


def _tokens_and_key():
    return jax.random.randint(jax.random.key(3), SHAPE, 2, 1000, dtype=jnp.int32), jax.random.key(7)


def _word(x, k, **kw):
    return dropmask.word_dropout(x, RATE, k, unk_id=UNK, **kw)


# Fast: LAYER_BLOCK_CASES (a mask per element, as
# test_linen_dropout_in_shard_map_equals_unsharded draws on every spec).
@pytest.mark.parametrize(
    ("mesh_name", "spec"), covering(BLOCK_CASES, LAYER_BLOCK_CASES, unpack=True), ids=str
)
def test_word_dropout_block_in_shard_map_equals_unsharded(mesh_name, spec):
    tokens, key = _tokens_and_key()
    want = np.asarray(_word(tokens, key))
    assert 0 < (want == UNK).sum() < want.size  # some tokens replaced, not all

    def local(t, k):
        global_shape, offset = _block_of(spec, t.shape)
        return _word(t, k, global_shape=global_shape, offset=offset)

    got = np.asarray(_in_shard_map(_mesh_named(mesh_name), spec, local)(tokens, key))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("mesh_name", "spec"), LAYER_BLOCK_CASES, ids=str)
def test_word_dropout_layers_with_shard_spec_equal_unsharded(mesh_name, spec):
    (tokens, key), mesh = _tokens_and_key(), _mesh_named(mesh_name)
    want = np.asarray(_word(tokens, key))
    linen_layer = dl.WordDropout(RATE, unk_id=UNK, deterministic=False, shard_spec=spec)
    nnx_layer = dnnx.WordDropout(RATE, unk_id=UNK, shard_spec=spec)
    # Linen's rngs= stream folds the key in, so its reference is the unsharded layer
    want_linen = np.asarray(
        dl.WordDropout(RATE, unk_id=UNK, deterministic=False).apply(
            {}, tokens, rngs={"dropout": key}
        )
    )
    assert 0 < (want_linen == UNK).sum() < want_linen.size
    np.testing.assert_array_equal(
        np.asarray(dnnx.WordDropout(RATE, unk_id=UNK)(tokens, rngs=key)), want
    )
    a = _in_shard_map(mesh, spec, lambda t, k: linen_layer.apply({}, t, rngs={"dropout": k}))
    b = _in_shard_map(mesh, spec, lambda t, k: nnx_layer(t, rngs=k))
    np.testing.assert_array_equal(np.asarray(a(tokens, key)), want_linen)
    np.testing.assert_array_equal(np.asarray(b(tokens, key)), want)


def test_word_dropout_layers_take_call_time_block_and_broadcast_dims():
    mesh, spec, (tokens, key) = _mesh2d(), PartitionSpec("data", "model"), _tokens_and_key()
    linen_layer = dl.WordDropout(RATE, unk_id=UNK, deterministic=False)
    nnx_layer = dnnx.WordDropout(RATE, unk_id=UNK)

    def local(t, k):
        global_shape, offset = _block_of(spec, t.shape)
        a = linen_layer.apply({}, t, rng=k, global_shape=global_shape, offset=offset)
        b = nnx_layer(t, rngs=k, global_shape=global_shape, offset=offset)
        c = _word(t, k, broadcast_dims=0, global_shape=global_shape, offset=offset)
        return a, b, c

    f = jax.jit(
        jax.shard_map(
            local, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=(spec, spec, spec)
        )
    )
    a, b, c = f(tokens, key)
    want = np.asarray(_word(tokens, key))
    np.testing.assert_array_equal(np.asarray(a), want)
    np.testing.assert_array_equal(np.asarray(b), want)
    want_bcast = np.asarray(_word(tokens, key, broadcast_dims=0))
    np.testing.assert_array_equal(np.asarray(c), want_bcast)
    dropped = want_bcast == UNK
    np.testing.assert_array_equal(dropped, np.broadcast_to(dropped[:1], SHAPE))


@pytest.mark.parametrize("bad", BAD_BLOCKS, ids=str)
def test_word_dropout_bad_block_errors_name_the_caller(bad):
    x, tokens, key = jnp.ones((16, 128)), jnp.zeros((16, 128), jnp.int32), jax.random.key(0)
    base = _error(lambda: dropmask.dropout(x, RATE, key, **bad))
    callers = {
        "word_dropout": lambda: _word(tokens, key, **bad),
        "dropmask.linen.WordDropout": lambda: dl.WordDropout(
            RATE, unk_id=UNK, deterministic=False
        ).apply({}, tokens, rng=key, **bad),
        "dropmask.nnx.WordDropout": lambda: dnnx.WordDropout(RATE, unk_id=UNK)(
            tokens, rngs=key, **bad
        ),
    }
    for name, call in callers.items():
        assert _error(call) == name + base.removeprefix("dropout"), name


def test_word_dropout_flax_impl_rejects_a_block_naming_the_caller():
    tokens, key = jnp.zeros((16, 128), jnp.int32), jax.random.key(0)
    block = {"global_shape": (32, 128), "offset": (16, 0)}
    with pytest.raises(dropmask.DropmaskValueError, match="^word_dropout: .*need impl='fast'"):
        _word(tokens, key, impl="flax", **block)


@pytest.mark.parametrize(
    ("spec", "inside", "match"),
    [
        (PartitionSpec("model"), True, r"axis 'model'.*mesh axes in scope are \('d',\)"),
        (PartitionSpec(("d", "model")), True, r"axis 'model'.*mesh axes in scope are \('d',\)"),
        (PartitionSpec("d"), False, r"axis 'd'.*no mesh axis is in scope.*not inside shard_map"),
    ],
)
def test_shard_spec_naming_an_unbound_axis_names_shard_spec_and_the_axes(spec, inside, match):
    mesh = _mesh(8)
    layer = dl.Dropout(0.5, deterministic=False, shard_spec=spec)

    def apply(x, k):
        return layer.apply({}, x, rng=k)

    f = (
        jax.shard_map(
            apply,
            mesh=mesh,
            in_specs=(PartitionSpec("d"), PartitionSpec()),
            out_specs=PartitionSpec("d"),
        )
        if inside
        else apply
    )
    with pytest.raises(dropmask.DropmaskValueError, match=rf"Dropout: shard_spec .*{match}"):
        jax.jit(f)(jnp.ones(SHAPE), jax.random.key(0))


@pytest.mark.parametrize("impl", ["fast", "flax"])
def test_dropout_under_a_mesh_of_explicit_axes_keeps_the_sharding_and_the_mask(impl):
    from jax.sharding import AxisType

    _mesh(8)
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Explicit,))
    x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, SHAPE), jnp.float32)
    key = jax.random.key(3)
    expected = dropmask.dropout(x, 0.5, key, impl=impl, broadcast_dims=(1,))
    with jax.set_mesh(mesh):
        sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec("d")))
        out = jax.jit(lambda x: dropmask.dropout(x, 0.5, key, impl=impl, broadcast_dims=(1,)))(
            sharded
        )
        grad = jax.jit(jax.grad(lambda x: dropmask.dropout(x, 0.5, key, impl=impl).sum()))(sharded)
    assert out.sharding.spec == PartitionSpec("d", None)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(
        grad, jax.grad(lambda x: dropmask.dropout(x, 0.5, key, impl=impl).sum())(x)
    )
