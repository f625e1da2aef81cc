"""Auditing Flax NNX models: the same checks as for Linen, on a clone of the model.

NNX has no method interceptor, so the audit clones the model (the caller's modules,
parameters and PRNG counters are left untouched) and gives each submodule of the
clone a recording subclass that observes its calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx

from .._checks import check_instance, is_concrete
from ._audit_report import AuditReport
from ._core import checked_step, model_report, step_report, trees_equal
from ._mode import nnx_mode
from ._sites import Recorder, watch_attention

if TYPE_CHECKING:
    from ..training import NnxTrainState

__all__ = ["audit_nnx", "audit_nnx_model", "audit_nnx_step"]


def _streams(module: nnx.Module) -> list[nnx.RngStream]:
    """The PRNG streams a module holds directly (not through its submodules)."""
    found = []
    for value in vars(module).values():
        if isinstance(value, nnx.RngStream):
            found.append(value)
        elif isinstance(value, nnx.Rngs):
            found.extend(v for v in vars(value).values() if isinstance(v, nnx.RngStream))
    return found


def _counts(module: nnx.Module) -> list[jax.Array]:
    """The draw counters of the module's own streams, as held now."""
    return [stream.count[...] for stream in _streams(module)]


def _drew(before: list[jax.Array], after: list[jax.Array]) -> bool:
    """Whether a stream advanced between two snapshots of its counters.

    Inside ``nnx.scan`` or ``nnx.vmap`` the counters are tracers whose values are not
    known while the call is traced; a draw stores a new counter array, so there a
    counter that is not the same object means a draw.
    """
    return len(before) != len(after) or any(
        not np.array_equal(a, b) if is_concrete(a) and is_concrete(b) else a is not b
        for a, b in zip(before, after, strict=True)
    )


@functools.cache
def _recording_class(cls: type) -> type:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder, path = vars(self)["_dropmask_audit"]
        before = _counts(self)
        with watch_attention(self) as attention:
            out = cls.__call__(self, *args, **kwargs)
        recorder.observe(self, path, args, kwargs, out, _drew(before, _counts(self)), attention)
        return out

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})


def _recording_clone(model: nnx.Module, rec: Recorder) -> nnx.Module:
    """A clone of ``model`` whose every submodule reports its calls to ``rec``."""
    clone = nnx.clone(model)
    for parts, module in nnx.iter_modules(clone):
        path = "/".join(str(p) for p in parts) or type(module).__name__
        vars(module)["_dropmask_audit"] = (rec, path)
        module.__class__ = _recording_class(type(module))
    return clone


