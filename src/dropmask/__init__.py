"""dropmask: fast, correct dropout and masking for JAX and Flax.

Users import from ``dropmask`` (functional API), ``dropmask.linen`` and
``dropmask.nnx`` (Flax modules), and ``dropmask.uncertainty`` (Monte Carlo dropout and
calibration). Everything here is a re-export.
"""

from importlib import metadata as _metadata

from ._attention import dot_product_attention as dot_product_attention
from ._dropout import alpha_dropout as alpha_dropout
from ._dropout import drop_path as drop_path
from ._dropout import dropout as dropout
from ._dropout import gaussian_dropout as gaussian_dropout
from ._dropout import word_dropout as word_dropout
from ._errors import AxisError as AxisError
from ._errors import DropmaskError as DropmaskError
from ._errors import DropmaskTypeError as DropmaskTypeError
from ._errors import DropmaskValueError as DropmaskValueError
from ._errors import DtypeError as DtypeError
from ._errors import MaskShapeError as MaskShapeError
from ._errors import MissingKeyError as MissingKeyError
from ._errors import RateError as RateError
from ._masks import attention_mask as attention_mask
from ._masks import causal_mask as causal_mask
from ._masks import combine_masks as combine_masks
from ._masks import from_bias as from_bias
from ._masks import from_flax_mask as from_flax_mask
from ._masks import from_numpy_ma as from_numpy_ma
from ._masks import padding_mask as padding_mask
from ._masks import segment_mask as segment_mask
from ._masks import sequence_mask as sequence_mask
from ._masks import sliding_window_mask as sliding_window_mask
from ._masks import to_bias as to_bias
from ._masks import to_flax_mask as to_flax_mask
from ._masks import to_numpy_ma as to_numpy_ma
from ._padding import BucketBatch as BucketBatch
from ._padding import Packed as Packed
from ._padding import bucket_boundaries as bucket_boundaries
from ._padding import bucket_by_length as bucket_by_length
from ._padding import pack_sequences as pack_sequences
from ._padding import pad_sequences as pad_sequences
from ._padding import pad_to_bucket as pad_to_bucket
from ._padding import unpack_sequences as unpack_sequences
from ._random import MASK_NAME as DROPOUT_MASK_NAME
from ._random import keep_mask as keep_mask
from ._reductions import masked_cross_entropy as masked_cross_entropy
from ._reductions import masked_log_softmax as masked_log_softmax
from ._reductions import masked_logsumexp as masked_logsumexp
from ._reductions import masked_max as masked_max
from ._reductions import masked_mean as masked_mean
from ._reductions import masked_min as masked_min
from ._reductions import masked_softmax as masked_softmax
from ._reductions import masked_std as masked_std
from ._reductions import masked_sum as masked_sum
from ._reductions import masked_var as masked_var
from ._rnn import zoneout as zoneout
from ._scan import flip_sequences as flip_sequences
from ._scan import masked_scan as masked_scan
from ._schedules import depth_rates as depth_rates
from ._schedules import early_dropout as early_dropout
from ._schedules import late_dropout as late_dropout
from ._schedules import linear_warmdown as linear_warmdown
from ._structured import TokenSubset as TokenSubset
from ._structured import drop_block as drop_block
from ._structured import drop_head as drop_head
from ._structured import drop_head_attention as drop_head_attention
from ._structured import drop_tokens as drop_tokens
from ._structured import kept_layers as kept_layers
from ._structured import layer_drop as layer_drop
from ._structured import r_drop_passes as r_drop_passes
from ._structured import symmetric_kl as symmetric_kl

try:
    # The version lives in pyproject.toml alone; an installed package carries it.
    __version__: str = _metadata.version("dropmask")
except _metadata.PackageNotFoundError:  # sources on sys.path without an install
    __version__ = "0+unknown"

__all__ = [
    "DROPOUT_MASK_NAME",
    "AxisError",
    "BucketBatch",
    "DropmaskError",
    "DropmaskTypeError",
    "DropmaskValueError",
    "DtypeError",
    "MaskShapeError",
    "MissingKeyError",
    "Packed",
    "RateError",
    "TokenSubset",
    "alpha_dropout",
    "attention_mask",
    "bucket_boundaries",
    "bucket_by_length",
    "causal_mask",
    "combine_masks",
    "depth_rates",
    "dot_product_attention",
    "drop_block",
    "drop_head",
    "drop_head_attention",
    "drop_path",
    "drop_tokens",
    "dropout",
    "early_dropout",
    "flip_sequences",
    "from_bias",
    "from_flax_mask",
    "from_numpy_ma",
    "gaussian_dropout",
    "keep_mask",
    "kept_layers",
    "late_dropout",
    "layer_drop",
    "linear_warmdown",
    "masked_cross_entropy",
    "masked_log_softmax",
    "masked_logsumexp",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_scan",
    "masked_softmax",
    "masked_std",
    "masked_sum",
    "masked_var",
    "pack_sequences",
    "pad_sequences",
    "pad_to_bucket",
    "padding_mask",
    "r_drop_passes",
    "segment_mask",
    "sequence_mask",
    "sliding_window_mask",
    "symmetric_kl",
    "to_bias",
    "to_flax_mask",
    "to_numpy_ma",
    "unpack_sequences",
    "word_dropout",
    "zoneout",
]
