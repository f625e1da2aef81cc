"""NNX ``MaskedRNN`` and ``Bidirectional``: any NNX cell over a padded batch.

The module splits its cell into a graph and state, turns it into a pure step (the
state closed over, the cell's random streams reseeded per time step) and calls the
functional core, :func:`dropmask._rnn.masked_rnn`; zoneout and weight dropout are
the core's too (:mod:`dropmask._rnn`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .. import _dropout
from .._checks import check_key, check_rate, concrete_value
from .._errors import MissingKeyError, user_error
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
from ._streams import own_stream

__all__ = ["Bidirectional", "MaskedRNN"]


def _stream_keys(cell: nnx.Module) -> dict[str, jax.Array]:
    """One fresh key per named random stream in ``cell``, advancing each stream once."""
    keys: dict[str, jax.Array] = {}
    for _, node in nnx.iter_graph(cell):
        if isinstance(node, nnx.RngStream) and node.key.tag not in keys:
            keys[node.key.tag] = node()
    return keys


class MaskedRNN(nnx.Module):
    """Runs an NNX RNN cell over ``[batch, time, ...]`` inputs with padding.

    Like ``flax.nnx.RNN(cell)(x, seq_lengths=...)``, with the padding handled by
    :func:`dropmask.masked_scan`: the carry is held through padded steps, so the
    final carry is each sequence's own (the initial carry for a sequence of length
    0), outputs are 0 at padding, and NaN or inf in padded inputs reach neither
    outputs nor gradients. Any mask works, not only right padding.

    Random streams: each call draws one key from each of the cell's streams (e.g.
    the ``'dropout'`` stream of an ``nnx.Dropout`` inside it) and reseeds the cell
    with ``fold_in(key, t)`` at time step ``t``, so a dropout layer inside the cell
    draws a new mask at each step. State the cell mutates otherwise (e.g. batch
    statistics) is not kept.

    Recurrent regularizers (both off by default): ``zoneout`` keeps each unit of the
    carry at its previous value with probability ``zoneout`` at each training step and
    uses the expectation in evaluation (Krueger et al., 2017; see
    :func:`dropmask.zoneout`); ``weight_dropout`` drops elements of the cell's
    recurrent (hidden-to-hidden) kernels with one mask per call, the same at every time
    step, scaled by ``1/(1-rate)`` (DropConnect as in AWD-LSTM; identity in
    evaluation). Both draw one key per call from ``rngs``' ``rng_collection`` stream
    and follow ``model.train()`` / ``model.eval()``. A padded step changes nothing
    under either: the carry is held.

    Args:
      cell: an NNX cell: ``cell(carry, x_t) -> (carry, y_t)`` with
        ``initialize_carry(input_shape)``, e.g. ``nnx.LSTMCell(3, 64, rngs=rngs)``.
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
      deterministic: evaluation mode for the regularizers; a call-time value wins.
      rng_collection: the stream of ``rngs`` the regularizers draw from.
      rngs: an ``nnx.Rngs`` / ``RngStream`` (forked here), or None to pass a key at
        call time; needed in training when a regularizer is on.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dn
      >>> rnn = dn.MaskedRNN(nnx.LSTMCell(3, 4, rngs=nnx.Rngs(0)), return_carry=True)
      >>> (c, h), y = rnn(jnp.ones((2, 5, 3)), lengths=jnp.array([5, 0]))
      >>> y.shape, bool(jnp.all(h[1] == 0)), bool(jnp.all(y[1] == 0))
      ((2, 5, 4), True, True)
    """

    def __init__(
        self,
        cell: nnx.Module,
        *,
        reverse: bool = False,
        keep_order: bool = False,
        return_carry: bool = False,
        unroll: int = 1,
        zoneout: float | tuple[float, ...] = 0.0,
        weight_dropout: float = 0.0,
        recurrent_kernels: str | tuple[str, ...] = FLAX_RECURRENT_KERNELS,
        deterministic: bool = False,
        rng_collection: str = "dropout",
        rngs: nnx.Rngs | nnx.RngStream | None = None,
    ):
        caller = "dropmask.nnx.MaskedRNN"
        carry_rates(zoneout, caller=caller)
        check_rate(weight_dropout, caller=caller, name="weight_dropout")
        self.cell = cell
        self.reverse = reverse
        self.keep_order = keep_order
        self.return_carry = return_carry
        self.unroll = unroll
        self.zoneout = zoneout
        self.weight_dropout = weight_dropout
        self.recurrent_kernels = recurrent_kernel_names(recurrent_kernels, caller=caller)
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        self.rngs = own_stream(rngs, rng_collection, caller=caller)

    def set_view(self, deterministic: bool | None = None) -> None:
        """Used by ``nnx.view``: sets ``deterministic`` when given."""
        if deterministic is not None:
            self.deterministic = deterministic

    def _regularizer_key(self, rngs: Any, *, caller: str) -> jax.Array:
        """This call's key: ``rngs`` if given (a key, stream or Rngs), else the next key
        of the module's own stream."""
        source = rngs if rngs is not None else self.rngs
        if isinstance(source, nnx.Rngs):
            source = source[self.rng_collection]
        if isinstance(source, nnx.RngStream):
            return source()
        if source is None:
            raise user_error(
                MissingKeyError,
                "rngs must be given in training mode with zoneout or weight_dropout on, got "
                f"none for stream {self.rng_collection!r}",
                f"Construct it with rngs=nnx.Rngs({self.rng_collection}=0), call it with "
                "rngs=..., or switch to evaluation with model.eval().",
                caller=caller,
            )
        check_key(source, caller=caller, name="rngs")
        return source

    def __call__(
        self,
        inputs: jax.Array,
        *,
        mask: jax.typing.ArrayLike | None = None,
        lengths: jax.typing.ArrayLike | None = None,
        initial_carry: Any = None,
        reverse: bool | None = None,
        keep_order: bool | None = None,
        return_carry: bool | None = None,
        deterministic: bool | None = None,
        rngs: Any = None,
    ) -> Any:
        """Runs the cell over ``inputs: [batch, time, *features]``.

        Args:
          inputs: ``[batch, time, *features]``.
          mask: ``bool[batch, time]``, True at valid steps.
          lengths: ``int[batch]``, valid steps per (right-padded) sequence; instead
            of ``mask``. With neither, every step is valid.
          initial_carry: the carry to start from; default the cell's
            ``initialize_carry([batch, *features])``.
          reverse, keep_order, return_carry, deterministic: override the attributes.
          rngs: the regularizers' key for this call (a key, ``nnx.RngStream`` or
            ``nnx.Rngs``), instead of the module's own stream.

        Returns:
          ``outputs: [batch, time, *out_features]`` (0 at padding), or
          ``(carry, outputs)`` with ``return_carry``.

        Raises:
          MaskShapeError: inputs without a batch and time axis, or a mask/lengths
            whose shape is not ``[batch, time]`` / ``[batch]``.
          DtypeError: a mask that is not boolean, or lengths that are not integers.
          DropmaskValueError: both ``mask`` and ``lengths``; ``weight_dropout`` on a
            cell without recurrent kernels.
          MissingKeyError: a regularizer on in training mode without ``rngs``.
        """
        caller = "dropmask.nnx.MaskedRNN"
        reverse = self.reverse if reverse is None else reverse
        keep_order = self.keep_order if keep_order is None else keep_order
        return_carry = self.return_carry if return_carry is None else return_carry
        det = bool(self.deterministic if deterministic is None else deterministic)
        check_rnn_args(inputs, mask, lengths, initial_carry, None, caller=caller)
        mask_arr, lengths_arr, batch, _ = resolve_mask(inputs, mask, lengths, caller=caller)
        zoneout_rates = carry_rates(self.zoneout, caller=caller)
        x = jnp.asarray(inputs)
        if initial_carry is None:
            shape = (batch, *x.shape[2:])
            if isinstance(self.cell, nnx.RNNCellBase):
                # Flax's cells want a key even for their zero carry; nnx.RNN's is 0 too.
                initial_carry = self.cell.initialize_carry(shape, rngs=nnx.Rngs(carry=0))
            else:
                initial_carry = self.cell.initialize_carry(shape)  # type: ignore[attr-defined]
        check_carry(initial_carry, batch, caller=caller)
        check_zoneout_carry(self.zoneout, initial_carry, caller=caller)
        keys = _stream_keys(self.cell)
        graphdef, state = nnx.split(self.cell)
        if concrete_value(self.weight_dropout) != 0.0:
            check_recurrent_kernels(state, self.recurrent_kernels, caller=caller)
        drops = _dropout.needs_key(self.weight_dropout, det, caller=caller)
        key = None
        if drops or (zoneout_rates and not det):
            key = self._regularizer_key(rngs, caller=caller)
        zoneout_key, weight_key = regularizer_keys(key)
        if drops:
            state = drop_recurrent_kernels(
                state, self.weight_dropout, weight_key, self.recurrent_kernels, caller=caller
            )

        def cell_step(carry: Any, x_t: jax.Array, t: jax.Array) -> tuple[Any, Any]:
            cell = nnx.merge(graphdef, state, copy=True)
            if keys:
                step_keys: dict[str, Any] = {n: jax.random.fold_in(k, t) for n, k in keys.items()}
                nnx.reseed(cell, **step_keys)
            return cell(carry, x_t)  # type: ignore[operator]

        step = regularized_step(
            cell_step, zoneout_rates, zoneout_key, initial_carry, deterministic=det, caller=caller
        )
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


