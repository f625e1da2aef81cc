"""Under a mesh of explicit axes every public mask drawer draws the unsharded mask.

There an array's type carries its sharding, and JAX refuses what it cannot compute
locally (a one-element slice of a sharded axis, a select of operands sharded apart).
Each function and layer of ``tests/mask_sites.py`` runs on an input split over 8 CPU
devices, eagerly, under ``jit`` with a static and a run-time rate and differentiated,
and must give what it gives on the unsharded input.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from tests.mask_sites import SITES, Site, public_mask_drawers, site_input

KEY = jax.random.key(3)
RATE = 0.3
# jax.set_mesh where this JAX has it, else jax.sharding.use_mesh.
_set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh


def _mesh(kind: str) -> jax.sharding.Mesh:
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    if kind == "8":
        return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def _loss(site: Site, rate: Any) -> Any:
    """A weighted sum of the outputs, to differentiate."""

    def loss(x: jax.Array) -> jax.Array:
        leaves = jax.tree.leaves(site.call(x, rate, KEY))
        keys = jax.random.split(jax.random.key(2), len(leaves))
        return sum(
            jnp.sum(leaf * jax.random.normal(k, leaf.shape))
            for leaf, k in zip(leaves, keys, strict=True)
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        )

    return loss


def _run(site: Site, mode: str) -> Any:
    """``site`` as ``mode`` runs it: a function of the input."""
    if mode == "eager":
        return lambda x: site.call(x, RATE, KEY)
    if mode == "jit":
        return jax.jit(lambda x: site.call(x, RATE, KEY))
    if mode == "run-time rate":
        return lambda x: jax.jit(site.call)(x, jnp.float32(RATE), KEY)
    return jax.jit(jax.grad(_loss(site, RATE)))


def _cases() -> list[Any]:
    cases = []
    for site in SITES:
        modes = ["eager", "jit"]
        modes += ["run-time rate"] if site.traced_rate else []
        modes += ["grad"] if site.differentiable else []
        meshes = ["8"] if site.spec_2d is None else ["8", "4x2"]
        for mode in modes:
            marks = []
            if site.slow and mode != "jit":
                marks.append(pytest.mark.slow)
            for mesh in meshes:
                case_id = f"{site.id}-{mode}-{mesh}"
                cases.append(pytest.param(site, mode, mesh, marks=marks, id=case_id))
    return cases


@pytest.mark.parametrize(("site", "mode", "mesh_kind"), _cases())
def test_a_mask_drawer_gives_the_unsharded_result_under_explicit_sharding(site, mode, mesh_kind):
    """The same program on the input split over the batch axis of 8 devices, or over
    both axes of a 4 x 2 mesh (``site.spec_2d``), gives the unsharded result: the same
    mask, and arithmetic that may round its last bits apart (XLA compiles each
    device's part of a loop on its own)."""
    x = site_input(site)
    mesh = _mesh(mesh_kind)
    spec = P("data") if mesh_kind == "8" else site.spec_2d
    run = _run(site, mode)
    want = run(x)
    with _set_mesh(mesh):
        got = run(jax.device_put(x, NamedSharding(mesh, spec)))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=site.id),
        got,
        want,
    )


def test_every_public_mask_drawer_has_a_site():
    """A new public function that takes a key, or a new layer, needs a site in
    tests/mask_sites.py, so that these properties cover it."""
    covered = {site.public for site in SITES}
    assert public_mask_drawers() - covered == set()
    assert covered - public_mask_drawers() == set()  # no stale site
