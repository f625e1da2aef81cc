"""Attention with dropout under a mesh of explicit axes, on XLA's paths: outputs and
gradients equal the unsharded call's. The dense path's backward pass transposes its
products by hand, at types an einsum may shard otherwise than the cotangent that
arrives; the blockwise path fills its loops from a 0 that keeps the sharded axes."""

from __future__ import annotations

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from tests.covering import covering
from tests.jaxprs import equations

import dropmask
from dropmask import testing

SLOW = pytest.mark.slow


def _mesh(devices: int):
    if len(jax.devices()) < devices:
        pytest.skip(f"needs {devices} devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh((devices,), ("data",), axis_types=(AxisType.Explicit,))


def _mesh_4x2():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def _attention(algorithm):
    """Causal attention with dropout 0.1 by ``algorithm``."""

    def f(q, k, v):
        return dropmask.dot_product_attention(
            q,
            k,
            v,
            dropout_rate=0.1,
            key=jax.random.key(1),
            deterministic=False,
            algorithm=algorithm,
            is_causal=True,
        )

    return f


def _self_attention(algorithm):
    attention = _attention(algorithm)
    return lambda x: attention(x, x, x)


_GRADIENT_CASES = [
    (algorithm, dtype, devices)
    for algorithm in ("dense", "blockwise")
    for dtype in ("float32", "bfloat16")
    for devices in (1, 8)
]


# Fast: float32 on each path once, the mesh sizes in turn (the one-device mesh's dense
# backward also in test_a_one_device_mesh_without_set_mesh_gives_the_unsharded_gradients).
@pytest.mark.parametrize(
    ("algorithm", "dtype", "devices"),
    covering(_GRADIENT_CASES, [("dense", "float32", 1), ("blockwise", "float32", 8)], unpack=True),
    ids=["-".join(map(str, case)) for case in _GRADIENT_CASES],
)
def test_gradients_under_a_mesh_of_explicit_axes_equal_the_unsharded_ones(
    devices, dtype, algorithm
):
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, g = (jax.random.normal(kk, (devices, 64, 2, 32), dtype) for kk in ks)

    def loss(q, k, v, g):
        out = dropmask.dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_rate=0.1,
            key=jax.random.key(1),
            deterministic=False,
            algorithm=algorithm,
        )
        return jnp.sum((out * g).astype(jnp.float32))

    grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    want = grads(q, k, v, g)
    mesh = _mesh(devices)
    with jax.set_mesh(mesh):
        args = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (q, k, v, g)]
        got = grads(*args)
    # The same mask; XLA's partitioned program may round another way.
    tol = 1e-5 if dtype == "float32" else 2e-2
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_a_one_device_mesh_without_set_mesh_gives_the_unsharded_gradients():
    """On a one-device mesh an einsum's rule drops the size-1 axis's split from the
    dense backward's products, so the cotangent that arrives is resharded to the
    product's type; jitted without ``jax.set_mesh``, by the sharding it names."""
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, g = (jax.random.normal(kk, (1, 64, 2, 32)) for kk in ks)

    def f(q, k, v):
        return dropmask.dot_product_attention(
            q, k, v, is_causal=True, dropout_rate=0.1, key=jax.random.key(1), deterministic=False
        )

    vjp = jax.jit(lambda q, k, v, g: jax.vjp(f, q, k, v)[1](g))
    mesh = _mesh(1)
    want = vjp(q, k, v, g)
    got = vjp(*[jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (q, k, v, g)])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# Fast: the batch and heads split and the heads split over both axes; the batch split
