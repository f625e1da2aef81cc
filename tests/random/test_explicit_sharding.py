"""Under a mesh of explicit axes every public mask drawer draws the unsharded mask.

There an array's type carries its sharding, and JAX refuses what it cannot compute
locally (a one-element slice of a sharded axis, a select of operands sharded apart).
Each function and layer of ``tests/mask_sites.py`` runs on an input split over 8 CPU
devices and over both axes of a 4 x 2 mesh, and must give what it gives on the
unsharded input; the modes (eager, ``jit`` with a static and a run-time rate,
differentiated) run as ``_cases`` lays out.
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


# Each site runs under ``jit``, and in some of the other modes by its place in its
# group (the functions, the Linen layers, the NNX layers), rotated so that each mode
# runs on a share of every group. A mode exercises a path every site shares: eagerly,
# the library's jitted draw runs on the sharded array as under ``jit``; a run-time rate
# is a replicated scalar in the threshold; differentiated, the backward pass draws the
# mask again. A function runs with a run-time rate or eagerly in turn, and
# differentiated (its own backward rule). A layer is thin over the function it calls:
# of the Linen and NNX forms of a layer, one runs one of the three in turn (eagerly
# where it lacks that one), the other under ``jit`` alone. A recurrent layer (its own
# loop) runs every mode.
#
# The fast suite runs a share of these, the slow suite the rest. Of a layer, the form
# whose turn it is; of a recurrent layer, that form under ``jit`` alone (its two forms
# call one functional core), and MaskedRNN with zoneout only inside Bidirectional,
# whose two halves it is. A function runs differentiated at every other place (each
# backward pass draws its mask again alike), an attention function always (its
# backward pass is its own, on the 4 x 2 mesh too); eagerly, the first _EAGER_FAST
# functions whose turn that is. Where a site's turn (a run-time rate, or eagerly) runs
# fast, its ``jit`` case is slow: a run-time rate is under ``jit``, eagerly the draw is
# the library's jitted one, and a static rate, a constant in the threshold, is in every
# other site's ``jit`` case; an attention function runs both.
_FUNCTION_MODES = ("run-time rate", "eager")
_EAGER_FAST = 4  # of the first this many functions, those that run eagerly stay fast
_LAYER_MODES = ("eager", "run-time rate", "grad")


def _group(site: Site) -> str:
    """``"linen"`` or ``"nnx"`` for a layer's site, ``"function"`` for a function's."""
    return site.id.split(".")[1] if site.id.startswith("dropmask.") else "function"


def _attention_function(site: Site) -> bool:
    return _group(site) == "function" and "attention" in site.public


def _form_in_turn(site: Site, index: int) -> bool:
    """Whether the ``index``-th layer of its group is the form of its layer (Linen or
    NNX) that runs in the fast suite: the Linen form at the even places, the NNX form
    at the odd ones."""
    return not (index + (_group(site) == "nnx")) % 2


def _modes(site: Site, index: int) -> list[str]:
    """``site``'s modes, for the ``index``-th site of its group."""
    modes = ["eager", "jit"]
    modes += ["run-time rate"] if site.traced_rate else []
    modes += ["grad"] if site.differentiable else []
    group = _group(site)
    if site.slow:
        return modes
    if group == "function":
        turn = _FUNCTION_MODES[index % len(_FUNCTION_MODES)]
    elif not _form_in_turn(site, index):
        return ["jit"]  # the other form of this layer runs a mode in turn
    else:
        turn = _LAYER_MODES[index % len(_LAYER_MODES)]
    turn = turn if turn in modes else "eager"  # a mode the site does not have
    return [m for m in modes if m in ("jit", turn) or (m == "grad" and group == "function")]


def _turn_runs_fast(site: Site, index: int, modes: list[str]) -> bool:
    """Whether ``site`` (not an attention function's) runs a run-time rate or eagerly in
    the fast suite, in its turn."""
    if site.slow or _attention_function(site):
        return False
    if "run-time rate" in modes:
        return True
    eager_fast = _group(site) != "function" or index < _EAGER_FAST
    return "eager" in modes and eager_fast


def _meshes(site: Site, mode: str) -> tuple[str, ...]:
    """Each case runs on the 8-device mesh. On the 4 x 2 mesh, splitting a feature axis
    changes which part of the mask each device draws: every site with a ``spec_2d``
    runs there under ``jit``; eagerly, with a run-time rate or differentiated a part is
    drawn as under ``jit``. The attention functions run there differentiated too: their
    backward pass computes on the heads split over ``"model"``."""
    if site.spec_2d is None or mode not in ("jit", "grad"):
        return ("8",)
    if mode == "grad" and not _attention_function(site):
        return ("8",)
    return ("8", "4x2")