def audit_nnx_model(
    model: nnx.Module,
    *args: Any,
    train_kwargs: Mapping[str, Any] | None = None,
    eval_kwargs: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> AuditReport:
    """The NNX counterpart of :func:`audit_model`, run on a clone of ``model``.

    The clone is called twice after ``.eval()`` and twice after ``.train()``; its PRNG
    streams advance between the calls, so a site whose mask stays the same ignores
    its stream. ``model`` itself is not called and its PRNG counters do not move.
    Layers stacked with ``nnx.vmap`` and applied with ``nnx.scan`` are recorded once
    per iteration, so a stack whose layers share one dropout key is reported as
    ``same-mask-across-iterations``.

    Args:
      model: an ``nnx.Module`` called as ``model(*args, **kwargs)``.
      *args: positional inputs, e.g. ``x: float32[batch, features]``.
      train_kwargs: extra keyword arguments for the training calls (default none).
      eval_kwargs: extra keyword arguments for the evaluation calls (default none).
      **kwargs: keyword arguments of every call.

    Returns:
      An :class:`AuditReport`.

    Raises:
      DropmaskTypeError: ``model`` is not an ``nnx.Module``.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask.audit import audit_nnx_model
      >>> class MLP(nnx.Module):
      ...     def __init__(self, rngs):
      ...         self.linear = nnx.Linear(4, 64, rngs=rngs)
      ...         self.dropout = nnx.Dropout(0.5, rngs=rngs)
      ...     def __call__(self, x):
      ...         return self.dropout(self.linear(x))
      >>> audit_nnx_model(MLP(nnx.Rngs(0, dropout=1)), jnp.ones((8, 4))).ok
      True
    """
    check_instance(
        model,
        nnx.Module,
        caller="audit_nnx_model",
        name="model",
        what="an nnx.Module",
        fix="For a Linen module use dropmask.audit.audit_model(model, variables, *args).",
    )
    rec = Recorder()
    clone = _recording_clone(model, rec)
    outputs = {}
    for phase, mode, extra in (
        ("eval0", "eval", eval_kwargs),
        ("eval1", "eval", eval_kwargs),
        ("train0", "train", train_kwargs),
        ("train1", "train", train_kwargs),
    ):
        getattr(clone, mode)()
        rec.begin(phase)
        outputs[phase] = clone(*args, **{**kwargs, **(extra or {})})
    report = model_report(rec, trees_equal(outputs["eval0"], outputs["eval1"]), nnx_mode())
    # Between the two training calls the streams advanced: equal masks mean a fixed key,
    # or a stream broadcast into a transform that drops its counter's advance.
    in_transform = {
        f.path
        for f in report.findings
        if f.code in ("same-mask-across-iterations", "same-mask-across-vmap")
    }
    return AuditReport(
        report.sites,
        tuple(
            f
            if f.code != "mask-ignores-key"
            else type(f)(
                "same-mask-across-steps",
                f.path,
                "draws the same mask on consecutive calls: its stream is broadcast into an "
                "nnx.scan or nnx.vmap, which drops its counter's advance, so every call "
                "starts from the same count. Fix the broadcast as the finding above says.",
            )
            if f.path in in_transform
            else type(f)(
                "same-mask-across-steps",
                f.path,
                "draws the same mask on consecutive calls although its PRNG stream advanced: "
                "it uses a fixed key. Draw from the module's stream (rngs.dropout()) or pass "
                "rngs=... at call time.",
            )
            for f in report.findings
        ),
    )


def audit_nnx_step(
    train_step: Callable[..., Any], state: NnxTrainState, batches: Iterable[Any]
) -> AuditReport:
    """The NNX counterpart of :func:`audit_step`, for a step over an ``NnxTrainState``.

    The step runs as given (plain, ``jax.jit`` or ``nnx.jit``) on a copy of ``state``
    whose graph definition is that of a recording clone of its model, so every model
    the step rebuilds with ``state.model(...)`` reports its dropout sites. Each site's
    mask must differ between consecutive steps, from every other site's mask in a
    step and between the iterations of an ``nnx.scan``, drop at its rate, and not be
    shared along the batch axis.

    Args:
      train_step: ``(state, batch) -> state`` or ``-> (state, ...)``.
      state: the :class:`~dropmask.training.NnxTrainState` the steps start from.
      batches: at least two batches; one step runs per batch.

    Returns:
      An :class:`AuditReport` over the sites the steps called.

    Raises:
      DropmaskTypeError: ``state`` is not an ``NnxTrainState``, or ``train_step`` is
        not callable.
      DropmaskValueError: fewer than two batches.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> from flax import nnx
      >>> from dropmask.audit import audit_nnx_step
      >>> from dropmask.training import NnxTrainState
      >>> rngs = nnx.Rngs(0, dropout=1)
      >>> model = nnx.Sequential(nnx.Linear(4, 8, rngs=rngs), nnx.Dropout(0.5, rngs=rngs))
      >>> state = NnxTrainState.create(model=model, tx=optax.sgd(0.1), key=jax.random.key(2))
      >>> def step(state, x):
      ...     grads = jax.grad(lambda p: jnp.mean(state.model(p)(x) ** 2))(state.params)
      ...     return state.apply_gradients(grads=grads)
      >>> audit_nnx_step(step, state, [jnp.ones((8, 4))] * 2).ok
      True
    """
    from ..training import NnxTrainState

    check_instance(
        state,
        NnxTrainState,
        caller="audit_nnx_step",
        name="state",
        what="a dropmask.training.NnxTrainState",
        fix="For a Linen TrainState use audit_step.",
    )
    batches = checked_step(train_step, batches, caller="audit_nnx_step")
    rec = Recorder()
    clone = _recording_clone(state.model(training=None), rec)
    graphdef, _, _, _ = nnx.split(clone, nnx.Param, nnx.RngState, ...)
    state = state.replace(graphdef=graphdef)
    phases = [f"step{t}" for t in range(len(batches))]
    for phase, batch in zip(phases, batches, strict=True):
        rec.begin(phase)
        result = train_step(state, batch)
        jax.block_until_ready(result)
        jax.effects_barrier()
        state = result[0] if type(result) is tuple else result
    return step_report(rec, phases, nnx_mode())


audit_nnx = audit_nnx_model
"""Deprecated alias of :func:`audit_nnx_model` (the same function); use ``audit_nnx_model``."""
