"""Masked dot-product attention with dropout, on three paths (see README.md here)."""

from ._dot_product import Algorithm as Algorithm
from ._dot_product import dot_product_attention as dot_product_attention

__all__ = ["Algorithm", "dot_product_attention"]
