"""Linen ``MaskedRNN`` and ``Bidirectional``: any Flax cell over a padded batch.

The module turns its cell into a pure step (the cell's variables and this call's
keys closed over) and calls the functional core, :func:`dropmask._rnn.masked_rnn`;
zoneout and weight dropout are the core's too (:mod:`dropmask._rnn`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from .. import _dropout
from .._checks import check_key, check_rate, concrete_value
from .._errors import DropmaskValueError, MissingKeyError, user_error
from .._rnn import (
    FLAX_RECURRENT_KERNELS,
    carry_rates,
    check_carry,
    check_recurrent_kernels,
    check_rnn_args,
    check_zoneout_carry,
    concat_features,
    drop_recurrent_kernels,
    masked_rnn,
    recurrent_kernel_names,
    regularized_step,
    regularizer_keys,
    resolve_mask,
)

__all__ = ["Bidirectional", "MaskedRNN"]


class MaskedRNN(nn.Module):
    """Runs a Flax RNN cell over ``[batch, time, ...]`` inputs with padding.

    Like ``flax.linen.RNN(cell)(x, seq_lengths=...)``, with the padding handled by
    :func:`dropmask.masked_scan`: the carry is held through padded steps, so the
    final carry is each sequence's own (the initial carry for a sequence of length
    0, where Flax's returns the last padded step's), outputs are 0 at padding, and
    NaN or inf in padded inputs reach neither outputs nor gradients. Any mask works,
    not only right padding.

    Random streams: every stream given to ``apply`` except ``'params'`` (e.g.
    ``'dropout'``) reaches the cell with a fresh key per time step, so a dropout
    layer inside the cell draws a new mask at each step. The cell may not mutate
    variables (no ``batch_stats`` inside a cell).

    Recurrent regularizers (both off by default; both need ``deterministic``):
    ``zoneout`` keeps each unit of the carry at its previous value with probability
    ``zoneout`` at each training step and uses the expectation in evaluation
    (Krueger et al., 2017; see :func:`dropmask.zoneout`); ``weight_dropout`` drops
    elements of the cell's recurrent (hidden-to-hidden) kernels with one mask per call,
    the same at every time step, scaled by ``1/(1-rate)`` (DropConnect as in AWD-LSTM;
    identity in evaluation). Both draw from ``rng_collection`` once per call, after the
    cell's own streams. A padded step changes nothing under either: the carry is held.

    Attributes:
      cell: a Flax cell: ``cell(carry, x_t) -> (carry, y_t)`` with
        ``initialize_carry(key, input_shape)``, e.g. ``nn.LSTMCell(64)``.
      reverse: run each sequence from its last valid step to its first.
      keep_order: with ``reverse``, keep outputs aligned with their inputs; if False
        (Flax's default), output ``t`` is the step on input ``lengths - 1 - t``.
      return_carry: return ``(carry, outputs)`` instead of ``outputs``.
      unroll: passed to ``lax.scan``.
      zoneout: probability that a carry unit keeps its previous value: one rate, or
        one per carry leaf in ``jax.tree.leaves`` order (Flax's LSTM cells:
        ``(cell_rate, hidden_rate)``).
      weight_dropout: dropout rate on the recurrent kernels.
      recurrent_kernels: the name, or a tuple of the names, of the cell's
        hidden-to-hidden submodules whose ``kernel`` weight dropout masks; the default
        covers Flax's cells (``hi``, ``hf``, ``hg``, ``ho``, ``hr``, ``hz``, ``hn``,
        ``h``, ``dense_h``: those the cell lacks are skipped). A name given that is no
        submodule with a kernel, or a default that matches none, raises, naming the
        cell's submodules.
      deterministic: evaluation mode for the regularizers; may instead be passed at
        call time (exactly one of the two when a regularizer is on).
      rng_collection: the stream the regularizers draw from.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from dropmask import linen as dl
      >>> rnn = dl.MaskedRNN(nn.LSTMCell(4), return_carry=True)
      >>> x, lengths = jnp.ones((2, 5, 3)), jnp.array([5, 0])
      >>> params = rnn.init(jax.random.key(0), x, lengths=lengths)
      >>> (c, h), y = rnn.apply(params, x, lengths=lengths)
      >>> y.shape, bool(jnp.all(h[1] == 0)), bool(jnp.all(y[1] == 0))
      ((2, 5, 4), True, True)
    """

    cell: nn.Module
    reverse: bool = False
    keep_order: bool = False
    return_carry: bool = False
    unroll: int = 1
    zoneout: float | tuple[float, ...] = 0.0
    weight_dropout: float = 0.0
    recurrent_kernels: str | tuple[str, ...] = FLAX_RECURRENT_KERNELS
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        *,
        mask: jax.typing.ArrayLike | None = None,
        lengths: jax.typing.ArrayLike | None = None,
        initial_carry: Any = None,
        init_key: jax.Array | None = None,
        reverse: bool | None = None,
        keep_order: bool | None = None,
        return_carry: bool | None = None,
        deterministic: bool | None = None,
        rng: jax.Array | None = None,
    ) -> Any:
        """Runs the cell over ``inputs: [batch, time, *features]``.

        Args:
          inputs: ``[batch, time, *features]``.
          mask: ``bool[batch, time]``, True at valid steps.
          lengths: ``int[batch]``, valid steps per (right-padded) sequence; instead
            of ``mask``. With neither, every step is valid.
          initial_carry: the carry to start from; default the cell's
            ``initialize_carry(init_key, [batch, *features])``.
          init_key: key for ``initialize_carry`` (default ``jax.random.key(0)``).
          reverse, keep_order, return_carry, deterministic: override the attributes.
          rng: the regularizers' key for this call, instead of the next key of
            ``rng_collection``.

        Returns:
          ``outputs: [batch, time, *out_features]`` (0 at padding), or
          ``(carry, outputs)`` with ``return_carry``.

        Raises:
          MaskShapeError: inputs without a batch and time axis, or a mask/lengths
            whose shape is not ``[batch, time]`` / ``[batch]``.
          DtypeError: a mask that is not boolean, or lengths that are not integers.
          DropmaskValueError: both ``mask`` and ``lengths``; a regularizer on without
            ``deterministic``; ``weight_dropout`` on a cell without recurrent kernels.
          RateError: a ``zoneout`` or ``weight_dropout`` outside ``[0, 1]``.
        """
        caller = "dropmask.linen.MaskedRNN"
        reverse = self.reverse if reverse is None else reverse
        keep_order = self.keep_order if keep_order is None else keep_order
        return_carry = self.return_carry if return_carry is None else return_carry
        check_rnn_args(inputs, mask, lengths, initial_carry, init_key, caller=caller)
        mask_arr, lengths_arr, batch, _ = resolve_mask(inputs, mask, lengths, caller=caller)
        zoneout_rates = carry_rates(self.zoneout, caller=caller)
        check_rate(self.weight_dropout, caller=caller, name="weight_dropout")
        kernel_names = recurrent_kernel_names(self.recurrent_kernels, caller=caller)
        det = self._deterministic(deterministic, bool(zoneout_rates), caller=caller)
        x = jnp.asarray(inputs)
        step_shape = (batch, *x.shape[2:])
        if initial_carry is None:
            key = jax.random.key(0) if init_key is None else init_key
            initial_carry = self.cell.initialize_carry(key, step_shape)  # type: ignore[attr-defined]
        check_carry(initial_carry, batch, caller=caller)
        check_zoneout_carry(self.zoneout, initial_carry, caller=caller)
        if self.is_initializing():
            self.cell(initial_carry, jnp.zeros(step_shape, x.dtype))
        step = self._step(initial_carry, zoneout_rates, kernel_names, det, rng, caller=caller)
        carry, outputs = masked_rnn(
            step,
            initial_carry,
            x,
            mask_arr,
            lengths_arr,
            reverse=reverse,
            keep_order=keep_order,
            unroll=self.unroll,
        )
        return (carry, outputs) if return_carry else outputs

    def _deterministic(self, deterministic: bool | None, zoneout: bool, *, caller: str) -> bool:
        """Evaluation mode for the regularizers; True when none is on."""
        if not zoneout and concrete_value(self.weight_dropout) == 0.0:
            return True
        if self.deterministic is None and deterministic is None:
            raise user_error(
                DropmaskValueError,
                "deterministic must be True or False when zoneout or weight_dropout is on, got "
                "None",
                "Pass MaskedRNN(..., deterministic=...) or call it with deterministic=not "
                "training.",
                caller=caller,
            )
        return bool(nn.merge_param("deterministic", self.deterministic, deterministic))

    def _step(
        self,
        initial_carry: Any,
        zoneout_rates: Any,
        kernel_names: Any,
        det: bool,
        rng: Any,
        *,
        caller: str,
    ) -> Callable[..., Any]:
        """The cell as a pure step: this call's variables (recurrent kernels dropped in
        training mode), a fresh key per time step for each stream, and zoneout."""
        cell, variables = self.cell.unbind()
        if concrete_value(self.weight_dropout) != 0.0:
            check_recurrent_kernels(variables.get("params", {}), kernel_names, caller=caller)
        streams = [name for name in self.scope.rngs if name != "params"] if self.scope else []
        keys = {name: self.make_rng(name) for name in streams}
        drops = _dropout.needs_key(self.weight_dropout, det, caller=caller)
        if drops or (zoneout_rates and not det):
            rng = self._regularizer_key(rng, caller=caller)
        zoneout_key, weight_key = regularizer_keys(rng)
        if drops:
            variables = dict(variables)
            variables["params"] = drop_recurrent_kernels(
                variables.get("params", {}),
                self.weight_dropout,
                weight_key,
                kernel_names,
                caller=caller,
            )

        def cell_step(carry: Any, x_t: jax.Array, t: jax.Array) -> tuple[Any, Any]:
            rngs = {name: jax.random.fold_in(key, t) for name, key in keys.items()}
            return cell.apply(variables, carry, x_t, rngs=rngs)

        step = regularized_step(
            cell_step, zoneout_rates, zoneout_key, initial_carry, deterministic=det, caller=caller
        )
        return step

    def _regularizer_key(self, rng: Any, *, caller: str) -> jax.Array:
        """This call's key: ``rng`` if given, else the next key of ``rng_collection``
        (falling back to ``'params'`` as Flax's ``make_rng`` does, so that ``init`` in
        training mode works)."""
        if rng is None:
            stream = self.rng_collection
            if not (self.has_rng(stream) or self.has_rng("params")):
                given = list(self.scope.rngs) if self.scope is not None else []
                raise user_error(
                    MissingKeyError,
                    f"a key for stream {stream!r} must be given in training mode with zoneout or "
                    f"weight_dropout on, got streams {given}",
                    f"Call apply(..., rngs={{{stream!r}: key}}), pass rng=key, or pass "
                    "deterministic=True.",
                    caller=caller,
                )
            rng = self.make_rng(stream)
        check_key(rng, caller=caller, name="rng")
        return rng


class Bidirectional(nn.Module):
    """A forward and a backward :class:`MaskedRNN` over the same padded batch.

    The backward RNN reverses only each sequence's valid prefix (padding stays at
    the end) and its outputs are put back in input order, so that output ``t`` of
    both directions belongs to input ``t``.

    Attributes:
      forward_rnn: a :class:`MaskedRNN` (its ``reverse`` is ignored: forward).
      backward_rnn: a :class:`MaskedRNN` (run with ``reverse=True, keep_order=True``).
      merge_fn: ``(forward_outputs, backward_outputs) -> outputs``; default
        concatenation on the last axis.
      return_carry: return ``((forward_carry, backward_carry), outputs)``.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from dropmask import linen as dl
      >>> bi = dl.Bidirectional(dl.MaskedRNN(nn.GRUCell(4)), dl.MaskedRNN(nn.GRUCell(4)))
      >>> x = jnp.ones((2, 5, 3))
      >>> y, _ = bi.init_with_output(jax.random.key(0), x, lengths=jnp.array([5, 2]))
      >>> y.shape
      (2, 5, 8)
    """

    forward_rnn: MaskedRNN
    backward_rnn: MaskedRNN
    merge_fn: Callable[[Any, Any], Any] = concat_features
    return_carry: bool = False

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        *,
        mask: jax.typing.ArrayLike | None = None,
        lengths: jax.typing.ArrayLike | None = None,
        initial_carry: tuple[Any, Any] | None = None,
        init_key: jax.Array | None = None,
        return_carry: bool | None = None,
        deterministic: bool | None = None,
        rng: jax.Array | None = None,
    ) -> Any:
        """Runs both directions over ``inputs: [batch, time, *features]``.

        Args mean what they mean for :class:`MaskedRNN`; ``initial_carry`` is a
        ``(forward, backward)`` pair; ``deterministic`` reaches both directions, and
        ``rng`` gives them ``fold_in(rng, 0)`` and ``fold_in(rng, 1)``.

        Returns:
          ``merge_fn(forward, backward)``, or ``((forward_carry, backward_carry),
          outputs)`` with ``return_carry``.
        """
        return_carry = self.return_carry if return_carry is None else return_carry
        check_rnn_args(
            inputs,
            mask,
            lengths,
            initial_carry,
            init_key,
            caller="dropmask.linen.Bidirectional",
            pair=True,
        )
        carries = initial_carry or (None, None)
        keys = (None, None) if init_key is None else tuple(jax.random.split(init_key))
        rngs = (None, None) if rng is None else tuple(jax.random.fold_in(rng, i) for i in (0, 1))
        # The backward direction reverses each sequence and puts its outputs back in
        # input order.
        (carry_f, out_f), (carry_b, out_b) = (
            rnn(
                inputs,
                mask=mask,
                lengths=lengths,
                initial_carry=carry,
                init_key=key,
                reverse=backward,
                keep_order=backward,
                return_carry=True,
                deterministic=deterministic,
                rng=direction_rng,
            )
            for rnn, carry, key, direction_rng, backward in zip(
                (self.forward_rnn, self.backward_rnn),
                carries,
                keys,
                rngs,
                (False, True),
                strict=True,
            )
        )
        outputs = self.merge_fn(out_f, out_b)
        return ((carry_f, carry_b), outputs) if return_carry else outputs
