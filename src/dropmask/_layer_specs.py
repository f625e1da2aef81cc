"""One spec per stochastic layer kind, which the Linen and NNX layers both wrap.

A spec names the public function a layer calls and the layer fields it passes by name;
:func:`apply` adds what every layer passes (``rate``, the key, ``deterministic``, and,
for a layer that can run inside ``shard_map``, its block of the global array) and names
the layer in the errors. A new layer argument is one edit in the core and one here, whatever the
front end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from . import _dropout
from ._errors import naming
from ._structured import drop_block, drop_head

__all__ = [
    "ALPHA_DROPOUT",
    "DROPOUT",
    "DROP_BLOCK",
    "DROP_HEAD",
    "DROP_PATH",
    "GAUSSIAN_DROPOUT",
    "WORD_DROPOUT",
    "Spec",
    "apply",
]


@dataclasses.dataclass(frozen=True)
class Spec:
    """A layer kind: its core function, the fields it passes, whether it is sharded."""

    core: Callable[..., jax.Array]
    fields: tuple[str, ...]
    sharded: bool = True  # has ``shard_spec`` and call-time ``global_shape`` / ``offset``


DROPOUT = Spec(_dropout.dropout, ("broadcast_dims", "impl", "residual"))
WORD_DROPOUT = Spec(_dropout.word_dropout, ("unk_id", "impl"))
DROP_PATH = Spec(_dropout.drop_path, ("batch_axis", "impl", "residual"))
GAUSSIAN_DROPOUT = Spec(_dropout.gaussian_dropout, ("broadcast_dims",), sharded=False)
ALPHA_DROPOUT = Spec(_dropout.alpha_dropout, ("broadcast_dims", "impl", "residual"))
DROP_BLOCK = Spec(drop_block, ("block_size", "per_channel"))
DROP_HEAD = Spec(drop_head, ("residual",))


def apply(
    spec: Spec,
    layer: Any,
    inputs: Any,
    deterministic: bool | None,
    rng: Any,
    global_shape: Any = None,
    offset: Any = None,
) -> jax.Array:
    """``spec.core`` on ``inputs`` with ``layer``'s fields, in the mode and with the key
    that the layer's front end resolves from this call's ``deterministic`` and ``rng``;
    errors name the layer."""
    caller = layer._caller
    det, key = layer._prepare(deterministic, rng)
    options = {name: getattr(layer, name) for name in spec.fields}
    if spec.sharded:
        options["global_shape"], options["offset"] = _dropout.layer_block(
            inputs, layer.shard_spec, global_shape, offset, det, caller=caller
        )
    with naming(caller):
        return spec.core(inputs, layer.rate, key, deterministic=det, **options)
