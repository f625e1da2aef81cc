"""Dropout rates as functions of the training step or of depth.

Each returns a float32 JAX value that a layer takes as its ``rate``: a run-time rate,
so one compiled train step serves the whole schedule (a Python float would be a
compile-time constant, one program per value). ``step`` may be a Python int or a
traced integer such as ``state.step``; one known at trace time must be >= 0 and, as
every step boundary (``until``, ``start``), at most ``2**31 - 1``: steps are int32, as
``state.step`` is.

* :func:`early_dropout` and :func:`late_dropout` (Liu et al., 2023, "Dropout Reduces
  Underfitting"): dropout only before, or only from, a given step;
* :func:`linear_warmdown`: the paper's "early, linear" variant, from ``rate`` down to 0;
* :func:`depth_rates`: one rate per layer, rising with depth, by stochastic depth's
  rule (Huang et al., 2016) or timm's.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp

from ._checks import check_choice, check_int, check_rate, check_scalar, concrete_value
from ._errors import DropmaskTypeError, DropmaskValueError, user_error

__all__ = ["depth_rates", "early_dropout", "late_dropout", "linear_warmdown"]


# Steps are counted in int32, as ``TrainState.step`` is: a larger step or boundary would
# overflow the program's int32 (JAX raises an OverflowError naming no argument).
_MAX_STEP = 2**31 - 1


def _within_int32(value: int, name: str, caller: str) -> int:
    if value > _MAX_STEP:
        raise user_error(
            DropmaskValueError,
            f"{name} must be at most 2**31 - 1 = {_MAX_STEP} (steps are int32, as "
            f"state.step is), got {value}",
            "Count steps as state.step does; a schedule longer than that needs a rate of your own.",
            caller=caller,
        )
    return value


def _step(step: Any, caller: str) -> jax.Array:
    dtype = getattr(step, "dtype", None)
    is_int = isinstance(step, int | jnp.integer) and not isinstance(step, bool)
    if not is_int and not (dtype is not None and jnp.issubdtype(dtype, jnp.integer)):
        raise user_error(
            DropmaskTypeError,
            "step must be an integer (a Python int or an integer JAX scalar such as "
            f"state.step), got {step!r} of type {type(step).__name__}",
            caller=caller,
        )
    check_scalar(step, caller=caller, name="step", fix=" Pass one step.")
    value = concrete_value(step)
    if value is not None and value < 0:
        raise user_error(
            DropmaskValueError,
            f"step must be >= 0 (train steps taken), got {int(value)}",
            "Pass the step counted from 0, e.g. state.step.",
            caller=caller,
        )
    if value is not None:
        _within_int32(int(value), "step", caller)
    return jnp.asarray(step, jnp.int32)


def _rate(rate: Any, caller: str) -> jax.Array:
    check_rate(rate, caller=caller)
    return jnp.asarray(rate, jnp.float32)


def early_dropout(step: Any, rate: float | jax.Array, *, until: int) -> jax.Array:
    """``rate`` for steps before ``until``, 0 from then on (early dropout).

    Args:
      step: the current step (int or integer JAX scalar).
      rate: the dropout rate of the early phase.
      until: the first step without dropout (the paper's cutoff), a Python int >= 0.

    Returns:
      A float32 scalar.

    Example:
      >>> import dropmask
      >>> [round(float(dropmask.early_dropout(s, 0.1, until=2)), 3) for s in range(4)]
      [0.1, 0.1, 0.0, 0.0]
    """
    caller = "early_dropout"
    until = _within_int32(
        check_int(until, name="until", caller=caller, minimum=0, shape=True), "until", caller
    )
    return jnp.where(_step(step, caller) < until, _rate(rate, caller), jnp.float32(0))


def late_dropout(step: Any, rate: float | jax.Array, *, start: int) -> jax.Array:
    """0 for steps before ``start``, ``rate`` from then on (late dropout).

    Args:
      step: the current step.
      rate: the dropout rate of the late phase.
      start: the first step with dropout, a Python int >= 0.

    Returns:
      A float32 scalar.

    Example:
      >>> import dropmask
      >>> [round(float(dropmask.late_dropout(s, 0.1, start=2)), 3) for s in range(4)]
      [0.0, 0.0, 0.1, 0.1]
    """
    caller = "late_dropout"
    start = _within_int32(
        check_int(start, name="start", caller=caller, minimum=0, shape=True), "start", caller
    )
    return jnp.where(_step(step, caller) >= start, _rate(rate, caller), jnp.float32(0))


def linear_warmdown(step: Any, rate: float | jax.Array, *, until: int) -> jax.Array:
    """``rate * (1 - step / until)`` before ``until``, 0 from then on.

    Args:
      step: the current step.
      rate: the rate at step 0.
      until: the step where the rate reaches 0, a Python int >= 1.

    Returns:
      A float32 scalar.

    Example:
      >>> import dropmask
      >>> [round(float(dropmask.linear_warmdown(s, 0.2, until=4)), 3) for s in range(0, 6, 2)]
      [0.2, 0.1, 0.0]
    """
    caller = "linear_warmdown"
    until = _within_int32(
        check_int(until, name="until", caller=caller, minimum=1, shape=True), "until", caller
    )
    left = jnp.clip(until - _step(step, caller), 0, until).astype(jnp.float32)
    return _rate(rate, caller) * left / jnp.float32(until)


def depth_rates(
    rate: float | jax.Array, num_layers: int, *, rule: Literal["linear", "timm"] = "linear"
) -> jax.Array:
    """Per-layer rates that rise with depth to ``rate`` at the last layer.

    Args:
      rate: the last layer's rate.
      num_layers: how many layers, a Python int >= 1.
      rule: ``"linear"``, stochastic depth's rule: layer ``l`` (from 1) gets
        ``rate * l / num_layers``, so the first is already above 0. ``"timm"``: timm's
        ``linspace(0, rate, num_layers)``, the first layer 0.

    Returns:
      ``float32[num_layers]``; feed it to ``nn.scan`` / ``nnx.scan`` as a scanned
      input, or index it per layer.

    Raises:
      DropmaskValueError: ``num_layers < 1`` or an unknown ``rule``.

    Example:
      >>> import dropmask
      >>> [round(r, 3) for r in dropmask.depth_rates(0.2, 4).tolist()]
      [0.05, 0.1, 0.15, 0.2]
      >>> [round(r, 3) for r in dropmask.depth_rates(0.3, 4, rule="timm").tolist()]
      [0.0, 0.1, 0.2, 0.3]
    """
    caller = "depth_rates"
    num_layers = check_int(num_layers, name="num_layers", caller=caller, minimum=1, shape=True)
    r = _rate(rate, caller)
    check_choice(
        rule,
        ("linear", "timm"),
        caller=caller,
        name="rule",
        fix=" 'linear' is stochastic depth's l / L, 'timm' is linspace(0, rate, L).",
    )
    if rule == "linear":
        return r * jnp.arange(1, num_layers + 1, dtype=jnp.float32) / num_layers
    return r * jnp.linspace(0.0, 1.0, num_layers, dtype=jnp.float32)
