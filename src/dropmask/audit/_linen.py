"""Auditing Flax Linen models and train steps by intercepting every module call.

Nothing here changes the model, its variables or the train state: calls run under
``flax.linen.intercept_methods``, which observes each module's inputs and outputs, and
the train step runs on copies of the given state and batches, which it may donate.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp

from .._checks import check_instance
from .._errors import DropmaskTypeError, MissingKeyError, user_error
from ..linen import swapped
from . import _mode
from ._audit_report import AuditReport
from ._core import checked_step, model_report, step_report, trees_equal
from ._sites import Recorder, watch_attention

__all__ = ["audit_model", "audit_step"]


def _counts(scope: Any) -> dict[str, int]:
    """The scope's own per-stream draw counters (children keep theirs separately)."""
    return {k: v for k, v in scope.rng_counters.items() if isinstance(k, str)}


# Part of JAX's tracing and compilation cache key. Under a value of its own an audit
# never reuses a program the caller compiled (whose module calls cannot be observed),
# and its instrumented programs never serve the caller's later calls. Each step audit
# takes a new value, so the step and every jitted function it calls are traced and
# observed afresh. Model audits run op by op, re-running every module call, and share
# one value so that the operations' compilations are reused.
# JAX versions without user contexts get the same separation by clearing its caches.
_AUDIT_CONTEXT = jax.make_user_context(None) if hasattr(jax, "make_user_context") else None
_step_audits = itertools.count(1)


@contextlib.contextmanager
def _separate_traces(fresh: bool) -> Iterator[None]:
    if _AUDIT_CONTEXT is not None:
        with _AUDIT_CONTEXT(next(_step_audits) if fresh else 0):
            yield
        return
    jax.clear_caches()
    try:
        yield
    finally:
        jax.clear_caches()


