"""What an example hands to ``dropmask audit``: one dataclass, one function to run it."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flax import nnx

from .._checks import check_instance, check_int_at_least
from .._errors import DropmaskTypeError, DropmaskValueError, user_error
from .._workflow import Example, checked, locate, run_keys
from ._audit_report import AuditReport
from ._linen import audit_model, audit_step
from ._nnx import audit_nnx_model, audit_nnx_step

__all__ = ["AuditTarget", "audit_target", "load_target", "target_from_example"]


@dataclasses.dataclass(frozen=True)
class AuditTarget:
    """Everything needed to audit a model and its train step, Linen or NNX.

    :func:`target_from_example` builds one from a :class:`dropmask.training.Example`.

    Attributes:
      model: the ``flax.linen.Module``, or an ``nnx.Module`` (audited with
        :func:`audit_nnx_model`, and its step with :func:`audit_nnx_step`); None
        audits the train step alone.
      variables: a Linen model's variables (``{'params': ...}``); ``{}`` for NNX.
      args: positional inputs of one call, e.g. ``(images,)``.
      train_kwargs: keyword arguments selecting training, e.g. ``{'training': True}``;
        None: as :func:`audit_model` infers them (none with ``eval_model``, else the
        model's ``training``, ``train`` or ``deterministic`` parameter).
      eval_kwargs: keyword arguments selecting evaluation; None: inferred likewise.
      train_step: ``(state, batch) -> state | (state, ...)``; None skips the step audit.
      state: the train state the step starts from.
      batches: at least two batches for the step audit.
      eval_model: the module applied in evaluation when a config field, not a call
        argument, selects the mode (e.g. ``config.replace(deterministic=True)``);
        None: ``model`` with ``eval_kwargs``.

    Example:
      >>> import jax.numpy as jnp, flax.linen as nn
      >>> from dropmask.audit import AuditTarget
      >>> target = AuditTarget(model=nn.Dropout(0.5), variables={}, args=(jnp.ones((8, 16)),))
      >>> target.train_step is None  # the model alone is audited
      True
    """

    model: Any
    variables: Mapping[str, Any] | None
    args: tuple[Any, ...]
    train_kwargs: Mapping[str, Any] | None = None
    eval_kwargs: Mapping[str, Any] | None = None
    train_step: Callable[..., Any] | None = None
    state: Any = None
    batches: Sequence[Any] = ()
    eval_model: Any = None


def audit_target(target: AuditTarget) -> AuditReport:
    """:func:`audit_model` on the model, if given, then :func:`audit_step` on the step
    if given (:func:`audit_nnx_model` and :func:`audit_nnx_step` for an NNX model or
    state).

    Raises:
      DropmaskTypeError: ``target`` is not an :class:`AuditTarget`.
      DropmaskValueError: it has neither a model nor a train step.

    Example:
      >>> import jax.numpy as jnp, flax.linen as nn
      >>> from dropmask.audit import AuditTarget, audit_target
      >>> target = AuditTarget(model=nn.Dropout(0.5), variables={}, args=(jnp.ones((8, 16)),))
      >>> audit_target(target).ok
      True
    """
    if not isinstance(target, AuditTarget):
        raise user_error(
            DropmaskTypeError,
            f"expected a dropmask.audit.AuditTarget, got {type(target).__name__}",
            "An example's audit hook must return AuditTarget(model=..., variables=..., args=...).",
            caller=None,
        )
    if target.model is None and target.train_step is None:
        raise user_error(
            DropmaskValueError,
            "an AuditTarget needs a model or a train_step to audit, got neither",
            "Pass AuditTarget(model=..., variables=..., args=...) or train_step=, state=, "
            "batches=.",
            caller=None,
        )
    from ..training import NnxTrainState

    is_nnx = isinstance(target.model, nnx.Module) or isinstance(target.state, NnxTrainState)
    report = None
    if isinstance(target.model, nnx.Module):
        report = audit_nnx_model(
            target.model,
            *target.args,
            train_kwargs=target.train_kwargs,
            eval_kwargs=target.eval_kwargs,
        )
    elif target.model is not None:
        report = audit_model(
            target.model,
            target.variables or {},
            *target.args,
            train_kwargs=target.train_kwargs,
            eval_kwargs=target.eval_kwargs,
            eval_model=target.eval_model,
        )
    if target.train_step is not None:
        step_audit = audit_nnx_step if is_nnx else audit_step
        steps = step_audit(target.train_step, target.state, target.batches)
        report = steps if report is None else report.merged(steps)
    assert report is not None
    return report


def target_from_example(
    example: Any,
    config: Any = None,
    *,
    steps: int = 3,
    caller: str = "target_from_example",
    fn: str | None = None,
) -> AuditTarget:
    """The audit target of a :class:`dropmask.training.Example`: its model, step and batches.

    The state and ``steps`` batches are built as the training loop builds them (the
    same :func:`dropmask.training.run_keys` split), so the audit sees the masks a
    real run draws.

    Args:
      example: the example; with ``model_inputs`` and a Linen ``TrainState``
        (``apply_fn=model.apply``) or an ``NnxTrainState`` its model is audited, and
        its train step always.
      config: the config to build with; ``None``: ``example.get_tiny_config()`` (or
        ``get_config()`` when it has none).
      steps: train batches for the step audit (at least 2).
      caller: the caller's name, for messages.
      fn: deprecated alias of ``caller``; passing it warns.

    Returns:
      An :class:`AuditTarget`; without ``model_inputs`` (the model's inputs cannot be
      taken from a batch) its ``model`` is None and the train step alone is audited.

    Raises:
      DropmaskValueError: ``steps < 2``.
      DropmaskTypeError: ``example`` is not an ``Example``, or, with
        ``model_inputs``, its state's ``apply_fn`` is not a bound Linen ``apply``.

    Example:
      >>> from dropmask.audit import audit_target, target_from_example
      >>> from dropmask.examples.digits_nnx import train  # the bundled NNX example
      >>> target = target_from_example(train.example, steps=2)
      >>> len(target.batches), audit_target(target).ok
      (2, True)
    """
    from ..training import NnxTrainState

    if fn is not None:
        warnings.warn(
            "target_from_example: fn= is deprecated, pass caller= instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        caller = fn
    check_instance(
        example,
        Example,
        caller=caller,
        name="example",
        what="a dropmask.training.Example",
        fix="Pass the example to audit, e.g. train.example.",
    )
    steps = check_int_at_least(
        steps, 2, caller=caller, name="steps", why=" (masks are compared between steps)"
    )
    if config is None:
        config = (example.get_tiny_config or example.get_config)()
    data = example.load_data(config)
    data_key, params_key, dropout_key = run_keys(config.seed)
    state = example.create_state(config, data, params_key, dropout_key)
    batches = [example.train_batch(config, data, data_key, step) for step in range(steps)]
    step_only = AuditTarget(
        model=None,
        variables=None,
        args=(),
        train_step=example.train_step,
        state=state,
        batches=batches,
    )
    if example.model_inputs is None:
        return step_only
    if isinstance(state, NnxTrainState):
        return dataclasses.replace(
            step_only,
            model=state.model(training=None),
            variables={},
            args=tuple(example.model_inputs(batches[0])),
            train_kwargs=example.train_kwargs,
            eval_kwargs=example.eval_kwargs,
        )
    model = getattr(getattr(state, "apply_fn", None), "__self__", None)
    if model is None:
        raise user_error(
            DropmaskTypeError,
            f"example {example.name!r} must build its state with apply_fn=model.apply of a Linen "
            f"module, got {getattr(state, 'apply_fn', None)!r}, or with an NnxTrainState of an "
            "NNX model",
            caller=caller,
        )
    return dataclasses.replace(
        step_only,
        model=model,
        variables={"params": state.params},
        args=tuple(example.model_inputs(batches[0])),
        train_kwargs=example.train_kwargs,
        eval_kwargs=example.eval_kwargs,
        eval_model=None if example.eval_model is None else example.eval_model(model),
    )


def load_target(target: str) -> AuditTarget:
    """The audit target that ``target`` names, found as ``dropmask train`` finds examples.

    Args:
      target: a bundled example's name, a directory whose ``train.py`` defines
        ``example``, a ``.py`` file, or ``package.module:attribute``. What it names
        is an ``Example`` (audited by :func:`target_from_example`), an
        :class:`AuditTarget`, or a function returning one; a file may define
        ``audit_target()`` instead of ``example``.

    Raises:
      DropmaskValueError: the target cannot be found or imported.
      DropmaskTypeError: it names something else.
    """
    found = locate(target, attributes=("example", "audit_target"))
    value = found.value
    if isinstance(value, Example):
        return target_from_example(checked(value, found.where, found.file), caller="dropmask audit")
    if callable(value) and not isinstance(value, AuditTarget):
        value = value()
    if not isinstance(value, AuditTarget):
        raise user_error(
            DropmaskTypeError,
            f"{found.where} must be a dropmask.training.Example, an AuditTarget or a function "
            f"returning one, got {type(value).__name__}",
            "Define example = Example(...).",
            caller=None,
        )
    return value
