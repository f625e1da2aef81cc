"""Where the TPU kernels run: the one choice both kernel families read.

The dropout kernel (``_tpu_mask``) and the attention kernels (``_attention._flash_tpu``)
are traced where :func:`tpu_kernels_run` says: in a process with a TPU, whatever the
number of devices. Whether a kernel then runs is decided when the program is lowered,
for the platform it is lowered for: a TPU gets the kernel, any other platform XLA's
path (the same bits), so one process can compute on its CPU and its TPU, and a program
exported for several platforms lowers for each. ``dropmask.testing.tpu_kernels``
(:func:`enabled`) overrides the choice; off a TPU the kernels then run in Pallas's TPU
interpreter (:func:`tpu_interpret`).

Many devices. A Mosaic kernel is one device's program: XLA cannot split it. So a kernel
runs on each device's block inside ``shard_map`` (the user's, or the one dropmask wraps
around a value whose type carries its sharding, under a mesh of explicit axes), and the
mask stays the unsharded one because each block draws at its global place. In a program
XLA partitions itself (``jax.jit`` over a mesh of automatic axes), a value's sharding is
not known when it is traced, and the hook that would tell it later
(``custom_partitioning``) does not run on TPUs; there (:func:`auto_partitioned`, and
:func:`mosaic_lowers_here` when lowered) the XLA path draws the same mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
from jax._src import sharding_impls  # the lowering contexts' types (no public name)
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir

__all__ = [
    "KernelLoweringError",
    "auto_partitioned",
    "enabled",
    "mosaic_lowers_here",
    "tpu_interpret",
    "tpu_kernels_run",
    "tpu_only",
]


# The choice :func:`enabled` makes, as a context JAX's caches key on (as they key on
# ``jax.default_matmul_precision``): a function traced inside ``enabled(True)`` and
# outside it is two cache entries, and nothing is cleared. JAX versions without
# ``jax.make_user_context`` get the same separation by clearing JAX's caches where the
# choice changes.
_STATE = jax.make_user_context(None) if hasattr(jax, "make_user_context") else None
_CHOSEN: list[bool] = []  # without ``_STATE``: each ``enabled`` entry's choice, innermost last


def tpu_kernels_run() -> bool:
    """Whether the TPU kernels are traced (the dropout kernel, and the attention kernels
    of ``_attention._flash_tpu``): the innermost :func:`enabled`'s choice, else where
    JAX's default backend is a TPU, with any number of devices. Which platform then runs
    a kernel is decided when the program is lowered (see the module's docstring)."""
    chosen = _STATE.value if _STATE is not None else (_CHOSEN[-1] if _CHOSEN else None)
    return jax.default_backend() == "tpu" if chosen is None else chosen


def auto_partitioned(x: Any) -> bool:
    """Whether ``x`` is traced in a program XLA partitions itself over several devices:
    its type's mesh has an automatic axis of more than one device (``jax.jit`` over
    arrays sharded on a mesh of automatic axes; not inside ``shard_map`` over all of a
    mesh's axes, nor under a mesh of explicit axes). A kernel cannot serve it."""
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    if mesh is None or not getattr(mesh, "axis_names", ()):
        return False
    auto = jax.sharding.AxisType.Auto
    return any(
        kind == auto and size > 1
        for kind, size in zip(mesh.axis_types, mesh.axis_sizes, strict=True)
    )


def mosaic_lowers_here(ctx: Any) -> bool:
    """Whether a Mosaic kernel can be lowered in lowering context ``ctx``: a program of
    one device, or inside ``shard_map`` over all of its mesh's axes. The same test JAX's
    TPU custom call makes before it refuses ("Mosaic kernels cannot be automatically
    partitioned")."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, sharding_impls.SPMDAxisContext):
        manual = axis_context.manual_axes | set(axis_context.mesh.manual_axes)
        return not axis_context.manual_axes or manual == frozenset(axis_context.mesh.axis_names)
    if isinstance(axis_context, sharding_impls.ShardingContext):
        return axis_context.num_devices == 1
    return True


def tpu_interpret() -> bool:
    """Whether the kernel runs in Pallas's TPU interpreter: off a TPU. Decided by the
    default backend, as ``default_path`` is."""
    return jax.extend.backend.get_backend().platform != "tpu"


@contextlib.contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Draws dropout's masks by the kernel (``on``) or by XLA's path (not ``on``) while
    tracing inside it, whatever the backend and devices: the kernel compiled on a TPU,
    in Pallas's TPU interpreter elsewhere (tests on a CPU). The choice is part of JAX's
    cache keys (``_STATE``); where this JAX has no user contexts, JAX's caches are
    cleared on entry and on exit where the choice changes there."""
    if _STATE is not None:
        with _STATE(on):
            yield
        return
    before = tpu_kernels_run()
    if on != before:
        jax.clear_caches()
    _CHOSEN.append(on)
    try:
        yield
    finally:
        _CHOSEN.pop()
        if tpu_kernels_run() != on:
            jax.clear_caches()


# --- code for a TPU alone, in a program lowered for several platforms ------------------

tpu_only_p = jex_core.Primitive("dropmask_tpu_only")
tpu_only_p.multiple_results = True


class KernelLoweringError(Exception):
    """A Pallas kernel that Mosaic fails to lower for a TPU; raised while tracing, so
    that the caller can take a path without it (:func:`tpu_only`'s ``check``)."""

    def __init__(self, name: str, cause: str) -> None:
        super().__init__(f"{name}: {cause}")
        self.name = name
        self.cause = cause


# Each kernel's lowering, tried once a process: (its name, its static description, its
# operands' shapes and dtypes) -> None where it lowers, else the first line of the error.
_LOWERED: dict[Any, str | None] = {}


def _lowering_error(check: tuple[str, Any], closed: Any, args: tuple[Any, ...]) -> str | None:
    """Lower ``closed`` for a TPU, as the program around it will be, once per kernel
    and shapes: None where Mosaic lowers it, else the error's first line. Inside a
    ``shard_map`` or under a mesh (the sharded kernels) it is not tried: the trial
    would need the mesh's context."""
    if any(not jax.typeof(a).sharding.mesh.empty for a in args):
        return None
    avals = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)
    key = (*check, tuple((a.shape, str(a.dtype)) for a in avals))
    if key not in _LOWERED:
        try:
            fun = jex_core.jaxpr_as_fun(closed)
            jax.jit(fun).trace(*avals).lower(lowering_platforms=("tpu",))
            _LOWERED[key] = None
        except Exception as err:  # noqa: BLE001 - any failure to lower is the answer
            lines = str(err).strip().splitlines()
            _LOWERED[key] = f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]
    return _LOWERED[key]


