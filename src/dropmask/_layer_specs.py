"""One spec per stochastic layer kind, which the Linen and NNX layers both wrap.

A spec names the public function a layer calls and the layer fields it passes by name;
:func:`apply` adds what every layer passes (``rate``, the key, ``deterministic``, and,
for a layer that can run inside ``shard_map``, its block of the global array) and names
the layer in the errors. A new layer argument is one edit in the core and one here, whatever the
front end. :func:`swapped_attention_fn` is the one ``attention_fn`` both front ends'
``swap_dropout`` give Flax's attention modules.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from . import _dropout
from ._attention import dot_product_attention
from ._errors import naming
from ._random import Impl
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
    "swapped_attention_fn",
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


def swapped_attention_fn(impl: Impl, flax_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``attention_fn`` that ``swap_dropout(attention=True)`` gives a Flax attention
    module whose own is ``flax_fn`` (Flax's default).

    :func:`dropmask.dot_product_attention` with ``impl``; with ``impl="flax"``,
    ``flax_fn`` itself, so that the swapped module computes what Flax computes, bit for
    bit (its rows with no valid key and its dropout draw included), and only the routing
    is proven. Either is a new object: the module no longer holds Flax's default, so a
    swap reaches it once, and the audit reads it by its function.
    """
    if impl == "flax":
        return functools.partial(flax_fn)
    return functools.partial(dot_product_attention, impl=impl)
