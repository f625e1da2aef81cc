"""dropmask: fast, correct dropout and masking for JAX and Flax.

Users import from ``dropmask`` (functional API), ``dropmask.linen`` and
``dropmask.nnx`` (Flax modules). Everything here is a re-export.
"""

from ._dropout import alpha_dropout as alpha_dropout
from ._dropout import drop_path as drop_path
from ._dropout import dropout as dropout
from ._dropout import gaussian_dropout as gaussian_dropout
from ._dropout import word_dropout as word_dropout
from ._errors import AxisError as AxisError
from ._errors import DtypeError as DtypeError
from ._errors import MaskShapeError as MaskShapeError
from ._errors import MissingKeyError as MissingKeyError
from ._errors import RateError as RateError
from ._random import keep_mask as keep_mask

__version__ = "0.1.0"

__all__ = [
    "AxisError",
    "DtypeError",
    "MaskShapeError",
    "MissingKeyError",
    "RateError",
    "alpha_dropout",
    "drop_path",
    "dropout",
    "gaussian_dropout",
    "keep_mask",
    "word_dropout",
]