def tpu_only(fn: Callable[..., Any], *args: Any, check: tuple[str, Any] | None = None) -> Any:
    """``fn(*args)`` (a flat list of arrays out), lowered for a TPU alone.

    For the TPU branch of ``lax.platform_dependent``, whose code a program lowered for
    several platforms (``jax.export`` with ``platforms=("cpu", "tpu")``) still lowers
    for each: there a Mosaic kernel lowered for the CPU would raise. Lowered for a TPU
    this is ``fn``; for any other platform it is zeros of ``fn``'s output types, which
    the platform switch around it never reaches.

    ``check``: the kernel's name and a hashable description of everything static about
    it. ``fn`` is then lowered for a TPU once (per description and operand shapes, per
    process) while it is traced, and where Mosaic fails to lower it this raises
    :class:`KernelLoweringError` instead of leaving the failure to the program's
    lowering. A failure inside the TPU compiler's own passes (after lowering, when XLA
    compiles the program) is not seen here.
    """
    closed = jax.make_jaxpr(fn)(*args)
    if check is not None:
        cause = _lowering_error(check, closed, args)
        if cause is not None:
            raise KernelLoweringError(check[0], cause)
    return tpu_only_p.bind(*args, jaxpr=closed)


def _tpu_only_impl(*args: Any, jaxpr: Any) -> Any:
    """Called eagerly: compiled for the device the arguments are on."""
    return jax.jit(lambda *a: tpu_only_p.bind(*a, jaxpr=jaxpr))(*args)


def _tpu_only_abstract(*avals: Any, jaxpr: Any) -> Any:
    del avals
    return jaxpr.out_avals


def _tpu_only_lower_tpu(ctx: Any, *args: Any, jaxpr: Any) -> Any:
    return mlir.lower_fun(jex_core.jaxpr_as_fun(jaxpr), multiple_results=True)(ctx, *args)


def _tpu_only_lower_elsewhere(ctx: Any, *args: Any, jaxpr: Any) -> Any:
    zeros = lambda *_: [jnp.zeros(a.shape, a.dtype) for a in jaxpr.out_avals]  # noqa: E731
    return mlir.lower_fun(zeros, multiple_results=True)(ctx, *args)


def _tpu_only_batch(args: Any, dims: Any, *, jaxpr: Any) -> Any:
    body = jax.vmap(jex_core.jaxpr_as_fun(jaxpr), in_axes=tuple(dims))
    outs = tpu_only(body, *args)
    return outs, [0] * len(outs)


tpu_only_p.def_impl(_tpu_only_impl)
tpu_only_p.def_abstract_eval(_tpu_only_abstract)
mlir.register_lowering(tpu_only_p, _tpu_only_lower_elsewhere)
mlir.register_lowering(tpu_only_p, _tpu_only_lower_tpu, platform="tpu")
batching.primitive_batchers[tpu_only_p] = _tpu_only_batch
