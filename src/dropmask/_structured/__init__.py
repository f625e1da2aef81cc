"""Structured dropout: what drops more than single units (see README.md here)."""

from ._dropblock import drop_block as drop_block
from ._heads import drop_head as drop_head
from ._heads import drop_head_attention as drop_head_attention
from ._layerdrop import check_returns_inputs as check_returns_inputs
from ._layerdrop import keep_layer as keep_layer
from ._layerdrop import kept_layers as kept_layers
from ._layerdrop import layer_drop as layer_drop
from ._layerdrop import layer_drop_module as layer_drop_module
from ._rdrop import r_drop_passes as r_drop_passes
from ._rdrop import symmetric_kl as symmetric_kl
from ._tokens import TokenSubset as TokenSubset
from ._tokens import drop_tokens as drop_tokens

__all__ = [
    "TokenSubset",
    "check_returns_inputs",
    "drop_block",
    "drop_head",
    "drop_head_attention",
    "drop_tokens",
    "keep_layer",
    "kept_layers",
    "layer_drop",
    "layer_drop_module",
    "r_drop_passes",
    "symmetric_kl",
]