@contextlib.contextmanager
def _recording(
    recorder: Recorder, roots: list[tuple[Any, dict[str, Any]]], *, fresh: bool
) -> Iterator[None]:
    """Observes every module call; ``roots`` collects each top-level call's module and kwargs.

    ``fresh``: trace in a cache context no earlier call used (see ``_separate_traces``).
    """

    def interceptor(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        scope = getattr(module, "scope", None)
        if context.method_name != "__call__" or scope is None or swapped(module):
            # A swapped module's call is observed where dropmask's runs in its place.
            return next_fun(*args, **kwargs)
        if not scope.path:
            roots.append((module, dict(kwargs)))
        before = _counts(scope)
        with watch_attention(module) as attention:
            out = next_fun(*args, **kwargs)
        drew = _counts(scope) != before
        path = "/".join(str(p) for p in scope.path) or type(module).__name__
        recorder.observe(module, path, tuple(args), kwargs, out, drew, attention)
        return out

    with _separate_traces(fresh), nn.intercept_methods(interceptor):
        yield


def _other_rngs(rngs: Mapping[str, Any]) -> dict[str, Any]:
    return {name: jax.random.fold_in(key, 1) for name, key in rngs.items()}


def _check_rngs(rngs: Any) -> dict[str, Any]:
    if rngs is None:
        return {"dropout": jax.random.key(0)}
    if not isinstance(rngs, Mapping) or not rngs:
        raise user_error(
            DropmaskTypeError,
            f"rngs must be a non-empty mapping of stream name to PRNG key, got {rngs!r}",
            "Pass e.g. rngs={'dropout': jax.random.key(0)}.",
            caller=None,
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
      train_kwargs: keyword arguments that select training. Default: none with
        ``eval_model``; else ``{'training': True}``, ``{'train': True}`` or
        ``{'deterministic': False}``, after the parameter the applied method has.
      eval_kwargs: keyword arguments that select evaluation; default as for
        ``train_kwargs``, with the opposite value.
      rngs: ``{stream: key}`` for training; default ``{'dropout': jax.random.key(0)}``.
      method: passed to ``model.apply``.
      eval_model: the module applied in evaluation, for models whose mode is a
        field rather than a call argument, as in Flax's WMT example
        (``Transformer(config.replace(deterministic=True))``). Default: ``model``.
      **kwargs: further keyword arguments of every call.

    Returns:
      An :class:`AuditReport`; ``report.ok`` when nothing was found.

    Raises:
      DropmaskTypeError: ``model`` is not a Linen module or ``rngs`` is not a mapping.
      DropmaskValueError: no mode keyword is given or found in the method's signature,
        and no ``eval_model``.
      MissingKeyError: the model draws from a PRNG stream ``rngs`` has no key for.

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
        check_instance(
            module,
            nn.Module,
            caller="audit_model",
            name=name,
            what="a flax.linen.Module",
            fix="For an nnx.Module use dropmask.audit.audit_nnx_model(model, *args).",
        )
    modules = {"eval": model if eval_model is None else eval_model, "train": model}
    rngs_a = _check_rngs(rngs)
    rngs_b = _other_rngs(rngs_a)
    train, evaluate, mode = _modes(model, method, eval_model, train_kwargs, eval_kwargs)
    rec = Recorder()
    outputs = {}
    runs = (("eval0", rngs_a), ("eval1", rngs_b), ("train0", rngs_a), ("train1", rngs_b))
    calls = {"eval": {**kwargs, **evaluate}, "train": {**kwargs, **train}}
    with _recording(rec, [], fresh=False):
        for phase, keys in runs:
            rec.begin(phase)
            module, call = modules[phase[:-1]], calls[phase[:-1]]
            try:
                outputs[phase] = module.apply(variables, *args, rngs=keys, method=method, **call)
            except flax.errors.InvalidRngError as err:
                mode_name = "training" if phase.startswith("train") else "evaluation"
                raise _missing_stream(err, rngs_a, mode_name) from None
            jax.block_until_ready(outputs[phase])
            jax.effects_barrier()
    return model_report(rec, trees_equal(outputs["eval0"], outputs["eval1"]), mode)


def _missing_stream(err: Exception, rngs: Mapping[str, Any], mode: str) -> MissingKeyError:
    """Flax's missing-stream error, in dropmask's words: the stream, the rngs, the fix."""
    found = re.search(r'needs PRNG for "([^"]+)"', str(err))
    stream = found.group(1) if found else "(unnamed)"
    example = ", ".join([*(f"{n!r}: jax.random.key({i})" for i, n in enumerate(rngs)), ""])
    return MissingKeyError(
        f"audit_model: the model draws from the PRNG stream {stream!r} in {mode}, but rngs "
        f"has no key for it (rngs has {sorted(rngs)!r}). Pass a key for every stream the "
        f"model draws from, e.g. rngs={{{example}{stream!r}: jax.random.key({len(rngs)})}}."
    )


def _modes(
    model: nn.Module,
    method: Callable[..., Any] | str | None,
    eval_model: nn.Module | None,
    train_kwargs: Mapping[str, Any] | None,
    eval_kwargs: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any], _mode.Mode]:
    """Train and eval call arguments, and the mode they select, from what was given.

    Defaults: none with ``eval_model`` (a config field selects the mode); else the
    ``training``, ``train`` or ``deterministic`` parameter of the applied method.
    """
    if (train_kwargs is None) != (eval_kwargs is None) and eval_model is None:
        fn = getattr(model, method) if isinstance(method, str) else method or model.__call__
        train, evaluate, _ = _mode.from_signature(fn, "audit_model")
        train_kwargs = train if train_kwargs is None else train_kwargs
        eval_kwargs = evaluate if eval_kwargs is None else eval_kwargs
    if train_kwargs is not None or eval_kwargs is not None:
        train, evaluate = dict(train_kwargs or {}), dict(eval_kwargs or {})
        given = _mode.from_call(evaluate, None)
        if given.kind == "keyword":
            return (
                train,
                evaluate,
                _mode.Mode("keyword", given.name, *_values(given, train, evaluate)),
            )
        if eval_model is not None:
            return train, evaluate, _mode.from_models(model, eval_model)
        return train, evaluate, _mode.unknown()
    if eval_model is not None:
        return {}, {}, _mode.from_models(model, eval_model)
    fn = getattr(model, method) if isinstance(method, str) else method or model.__call__
    return _mode.from_signature(fn, "audit_model")


def _values(
    mode: _mode.Mode, train: Mapping[str, Any], evaluate: Mapping[str, Any]
) -> tuple[Any, Any]:
    return train.get(mode.name, mode.train), evaluate.get(mode.name, mode.eval)


def _state_of(result: Any) -> Any:
    """Train steps return a new state, or a tuple whose first element is the state."""
    return result[0] if type(result) is tuple else result


def _copy(tree: Any) -> Any:
    """A copy of every array of ``tree``, placed as it was: a step may donate the copy.

    An array committed to devices (e.g. replicated for ``pmap``) is copied onto the same
    devices; an uncommitted one stays uncommitted, so ``pmap`` may still shard it.
    """

    def copy(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        if x.committed:
            return jax.device_put(x, x.sharding, may_alias=False)
        return jnp.array(x, copy=True)

    return jax.tree.map(copy, tree)


def audit_step(train_step: Callable[..., Any], state: Any, batches: Iterable[Any]) -> AuditReport:
    """Runs ``train_step(state, batch)`` over ``batches`` and checks each site's masks.

    Each site's mask must differ between consecutive steps, from every other site's
    mask in the same step and between iterations of a loop or ``nn.scan`` over one
    layer, drop at its configured rate, and not be shared along the batch axis.

    The step runs as given (plain, ``jax.jit`` or ``jax.pmap``, with the state and
    batches laid out as it expects) but traced afresh: a program compiled before the
    audit is not reused, and the audit's programs are never used by later calls. Each
    call gets a copy of the caller's state and batch, so a step that donates them
    (``donate_argnums``) leaves the caller's arrays valid.

    Args:
      train_step: ``(state, batch) -> state`` or ``-> (state, ...)``, plain,
        ``jax.jit``-ed or ``jax.pmap``-ed, that applies a Linen model.
      state: the initial train state (e.g. a ``TrainState`` with a ``key``), replicated
        over devices for a ``pmap``-ed step.
      batches: at least two batches; one step runs per batch.

    Returns:
      An :class:`AuditReport` over the sites the steps called.

    Raises:
      DropmaskValueError: fewer than two batches.
      DropmaskTypeError: ``train_step`` is not callable.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from dropmask.audit import audit_step
      >>> layer = nn.Dropout(0.5, deterministic=False)
      >>> def step(key, x):  # the state is a key, which this step forgets to advance
      ...     return key, layer.apply({}, x, rngs={"dropout": key})
      >>> audit_step(step, jax.random.key(0), [jnp.ones((8, 16))] * 2).codes
      {'same-mask-across-steps'}
    """
    batches = checked_step(train_step, batches, caller="audit_step")
    rec = Recorder()
    roots: list[tuple[Any, dict[str, Any]]] = []
    phases = [f"step{t}" for t in range(len(batches))]
    state = _copy(state)
    with _recording(rec, roots, fresh=True):
        for phase, batch in zip(phases, batches, strict=True):
            rec.begin(phase)
            result = train_step(state, _copy(batch))
            jax.block_until_ready(result)
            jax.effects_barrier()
            state = _state_of(result)
    return step_report(rec, phases, _step_mode(roots))


def _step_mode(roots: Sequence[tuple[Any, Mapping[str, Any]]]) -> _mode.Mode:
    """The mode as the step applies the model: its first top-level call's keyword or config."""
    for module, kwargs in roots:
        mode = _mode.from_call(kwargs, module)
        if mode.kind != "unknown":
            return mode
    return _mode.unknown()
