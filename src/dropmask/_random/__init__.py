"""How keep-masks are drawn from a JAX key (see README.md here).

The library's one mask entry point is :func:`draw`; the rest of the library imports
these names from here, never this package's modules.
"""

from ._draw import DEFAULT_IMPL as DEFAULT_IMPL
from ._draw import DEFAULT_RESIDUAL as DEFAULT_RESIDUAL
from ._draw import SAVE_MASK_WORDS as SAVE_MASK_WORDS
from ._draw import SAVE_NOTHING as SAVE_NOTHING
from ._draw import Impl as Impl
from ._draw import Kept as Kept
from ._draw import Linear as Linear
from ._draw import Residual as Residual
from ._draw import draw as draw
from ._draw import flags_only as flags_only
from ._draw import keep_mask as keep_mask
from ._draw import kept as kept
from ._draw import mask_shape as mask_shape
from ._draw import probability as probability
from ._fast_mask import FIELD_BITS as FIELD_BITS
from ._fast_mask import FIELDS as FIELDS
from ._fast_mask import LANES as LANES
from ._fast_mask import MASK_NAME as MASK_NAME
from ._fast_mask import PATHS as PATHS
from ._fast_mask import Threshold as Threshold
from ._fast_mask import check_word_count as check_word_count
from ._fast_mask import first_element as first_element
from ._fast_mask import keep_from_words as keep_from_words
from ._fast_mask import key_words as key_words
from ._fast_mask import loop_zero as loop_zero
from ._fast_mask import packed_keep_words as packed_keep_words
from ._fast_mask import random_bits as random_bits
from ._fast_mask import threshold as threshold
from ._placement import KernelLoweringError as KernelLoweringError
from ._placement import auto_partitioned as auto_partitioned
from ._placement import enabled as tpu_kernels
from ._placement import tpu_interpret as tpu_interpret
from ._placement import tpu_kernels_run as tpu_kernels_run
from ._placement import tpu_only as tpu_only
from ._sharding import Block as Block
from ._sharding import block_from_spec as block_from_spec
from ._sharding import explicit_split as explicit_split
from ._sharding import explicitly_sharded_axes as explicitly_sharded_axes
from ._sharding import local_block as local_block
from ._sharding import local_shape as local_shape
from ._sharding import resharded_to as resharded_to
from ._sharding import sharded_as as sharded_as
from ._sharding import spec_entries as spec_entries
from ._threefry import threefry4x32 as threefry4x32
from ._tile_mask import TileGeometry as TileGeometry
from ._tile_mask import tile_keep_flags as tile_keep_flags
from ._tpu_mask import keep_tile as keep_tile
from ._tpu_mask import rows_along_lanes as rows_along_lanes

__all__ = [
    "DEFAULT_IMPL",
    "DEFAULT_RESIDUAL",
    "FIELDS",
    "FIELD_BITS",
    "LANES",
    "MASK_NAME",
    "PATHS",
    "SAVE_MASK_WORDS",
    "SAVE_NOTHING",
    "Block",
    "Impl",
    "Kept",
    "Linear",
    "Residual",
    "Threshold",
    "TileGeometry",
    "block_from_spec",
    "draw",
    "explicitly_sharded_axes",
    "check_word_count",
    "first_element",
    "flags_only",
    "keep_from_words",
    "keep_mask",
    "kept",
    "key_words",
    "local_block",
    "loop_zero",
    "mask_shape",
    "packed_keep_words",
    "probability",
    "random_bits",
    "resharded_to",
    "sharded_as",
    "spec_entries",
    "threefry4x32",
    "threshold",
    "tile_keep_flags",
    "tpu_kernels",
    "keep_tile",
    "rows_along_lanes",
    "tpu_interpret",
    "tpu_kernels_run",
    "tpu_only",
    "KernelLoweringError",
    "auto_partitioned",
    "explicit_split",
    "local_shape",
]
