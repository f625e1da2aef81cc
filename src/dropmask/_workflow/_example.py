"""What an application provides to the training loop and to the audit.

An example (``examples/<name>/train.py``) builds one :class:`Example` and names it
``example``; ``dropmask train <name>`` and :func:`dropmask.training.train` do the rest
(devices, checkpoints, resume, logging, plots, rate comparisons), and ``dropmask audit
<name>`` audits its model and train step from the same keys (:func:`run_keys`). The
example writes only what is specific to it: config, data, model and optimizer, the
steps, metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from ._compile_cache import share_static_fields
from ._entries import ENTRIES

__all__ = ["Example", "base_config", "run_keys"]

Batch = Mapping[str, np.ndarray]
# The batch as the jitted train step sees it: sharded over the mesh.
DeviceBatch = Mapping[str, jax.Array]
Metrics = Mapping[str, Any]


def base_config() -> ml_collections.ConfigDict:
    """The entries the shared loop reads; an example's ``get_config`` starts from these.

    Returns:
      A ``ConfigDict`` with ``seed`` (root of all randomness), ``steps`` (train steps
      in total), ``rate`` (the dropout rate that ``--rate`` and ``--compare-rates``
      set), ``log_every`` (steps per ``train`` row of ``metrics.jsonl``),
      ``eval_every`` (steps between evaluations), ``checkpoint_every`` (steps between
      checkpoints; the last step is always saved), ``keep_checkpoints`` (how many
      of the latest to keep, besides the best), ``mc_samples`` (dropout samples of
      the Monte Carlo evaluation beside the deterministic one; 0: none) and
      ``allow_nonfinite_loss`` (False: a NaN or infinite train loss stops the run at
      that step; True: train on, for steps that skip bad updates such as
      ``optax.apply_if_finite``; a non-finite state is never saved either way) and
      ``evaluate_at_checkpoints`` (True: every checkpoint is also evaluated, so that
      any of them can be kept as the best; False: only at ``eval_every`` steps and
      the last, for runs whose evaluation costs much of their time). Each is a row of
      the one table of the loop's entries (``dropmask._workflow._entries``).

    Example:
      >>> config = base_config()
      >>> config.seed, config.keep_checkpoints
      (0, 3)
    """
    return ml_collections.ConfigDict({entry.name: entry.default for entry in ENTRIES})


def run_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The ``(data_key, params_key, dropout_key)`` of a run: one root key, split in three.

    The training loop and ``dropmask audit`` both start from these, so an audit sees
    the masks and batches a real run draws.

    Example:
      >>> data_key, params_key, dropout_key = run_keys(0)
      >>> data_key.dtype
      key<fry>
    """
    data_key, params_key, dropout_key = jax.random.split(jax.random.key(seed), 3)
    return data_key, params_key, dropout_key