def _cases() -> list[Any]:
    cases = []
    index = {"function": 0, "linen": 0, "nnx": 0}
    for site in SITES:
        group = _group(site)
        place = index[group]
        modes = _modes(site, place)
        index[group] += 1
        for mode in modes:
            marks = []
            if site.slow and (mode != "jit" or not _form_in_turn(site, place)):
                # A recurrent layer: under jit, in the form whose turn it is.
                marks.append(pytest.mark.slow)
            elif site.slow and site.id.endswith("MaskedRNN, zoneout"):
                marks.append(pytest.mark.slow)  # inside Bidirectional's case
            if group == "function" and mode == "eager" and place >= _EAGER_FAST:
                # Eagerly every function's draw is the library's jitted one (as under
                # jit): the first functions that run it do so in the fast suite.
                marks.append(pytest.mark.slow)
            if group == "function" and mode == "grad" and place % 2:
                if not _attention_function(site):
                    # Differentiated, a function's backward pass draws its mask again
                    # as the others' do: those at the even places run it fast.
                    marks.append(pytest.mark.slow)
            if mode == "jit" and _turn_runs_fast(site, place, modes):
                marks.append(pytest.mark.slow)  # its turn runs the draw under jit
            if group != "function" and modes == ["jit"]:
                # Of a layer's Linen and NNX fronts, the one that runs a mode in turn is
                # the fast suite's; this one, thin over the same function, is slow.
                marks.append(pytest.mark.slow)
            meshes = _meshes(site, mode)
            if len(meshes) > 1 and (group != "function" or mode == "jit"):
                # A layer splits its input as the function it calls does, and a function
                # under jit as differentiated: the fast suite runs these on the 8-device
                # mesh, the slow one on the 4 x 2 mesh too (the attention functions'
                # backward passes on 4 x 2 stay fast).
                split = [(meshes[:1], marks), (meshes[1:], [*marks, pytest.mark.slow])]
            else:
                split = [(meshes, marks)]
            for kinds, kind_marks in split:
                case_id = f"{site.id}-{mode}-{'+'.join(kinds)}"
                cases.append(pytest.param(site, mode, kinds, marks=kind_marks, id=case_id))
    return cases


@pytest.mark.parametrize(("site", "mode", "mesh_kinds"), _cases())
def test_a_mask_drawer_gives_the_unsharded_result_under_explicit_sharding(site, mode, mesh_kinds):
    """The same program on the input split over the batch axis of 8 devices, or over
    both axes of a 4 x 2 mesh (``site.spec_2d``), gives the unsharded result: the same
    mask, and arithmetic that may round its last bits apart (XLA compiles each
    device's part of a loop on its own)."""
    x = site_input(site)
    run = _run(site, mode)
    want = run(x)
    for mesh_kind in mesh_kinds:
        mesh = _mesh(mesh_kind)
        spec = P("data") if mesh_kind == "8" else site.spec_2d
        with _set_mesh(mesh):
            got = run(jax.device_put(x, NamedSharding(mesh, spec)))
        jax.tree.map(
            lambda a, b, m=mesh_kind: np.testing.assert_allclose(
                a, b, rtol=1e-5, atol=1e-6, err_msg=f"{site.id} on mesh {m}"
            ),
            got,
            want,
        )


def test_every_public_mask_drawer_has_a_site():
    """A new public function that takes a key, or a new layer, needs a site in
    tests/mask_sites.py, so that these properties cover it."""
    covered = {site.public for site in SITES}
    assert public_mask_drawers() - covered == set()
    assert covered - public_mask_drawers() == set()  # no stale site


@pytest.mark.parametrize(
    "site",
    [
        # The first few in the fast suite (each function reshards its mask the same way).
        pytest.param(s, marks=[pytest.mark.slow] if i >= _EAGER_FAST else [], id=s.id)
        for i, s in enumerate(s for s in SITES if _group(s) == "function")
    ],
)
def test_jitted_without_set_mesh_a_mask_drawer_takes_the_mesh_from_its_input(site):
    """An input placed by ``NamedSharding`` on a mesh of explicit axes and jitted without
    ``jax.set_mesh``: JAX's own ops take the mesh from their operands, and so does each
    public function (its reshards and ``shard_map``s need one); the unsharded result."""
    x = site_input(site)
    want = _run(site, "jit")(x)
    mesh = _mesh("8")
    got = _run(site, "jit")(jax.device_put(x, NamedSharding(mesh, P("data"))))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=site.id),
        got,
        want,
    )
