"""Auditing Flax Linen models and train steps by intercepting every module call.

Nothing here changes the model, its variables or the train state: calls run under
``flax.linen.intercept_methods``, which observes each module's inputs and outputs, and
the train step runs on the given state without donating it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from .._errors import DropmaskTypeError, DropmaskValueError
from . import _checks
from ._report import AuditReport, Finding
from ._sites import Recorder

__all__ = ["audit_model", "audit_step"]


def _counts(scope: Any) -> dict[str, int]:
    """The scope's own per-stream draw counters (children keep theirs separately)."""
    return {k: v for k, v in scope.rng_counters.items() if isinstance(k, str)}


@contextlib.contextmanager
def _recording(recorder: Recorder) -> Iterator[None]:
    def interceptor(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        scope = getattr(module, "scope", None)
        if context.method_name != "__call__" or scope is None:
            return next_fun(*args, **kwargs)
        before = _counts(scope)
        out = next_fun(*args, **kwargs)
        drew = _counts(scope) != before
        path = "/".join(str(p) for p in scope.path) or type(module).__name__
        recorder.observe(module, path, tuple(args), kwargs, out, drew)
        return out

    with nn.intercept_methods(interceptor):
        yield


def _other_rngs(rngs: Mapping[str, Any]) -> dict[str, Any]:
    return {name: jax.random.fold_in(key, 1) for name, key in rngs.items()}


def _trees_equal(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(la, lb, strict=True)
    )


def _check_rngs(rngs: Any) -> dict[str, Any]:
    if rngs is None:
        return {"dropout": jax.random.key(0)}
    if not isinstance(rngs, Mapping) or not rngs:
        raise DropmaskTypeError(
            f"rngs must be a non-empty mapping of stream name to PRNG key, got {rngs!r}. "
            "Pass e.g. rngs={'dropout': jax.random.key(0)}."
        )
    return dict(rngs)


def audit_model(
    model: nn.Module,
    variables: Mapping[str, Any],
    *args: Any,
    train_kwargs: Mapping[str, Any] | None = None,
    eval_kwargs: Mapping[str, Any] | None = None,
    rngs: Mapping[str, Any] | None = None,
    method: Callable[..., Any] | str | None = None,
    eval_model: nn.Module | None = None,
    **kwargs: Any,
) -> AuditReport:
    """Lists a Linen model's dropout sites and checks them in training and evaluation.

    The model is applied four times: in evaluation and in training, each with two
    different keys per stream. A site is any Flax or dropmask dropout layer, any
    module with ``rate``/``dropout_rate`` and ``deterministic`` fields, and any module
    that draws from a PRNG stream (``self.make_rng(...)``) during the call.

    Args:
      model: an unbound ``flax.linen.Module``.
      variables: its variables, e.g. ``model.init(...)``.
      *args: positional inputs of the call, e.g. ``x: float32[batch, features]``.
      train_kwargs: keyword arguments that select training; default
        ``{'training': True}`` as in the Flax dropout guide.
      eval_kwargs: keyword arguments that select evaluation; default
        ``{'training': False}``.
      rngs: ``{stream: key}`` for training; default ``{'dropout': jax.random.key(0)}``.
      method: passed to ``model.apply``.
      eval_model: the module applied in evaluation, for models whose mode is a
        field rather than a call argument, as in Flax's WMT example
        (``Transformer(config.replace(deterministic=True))``); pass
        ``train_kwargs={}, eval_kwargs={}`` with it. Default: ``model``.
      **kwargs: further keyword arguments of every call.

    Returns:
      An :class:`AuditReport`; ``report.ok`` when nothing was found.

    Raises:
      DropmaskTypeError: ``model`` is not a Linen module or ``rngs`` is not a mapping.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from dropmask.audit import audit_model
      >>> class MLP(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x, training: bool):
      ...         x = nn.Dense(64)(x)
      ...         return nn.Dropout(0.5, deterministic=not training)(x)
      >>> x = jnp.ones((8, 4))
      >>> variables = MLP().init(jax.random.key(0), x, training=False)
      >>> audit_model(MLP(), variables, x).ok
      True
    """
    given = {"model": model} if eval_model is None else {"model": model, "eval_model": eval_model}
    for name, module in given.items():
        if not isinstance(module, nn.Module):
            raise DropmaskTypeError(
                f"audit_model: {name} must be a flax.linen.Module, got "
                f"{type(module).__name__}. For an nnx.Module use "
                "dropmask.audit.audit_nnx(model, *args)."
            )
    modules = {"eval": model if eval_model is None else eval_model, "train": model}
    rngs_a = _check_rngs(rngs)
    rngs_b = _other_rngs(rngs_a)
    train = dict(train_kwargs if train_kwargs is not None else {"training": True})
    evaluate = dict(eval_kwargs if eval_kwargs is not None else {"training": False})
    rec = Recorder()
    outputs = {}
    runs = (
        ("eval0", evaluate, rngs_a),
        ("eval1", evaluate, rngs_b),
        ("train0", train, rngs_a),
        ("train1", train, rngs_b),
    )
    with _recording(rec):
        for phase, mode, keys in runs:
            rec.begin(phase)
            call = {**kwargs, **mode}
            module = modules[phase[:-1]]
            outputs[phase] = module.apply(variables, *args, rngs=keys, method=method, **call)
            jax.block_until_ready(outputs[phase])
            jax.effects_barrier()
    flag = ", ".join(f"{k}={v!r}" for k, v in evaluate.items())
    if eval_model is not None:
        flag = "eval_model's config" + (f" and {flag}" if flag else "")
    flag = flag or "its evaluation arguments"
    return _model_report(rec, _trees_equal(outputs["eval0"], outputs["eval1"]), flag)


def _model_report(rec: Recorder, eval_equal: bool, flag: str) -> AuditReport:
    evals = [rec.by_phase("eval0"), rec.by_phase("eval1")]
    train0, train1 = rec.by_phase("train0"), rec.by_phase("train1")
    trained = {n: s for n, s in rec.sites.items() if n in train0 or n in train1}
    if not rec.sites:
        missing = Finding(
            "no-dropout-sites",
            "",
            "no dropout layer and no module drawing from a PRNG stream was called. Add "
            "dropout, or check that the model is the one you train.",
        )
        return AuditReport((), (missing,))
    both = {n: train0.get(n, []) + train1.get(n, []) for n in trained}
    findings = [
        *_checks.eval_findings(rec.sites, rec.drew, ["eval0", "eval1"], evals, eval_equal, flag),
        *_checks.site_findings(trained, both),
        *_checks.across_sites(trained, train0),
        *_checks.ignores_key(trained, train0, train1),
    ]
    sites = _checks.summarize(trained or rec.sites, both)
    return AuditReport(tuple(sites), tuple(dict.fromkeys(findings)))


def _state_of(result: Any) -> Any:
    """Train steps return a new state, or a tuple whose first element is the state."""
    return result[0] if type(result) is tuple else result


def audit_step(train_step: Callable[..., Any], state: Any, batches: Iterable[Any]) -> AuditReport:
    """Runs ``train_step(state, batch)`` over ``batches`` and checks each site's masks.

    Each site's mask must differ between consecutive steps and from every other
    site's mask in the same step, drop at its configured rate, and not be shared along
    the batch axis. A jitted ``train_step`` is traced afresh (its compiled cache is
    not reused) and never donates ``state``: the caller's state stays valid.

    Args:
      train_step: ``(state, batch) -> state`` or ``-> (state, ...)``, plain or
        ``jax.jit``-ed, that applies a Linen model.
      state: the initial train state (e.g. a ``TrainState`` with a ``key``).
      batches: at least two batches; one step runs per batch.

    Returns:
      An :class:`AuditReport` over the sites the steps called.

    Raises:
      DropmaskValueError: fewer than two batches.
      DropmaskTypeError: ``train_step`` is not callable.
    """
    if not callable(train_step):
        raise DropmaskTypeError(
            f"train_step must be callable as train_step(state, batch), got "
            f"{type(train_step).__name__}."
        )
    batches = list(batches)
    if len(batches) < 2:
        raise DropmaskValueError(
            f"audit_step needs at least 2 batches to compare masks between steps, got "
            f"{len(batches)}. Pass e.g. [batch, batch, batch]."
        )
    inner = getattr(train_step, "__wrapped__", train_step)

    def fresh(state: Any, batch: Any) -> Any:
        return inner(state, batch)

    step = jax.jit(fresh) if hasattr(train_step, "lower") else fresh
    rec = Recorder()
    phases = [f"step{t}" for t in range(len(batches))]
    with _recording(rec):
        for phase, batch in zip(phases, batches, strict=True):
            rec.begin(phase)
            result = step(state, batch)
            jax.block_until_ready(result)
            jax.effects_barrier()
            state = _state_of(result)
    return _step_report(rec, phases)


def _step_report(rec: Recorder, phases: list[str]) -> AuditReport:
    if not rec.sites:
        missing = Finding(
            "no-dropout-sites",
            "",
            "the train step called no dropout layer. Check that it applies the model "
            "with training=True (and that the model has dropout). Pass the jitted or plain "
            "step itself, not a wrapper around an already-compiled one: its compiled "
            "program cannot be observed.",
        )
        return AuditReport((), (missing,))
    steps = [rec.by_phase(p) for p in phases]
    merged: dict[str, list[Any]] = {}
    for by_site in steps:
        for name, obs in by_site.items():
            merged.setdefault(name, []).extend(obs)
    findings = _checks.site_findings(rec.sites, merged)
    for by_site in steps:
        findings.extend(_checks.across_sites(rec.sites, by_site))
    findings.extend(_checks.across_steps(rec.sites, steps))
    sites = _checks.summarize(rec.sites, merged)
    return AuditReport(tuple(sites), tuple(dict.fromkeys(findings)))