@dataclasses.dataclass(frozen=True)
class Example:
    """One trainable application: the parts of a run that differ between examples.

    The same fields serve Flax Linen and Flax NNX models; only ``create_state`` (a
    ``TrainState`` or an ``NnxTrainState``) and the mode keywords differ.

    Every callable is a plain function of its arguments, so that a run is a pure
    function of the config: the loop derives ``data_key, params_key, dropout_key =
    jax.random.split(jax.random.key(config.seed), 3)`` and passes them in.

    Attributes:
      name: the example's name, as in ``dropmask train NAME``.
      get_config: returns the default ``ConfigDict`` (built on :func:`base_config`).
      load_data: ``(config) -> data``, host-side; raises
        ``dropmask.training.DataError`` for a missing or unreadable path.
      create_state: ``(config, data, params_key, dropout_key) -> TrainState``: the
        model initialised (``training=False``), the optimizer, ``key=dropout_key``;
        for a Flax NNX model an :class:`NnxTrainState` of the model built with
        ``nnx.Rngs(params=params_key, dropout=dropout_key)``.
        Its ``apply_fn``, ``tx`` and other non-array fields must depend only on the
        config, never on ``seed`` or the loop's other per-run entries (logging,
        evaluation and checkpoint intervals, ``mc_samples``): the loop gives every
        run of one config the first run's ``apply_fn`` and ``tx``, so that the
        seeds of a rate comparison, or a resumed run, share one compilation of
        each jitted step. Build them afresh each call; no caching is needed.
      train_batch: ``(config, data, data_key, step) -> {name: array[batch, ...]}``,
        the global batch of ``step``. It must depend on nothing else (e.g. the epoch
        ``step // steps_per_epoch`` shuffled by ``fold_in(data_key, epoch)``), which
        is what makes resuming exact.
      train_step: ``(state, batch) -> (new_state, metrics)``, jitted; ``metrics``
        holds scalar arrays and at least ``'loss'``. Draw keys with
        ``state.rngs('dropout', ...)``.
      evaluate: ``(state, config, data, split) -> {metric: float}``, deterministic
        (``training=False``), for each split in ``eval_splits``.
      eval_splits: the splits ``evaluate`` accepts: ``'eval'`` (held-out data) and,
        when the example can also score its training data deterministically,
        ``'train_eval'``, which gives the generalization gap.
      best_metric: the eval metric that picks the best checkpoint and that
        ``--compare-rates`` tabulates, e.g. ``'accuracy'``.
      best_mode: ``'max'`` or ``'min'`` for ``best_metric``.
      data_position: ``(config, data, step) -> dict``, where the pipeline is at
        ``step`` (e.g. epoch and batch); saved in checkpoints and checked on resume.
        ``None`` records only the step.
      predict: ``(state, config, data, split, key, num_samples) -> (logits, labels)``
        for a classifier: ``logits: float[n, classes]`` of the deterministic model
        when ``num_samples`` is 0 (``key`` is None), else ``float[num_samples, n,
        classes]`` with dropout on, sample ``i`` keyed by ``fold_in(key, i)`` (e.g.
        ``dropmask.uncertainty.sample``); ``labels: int[n]``. With ``config.mc_samples
        > 0`` the loop scores both (accuracy, NLL, ECE); ``None``: no Monte Carlo
        evaluation.
      get_tiny_config: a seconds-long config, which ``dropmask audit`` runs; ``None``
        uses ``get_config``.
      model_inputs: ``batch -> tuple``, the positional inputs of one model call taken
        from a train batch; ``dropmask audit`` needs it to call the model alone.
      train_kwargs: keyword arguments of a model call in training (audit); ``{}``
        for an NNX model, whose mode is ``.train()`` / ``.eval()``.
      eval_kwargs: keyword arguments of a model call in evaluation (audit); ``{}``
        for an NNX model.
      eval_model: ``model -> model``, the evaluation module when a config field and
        not a call argument selects the mode (e.g. ``config.replace(deterministic=
        True)``); ``None``: the model itself with ``eval_kwargs``.
      configs: named configs besides the default, ``{name: get_config}``, each with
        the default's entries; ``dropmask train TARGET --config NAME`` starts from
        one (e.g. ``{'long': get_long_config}``), overrides apply on top.
      sample: ``(state, config, prompt, length, temperature, top_k, key) -> str``, for
        a generative model: the prompt and ``length`` tokens after it, with dropout
        off; greedy at ``temperature`` 0, else drawn from ``softmax(logits /
        temperature)`` over the ``top_k`` most likely tokens (0: all), the same text
        for the same ``key``. ``dropmask sample`` calls it on a restored run;
        ``None``: the example does not generate.

    Example:
      >>> from dropmask.examples.digits.train import example  # the bundled digits
      >>> example.name, example.eval_splits, example.best_metric, example.best_mode
      ('digits', ('train_eval', 'eval'), 'accuracy', 'max')
      >>> config = example.get_tiny_config()
      >>> batch = example.train_batch(config, example.load_data(config), run_keys(0)[0], 0)
      >>> {name: array.shape for name, array in batch.items()}  # step 0's global batch
      {'image': (24, 64), 'label': (24,)}
    """

    name: str
    get_config: Callable[[], ml_collections.ConfigDict]
    load_data: Callable[[ml_collections.ConfigDict], Any]
    create_state: Callable[[ml_collections.ConfigDict, Any, jax.Array, jax.Array], Any]
    train_batch: Callable[[ml_collections.ConfigDict, Any, jax.Array, int], Batch]
    train_step: Callable[[Any, DeviceBatch], tuple[Any, Metrics]]
    evaluate: Callable[[Any, ml_collections.ConfigDict, Any, str], Mapping[str, float]]
    eval_splits: tuple[str, ...] = ("eval",)
    best_metric: str = "loss"
    best_mode: str = "min"
    data_position: Callable[[ml_collections.ConfigDict, Any, int], dict[str, Any]] | None = None
    predict: Callable[..., tuple[Any, Any]] | None = None
    get_tiny_config: Callable[[], ml_collections.ConfigDict] | None = None
    model_inputs: Callable[[Batch], tuple[Any, ...]] | None = None
    train_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"training": True})
    eval_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"training": False})
    eval_model: Callable[[Any], Any] | None = None
    configs: Mapping[str, Callable[[], ml_collections.ConfigDict]] = dataclasses.field(
        default_factory=dict
    )
    sample: Callable[..., str] | None = None

    def build_state(
        self,
        config: ml_collections.ConfigDict,
        data: Any,
        params_key: jax.Array,
        dropout_key: jax.Array,
    ) -> Any:
        """``create_state``'s state, sharing compilation with earlier runs of the config.

        The arrays are this call's; ``apply_fn``, ``tx`` and the other static fields
        are those of the first state this process built for the same config, its
        per-run entries (``seed`` among them) left out, so that jitted functions of
        the state reuse that state's compilation. The training loop builds every
        state this way; so should code that restores runs side by side.

        Raises:
          DropmaskValueError: the state's structure or array shapes differ from the
            first state of the config (``create_state`` read a per-run entry or a
            global).
        """
        state = self.create_state(config, data, params_key, dropout_key)
        return share_static_fields(self.create_state, config, state, self.name)

    def position(self, config: ml_collections.ConfigDict, data: Any, step: int) -> dict[str, Any]:
        """The data position recorded in a checkpoint at ``step``."""
        extra = self.data_position(config, data, step) if self.data_position else {}
        return {"step": int(step), **extra}
