"""Training workflow: keys per step and stream, checkpoints, devices, one shared loop.

The pattern from the Flax dropout guide, packaged::

    main_key, params_key, dropout_key = jax.random.split(jax.random.key(0), 3)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx, key=dropout_key)
    # inside a jitted train_step:
    logits = state.apply_fn({"params": params}, x, training=True,
                            rngs=state.rngs("dropout"))

Every stream's per-step key is ``fold_in(fold_in(key, stream_id(name)), step)``.
:class:`NnxTrainState` is the Flax NNX counterpart: it keeps the model split
(``nnx.split``) and re-keys every stream the model holds by the same rule (plus the
stream's path in the model) each time it rebuilds the model.
:class:`Checkpointer` saves and restores runs exactly (typed keys included), and
:func:`restore_run` rebuilds a trained run's state from its checkpoint;
:func:`train` and :func:`compare_rates` run an :class:`Example` on any number of
devices and processes; ``dropmask train NAME`` is the command over them.
"""

from .._workflow import Example as Example
from .._workflow import base_config as base_config
from .._workflow import run_keys as run_keys
from ._batches import epoch_batch as epoch_batch
from ._batches import epoch_position as epoch_position
from ._checkpoint import Checkpointer as Checkpointer
from ._classifier import ClassifierEval as ClassifierEval
from ._config import check_config as check_config
from ._errors import CheckpointError as CheckpointError
from ._errors import DamagedCheckpointError as DamagedCheckpointError
from ._errors import DataError as DataError
from ._errors import NonFiniteLossError as NonFiniteLossError
from ._errors import SaveError as SaveError
from ._keys import step_key as step_key
from ._keys import step_rngs as step_rngs
from ._keys import stream_id as stream_id
from ._keys import stream_key as stream_key
from ._loop import compare_rates as compare_rates
from ._loop import train as train
from ._nnx_state import NnxTrainState as NnxTrainState
from ._parallel import initialize_distributed as initialize_distributed
from ._parallel import make_mesh as make_mesh
from ._parallel import replicate as replicate
from ._parallel import shard_batch as shard_batch
from ._rate_schedule import RateSchedule as RateSchedule
from ._restore import restore_run as restore_run
from ._result import RunResult as RunResult
from ._serialization import from_bytes as from_bytes
from ._serialization import to_bytes as to_bytes
from ._state import TrainState as TrainState

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "ClassifierEval",
    "DamagedCheckpointError",
    "DataError",
    "Example",
    "NnxTrainState",
    "NonFiniteLossError",
    "RateSchedule",
    "RunResult",
    "SaveError",
    "TrainState",
    "base_config",
    "check_config",
    "compare_rates",
    "epoch_batch",
    "epoch_position",
    "from_bytes",
    "initialize_distributed",
    "make_mesh",
    "replicate",
    "restore_run",
    "run_keys",
    "shard_batch",
    "step_key",
    "step_rngs",
    "stream_id",
    "stream_key",
    "to_bytes",
    "train",
]