class Bidirectional(nnx.Module):
    """A forward and a backward :class:`MaskedRNN` over the same padded batch.

    The backward RNN reverses only each sequence's valid prefix and its outputs are
    put back in input order, so that output ``t`` of both directions belongs to
    input ``t``.

    Args:
      forward_rnn: a :class:`MaskedRNN` (run forward whatever its ``reverse``).
      backward_rnn: a :class:`MaskedRNN` (run with ``reverse=True, keep_order=True``).
      merge_fn: ``(forward_outputs, backward_outputs) -> outputs``; default
        concatenation on the last axis.
      return_carry: return ``((forward_carry, backward_carry), outputs)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from dropmask import nnx as dn
      >>> rngs = nnx.Rngs(0)
      >>> bi = dn.Bidirectional(dn.MaskedRNN(nnx.GRUCell(3, 4, rngs=rngs)),
      ...                       dn.MaskedRNN(nnx.GRUCell(3, 4, rngs=rngs)))
      >>> bi(jnp.ones((2, 5, 3)), lengths=jnp.array([5, 2])).shape
      (2, 5, 8)
    """

    def __init__(
        self,
        forward_rnn: MaskedRNN,
        backward_rnn: MaskedRNN,
        *,
        merge_fn: Callable[[Any, Any], Any] = concat_features,
        return_carry: bool = False,
    ):
        self.forward_rnn = forward_rnn
        self.backward_rnn = backward_rnn
        self.merge_fn = merge_fn
        self.return_carry = return_carry

    def __call__(
        self,
        inputs: jax.Array,
        *,
        mask: jax.typing.ArrayLike | None = None,
        lengths: jax.typing.ArrayLike | None = None,
        initial_carry: tuple[Any, Any] | None = None,
        return_carry: bool | None = None,
        deterministic: bool | None = None,
        rngs: jax.Array | None = None,
    ) -> Any:
        """Runs both directions over ``inputs: [batch, time, *features]``.

        Args mean what they mean for :class:`MaskedRNN`; ``initial_carry`` is a
        ``(forward, backward)`` pair; ``deterministic`` reaches both directions, and a
        key ``rngs`` gives them ``fold_in(rngs, 0)`` and ``fold_in(rngs, 1)``.

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
            None,
            caller="dropmask.nnx.Bidirectional",
            pair=True,
        )
        carries = initial_carry or (None, None)
        keys = (None, None) if rngs is None else tuple(jax.random.fold_in(rngs, i) for i in (0, 1))
        # The backward direction reverses each sequence and puts its outputs back in
        # input order.
        (carry_f, out_f), (carry_b, out_b) = (
            rnn(
                inputs,
                mask=mask,
                lengths=lengths,
                initial_carry=carry,
                reverse=backward,
                keep_order=backward,
                return_carry=True,
                deterministic=deterministic,
                rngs=key,
            )
            for rnn, carry, key, backward in zip(
                (self.forward_rnn, self.backward_rnn), carries, keys, (False, True), strict=True
            )
        )
        outputs = self.merge_fn(out_f, out_b)
        return ((carry_f, carry_b), outputs) if return_carry else outputs