# alone (slow) is a part of the first.
@pytest.mark.parametrize(
    "partition",
    covering(
        [P("data"), P("data", None, "model"), P(None, None, ("data", "model"))],
        [P("data", None, "model"), P(None, None, ("data", "model"))],
    ),
)
def test_the_dense_backward_orders_its_passes_by_a_scalar_on_each_device(partition):
    """The dense path's backward pass makes its rebuilt weights wait for a row sum (and
    its weights' product for ``v``'s gradient) through a predicate that XLA cannot fold.
    Under a mesh of explicit axes each device computes it from its own block, a scalar
    inside ``shard_map``: one per batch row split the fusions that write ``v``'s gradient
    on a TPU. The gradients stay those of the unsharded call."""
    mesh = _mesh_4x2()
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, g = (jax.random.normal(kk, (8, 40, 8, 16)) for kk in ks)

    def loss(q, k, v, g):
        out = dropmask.dot_product_attention(
            q,
            k,
            v,
            dropout_rate=0.1,
            key=jax.random.key(1),
            deterministic=False,
            algorithm="dense",
        )
        return jnp.sum(out * g)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    want = grads(q, k, v, g)
    with jax.set_mesh(mesh):
        args = [jax.device_put(a, NamedSharding(mesh, partition)) for a in (q, k, v, g)]
        jaxpr = jax.make_jaxpr(grads)(*args).jaxpr
        got = grads(*args)
    counts = [e for e in equations(jaxpr) if e.primitive.name == "population_count"]
    assert len(counts) == 2  # the weights after the row sum, the product after dv
    assert all(e.invars[0].aval.shape == () for e in counts)
    bodies = [e for e in equations(jaxpr) if e.primitive.name == "shard_map"]
    inside = [e for b in bodies for e in equations(b.params["jaxpr"])]
    assert sum(e.primitive.name == "population_count" for e in inside) == 2
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "algorithm",
    ["dense", pytest.param("blockwise", marks=pytest.mark.slow), "pallas"],
)
def test_a_vjp_jitted_without_set_mesh_takes_the_mesh_from_its_input(algorithm):
    """Inputs on a mesh of explicit axes, jitted without ``jax.set_mesh``: the reshards
    (and the TPU kernels' ``shard_map``, in the interpreter) name the inputs' mesh
    themselves; the unsharded values."""
    mesh = _mesh_4x2()
    q = jax.random.normal(jax.random.key(0), (8, 128, 4, 64))

    f = _self_attention(algorithm)

    vjp = jax.jit(lambda x, ct: jax.vjp(f, x)[1](ct)[0])
    placed = jax.device_put(q, NamedSharding(mesh, P("data", None, "model")))
    with testing.tpu_kernels(algorithm == "pallas"):
        want = vjp(q, q)
        got = vjp(placed, placed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("set_mesh", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "algorithm", ["dense", "blockwise", pytest.param("pallas", marks=pytest.mark.slow)]
)
def test_grouped_heads_split_over_a_mesh_give_the_unsharded_gradients(algorithm, set_mesh):
    """4 query heads over 2 key-value heads, the heads split over ``"model"``: merging
    a key-value head's query heads keeps the split (the dense path's products and its
    non-finite columns, the blockwise path's taint), where a reshape that split and
    merged at once, or ``jnp.repeat``, was refused."""
    mesh = _mesh_4x2()
    q = jax.random.normal(jax.random.key(0), (4, 128, 4, 64))
    kv = jax.random.normal(jax.random.key(1), (4, 128, 2, 64))

    def f(q, kv):
        return dropmask.dot_product_attention(
            q,
            kv,
            kv,
            dropout_rate=0.1,
            key=jax.random.key(1),
            deterministic=False,
            algorithm=algorithm,
            is_causal=True,
        )

    vjp = jax.jit(lambda q, kv, ct: jax.vjp(f, q, kv)[1](ct))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("data", None, "model")))  # noqa: E731
    with testing.tpu_kernels(algorithm == "pallas"):
        want = vjp(q, kv, q)
        with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
            got = vjp(put(q), put(kv), put(q))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("q_spec", "kv_spec"),
    [
        pytest.param(P("data", "model"), P("data", "model"), id="query and key axes"),
        pytest.param(
            P("data", None, "model"), P("data", "model"), id="keys unlike queries", marks=SLOW
        ),
        pytest.param(
            P("data", None, None, "model"), P("data", None, None, "model"), id="depth", marks=SLOW
        ),
    ],
)
@pytest.mark.parametrize("algorithm", ["dense", "blockwise", pytest.param("pallas", marks=SLOW)])
def test_a_split_the_paths_cannot_take_is_gathered_and_split_back(algorithm, q_spec, kv_spec):
    """A query, key or depth axis split over devices, or keys split unlike queries:
    JAX's ``dot_general`` refuses the products (Flax's attention raises), so the call
    is resharded to ``q``'s split of batch and heads first; the output and gradients
    come back split as the inputs, with the unsharded values."""
    mesh = _mesh_4x2()
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, ct = (jax.random.normal(kk, (8, 128, 4, 64)) for kk in ks)

    f = _attention(algorithm)
    vjp = jax.jit(lambda q, k, v, ct: jax.vjp(f, q, k, v)[1](ct))
    on = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    args = (on(q, q_spec), on(k, kv_spec), on(v, kv_spec))
    with testing.tpu_kernels(algorithm == "pallas"):
        want, want_grads = jax.jit(f)(q, k, v), vjp(q, k, v, ct)
        got = jax.jit(f)(*args)
        grads = vjp(*args, on(ct, q_spec))
    assert got.sharding.is_equivalent_to(args[0].sharding, got.ndim)
    for g, arg in zip(grads, args, strict=True):
        assert g.sharding.is_equivalent_to(arg.sharding, g.ndim)
    for a, b in zip((got, *grads), (want, *want_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _side_inputs():
    ids = jnp.broadcast_to(jnp.arange(128) // 48, (8, 128))
    return {
        "mask": (jax.random.bernoulli(jax.random.key(2), 0.8, (8, 1, 128, 128)), "mask"),
        "bias": (jax.random.normal(jax.random.key(3), (8, 4, 128, 128)), "bias"),
        "kv_mask": (jax.random.bernoulli(jax.random.key(4), 0.8, (8, 128)), "kv_mask"),
        "segment ids": (ids, "q_segment_ids"),
    }


SIDE_SPLITS = [  # (input, its split, whether make test runs it on the dense path)
    ("mask", P("data", None, None, "model"), "mask along keys", True),
    ("mask", P(None, None, "model"), "mask along queries", False),
    ("bias", P(None, None, None, "model"), "bias along keys", False),
    ("bias", P("data", "model"), "bias as the scores", False),
    ("kv_mask", P(None, "model"), "key mask along keys", False),
    ("segment ids", P("data", "model"), "segment ids along their length", True),
]
# The TPU kernels take no mask or bias (the blockwise path runs those).
SIDE_CASES = [
    pytest.param(algorithm, side, spec, id=f"{algorithm}-{name}", marks=() if fast else SLOW)
    for algorithm in ("dense", "blockwise", "pallas")
    for side, spec, name, dense_fast in SIDE_SPLITS
    if not (algorithm == "pallas" and side in ("mask", "bias"))
    for fast in [dense_fast and algorithm == "dense"]
]


@pytest.mark.parametrize(("algorithm", "side", "spec"), SIDE_CASES)
def test_side_inputs_split_otherwise_than_the_scores_are_resharded(algorithm, side, spec):
    """A mask, bias, key mask or segment ids split otherwise than the scores
    (``[batch@data, heads@model, q, k]``): JAX refused the elementwise ops that combine
    them (as with Flax's attention); each is resharded to the scores' split first, with
    the unsharded values and gradients."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    value, name = _side_inputs()[side]
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    q = jax.random.normal(jax.random.key(0), (8, 128, 4, 64))

    def f(q, side):
        return dropmask.dot_product_attention(
            q,
            q,
            q,
            dropout_rate=0.1,
            key=jax.random.key(1),
            deterministic=False,
            algorithm=algorithm,
            **{name: side},
        )

    vjp = jax.jit(lambda q, side: jax.vjp(lambda q: f(q, side), q)[1](q)[0])
    on = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    with testing.tpu_kernels(algorithm == "pallas"):
        want = jax.jit(f)(q, value), vjp(q, value)
        got = jax.jit(f)(on(q, P("data", None, "model")), on(value, spec))
        got = got, vjp(on(q, P("data", None, "model")), on(value, spec))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "algorithm",
    [pytest.param("dense", marks=SLOW), pytest.param("blockwise", marks=SLOW), "pallas"],
)
def test_inside_a_shard_map_over_some_axes_the_rest_stay_split(algorithm):
    """Inside a ``shard_map`` manual over ``"data"`` only, ``"model"`` (explicit) still
    splits the heads: each data block is a call of its own (as in any ``shard_map``),
    the heads split within it. The TPU kernels' own ``shard_map`` maps over the explicit
    axes alone (over every axis, XLA refused the nested map), and their outputs and
    gradients vary over ``"data"`` as their inputs do (typed as the same on every
    block, JAX's transpose summed the cotangents over ``"data"``)."""
    mesh = _mesh_4x2()
    q = jax.random.normal(jax.random.key(0), (8, 256, 4, 64))

    attend = _self_attention(algorithm)

    def f(x):
        return jax.shard_map(
            attend, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"}
        )(x)

    vjp = lambda f: jax.jit(lambda x: (f(x), jax.vjp(f, x)[1](x)[0]))  # noqa: E731
    with testing.tpu_kernels(algorithm == "pallas"):
        with jax.set_mesh(mesh):
            got = vjp(f)(jax.device_put(q, NamedSharding(mesh, P("data", None, "model"))))
        blocks = [vjp(attend)(q[i : i + 2]) for i in range(0, 8, 2)]
    want = [jnp.concatenate(parts) for parts in zip(*blocks, strict=True)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "algorithm",
    ["dense", pytest.param("blockwise", marks=SLOW), pytest.param("pallas", marks=SLOW)],
)
def test_a_flax_attention_layer_on_a_data_parallel_mesh_gives_the_unsharded_gradients(algorithm):
    """Linen's ``MultiHeadDotProductAttention`` with dropmask's ``attention_fn`` and
    attention dropout, its batch split over a 4 x 2 mesh of explicit axes (parameters
    replicated): the loss and the parameters' gradients of the unsharded step."""
    mesh = _mesh_4x2()
    x = jax.random.normal(jax.random.key(0), (8, 128, 256))
    layer = nn.MultiHeadDotProductAttention(
        num_heads=4,
        dropout_rate=0.1,
        deterministic=False,
        attention_fn=functools.partial(dropmask.dot_product_attention, algorithm=algorithm),
    )
    params = layer.init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, x)

    def loss(params, x):
        return jnp.sum(layer.apply(params, x, rngs={"dropout": jax.random.key(3)}) ** 2)

    step = jax.jit(jax.value_and_grad(loss))
    with testing.tpu_kernels(algorithm == "pallas"):
        want = step(params, x)
        with jax.set_mesh(mesh):
            on = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
            got = step(jax.tree.map(lambda a: on(a, P()), params), on(x, P("data")))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
