"""The internals that tests and benchmarks may reach: one documented hook, no models.

dropmask's public API hides how a keep-mask is made. Checking the generator (a
statistical battery on its raw stream), timing it apart from applying the mask, or
proving that a hand-written kernel draws the same mask needs the pieces underneath.
This module names those pieces, as thin wrappers over the functions the library
itself runs, so that benchmarks and the generator's statistical and kernel checks
need no private ``dropmask._x`` module and there is one implementation of each mask
(the library's own unit tests may still test a private module directly). It is not
meant for models: its signatures follow the implementation and may change with it.

What the ``"fast"`` mask is made of (see docs/design.md, "The generator"):

* :func:`key_words`: the four ``uint32`` Threefry key words drawn from a JAX key;
* :func:`threefry4x32`: the Threefry-4x32-13 block function itself;
* :func:`threshold`: the integer threshold for a keep probability;
* :func:`packed_mask_words`: a whole mask's keep-flags packed 32 to a ``uint32`` word,
  as the CPU and CUDA paths compute them before unpacking;
* :func:`path_keep_mask` and :func:`path_dropout`: the mask (and dropout) computed by
  one chosen path, where the library picks a path per backend;
* :data:`MASK_NAME`: the name the packed words carry for ``jax.checkpoint`` policies
  (an alias of :data:`dropmask.DROPOUT_MASK_NAME`);
* :func:`random_bits`: the generator's raw bit stream;
* :func:`tpu_kernels`: dropout's masks drawn by the TPU kernel (Pallas), compiled on a
  TPU and interpreted elsewhere, or by XLA's path even where the kernel is the default;
* :func:`tpu_keep_tile`: a tile of the mask drawn inside a Pallas TPU kernel, as the
  library's TPU kernels draw it (for kernels of one's own that must draw the same mask).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax

from . import _dropout, _random
from ._checks import (
    check_choice,
    check_instance,
    check_rate,
    check_residual,
    check_shape,
    check_shape_is,
)
from ._errors import DropmaskValueError, user_error
from ._random import DEFAULT_RESIDUAL, Residual
from ._random import Threshold as Threshold
from ._random import threefry4x32 as threefry4x32

__all__ = [
    "FIELD_BITS",
    "LANES",
    "MASK_NAME",
    "PATHS",
    "Threshold",
    "key_words",
    "packed_mask_words",
    "path_dropout",
    "path_keep_mask",
    "random_bits",
    "threefry4x32",
    "threshold",
    "tpu_keep_tile",
    "tpu_kernels",
]

FIELD_BITS = _random.FIELD_BITS
"""Bits of the random field each element compares with the threshold (16, at every
rate): one 128-bit Threefry call serves ``128 // FIELD_BITS`` elements."""

LANES = _random.LANES
"""Elements per packed word; bit ``l`` of a word is the keep-flag of its element ``l``."""

MASK_NAME = _random.MASK_NAME
"""Alias of :data:`dropmask.DROPOUT_MASK_NAME`: the name of the packed words for
``jax.checkpoint`` policies (``"dropout_mask"``)."""

PATHS = _random.PATHS
"""The ways of computing the ``"fast"`` mask: ``"packed"`` (packed flags kept out of the
consumer's fusion, the CPU default), ``"packed_inline"`` (the CUDA default) and
``"per_element"`` (elsewhere). All give the same mask."""


def key_words(key: Any) -> jax.Array:
    """The Threefry key of the ``"fast"`` mask: ``uint32[4]`` from ``key``.

    A Threefry key's two words ``(k0, k1)`` give ``(k0, k1, k0 ^ 0x9E3779B9, k1 ^
    0xBB67AE85)``; a key of another impl gives ``jax.random.bits(key, (4,), uint32)``.

    Args:
      key: a JAX PRNG key of any impl, or a raw ``uint32`` key.

    Returns:
      ``uint32[4]``.

    Example:
      >>> import jax
      >>> from dropmask import testing
      >>> [hex(int(w)) for w in testing.key_words(jax.random.key(1))]  # (k0, k1) = (0, 1)
      ['0x0', '0x1', '0x9e3779b9', '0xbb67ae84']
    """
    return _random.key_words(key)


def threshold(keep_prob: float | jax.Array) -> Threshold:
    """The integer threshold that keeps an element with probability about ``keep_prob``.

    Args:
      keep_prob: ``1 - rate``, a Python float or a JAX scalar: either way rounded in
        float32 to a multiple of ``2**-16``.

    Returns:
      A :class:`Threshold`: ``value`` (keep when a 16-bit field is below it) and
      ``realised`` (the exact keep probability, ``value / 2**16``).

    Example:
      >>> from dropmask import testing
      >>> t = testing.threshold(0.5)
      >>> (t.value, t.realised)
      (32768, 0.5)
    """
    return _random.threshold(keep_prob)


def _static_threshold(rate: float, caller: str) -> Threshold:
    value = check_rate(rate, caller=caller, allow_one=False)
    if value is None or value == 0.0:
        raise user_error(
            DropmaskValueError,
            f"rate must be a Python float in (0, 1), got {rate!r}; a rate of 0 has no mask to "
            "draw, and a traced rate has no static threshold",
            caller=caller,
        )
    return _random.threshold(_random.probability(value, value, keep=True, caller=caller))


def packed_mask_words(key: Any, shape: Sequence[int], rate: float) -> jax.Array:
    """The keep-flags of a whole ``shape`` mask, 32 to a ``uint32`` word, unexpanded.

    These are the words the packed paths compute before unpacking them into the
    consumer (for timing the generator apart from applying the mask, or checking a
    kernel that draws the same mask). Words run along the mask's packing axis, its
    last axis longer than 1.

    Args:
      key: a JAX PRNG key (traced is fine).
      shape: the mask's shape (Python ints).
      rate: the drop probability, a Python float in ``(0, 1)``.

    Returns:
      ``uint32[*word_shape]``: ``shape`` with the packing axis ``d`` replaced by
      ``ceil(d / 32)``; bit ``l`` of word ``w`` is the keep-flag of element ``32 * w + l``.

    Raises:
      RateError: ``rate`` outside ``[0, 1)``.
      DropmaskValueError: ``rate`` is 0 or not a Python float.

    Example:
      >>> import jax, numpy as np, dropmask
      >>> from dropmask import testing
      >>> key = jax.random.key(0)
      >>> words = testing.packed_mask_words(key, (2, 64), 0.1)
      >>> bits = (np.asarray(words)[..., None] >> np.arange(32, dtype=np.uint32)) & 1
      >>> keep = np.asarray(dropmask.keep_mask(key, (2, 64), 0.1))
      >>> bool((bits.reshape(2, 64).astype(bool) == keep).all())
      True
    """
    caller = "packed_mask_words"
    shape = check_shape(shape, caller=caller)
    thr = _static_threshold(rate, caller)
    return _random.packed_keep_words(_random.key_words(key), shape, thr)


def path_keep_mask(key: Any, shape: Sequence[int], rate: float, *, path: str) -> jax.Array:
    """``dropmask.keep_mask(key, shape, rate)`` computed by the chosen ``path``.

    Args:
      key: a JAX PRNG key.
      shape: the mask's shape (Python ints).
      rate: the drop probability, a Python float in ``(0, 1)``.
      path: one of :data:`PATHS`.

    Returns:
      ``bool[*shape]``, True where kept: the same on every path.

    Raises:
      DropmaskValueError: ``path`` is not one of :data:`PATHS`, or ``rate`` is 0.
      RateError: ``rate`` outside ``[0, 1)``.

    Example:
      >>> import jax, dropmask
      >>> from dropmask import testing
      >>> key = jax.random.key(0)
      >>> masks = [testing.path_keep_mask(key, (4, 64), 0.1, path=p) for p in testing.PATHS]
      >>> [bool((m == dropmask.keep_mask(key, (4, 64), 0.1)).all()) for m in masks]
      [True, True, True]
    """
    caller = "path_keep_mask"
    shape = check_shape(shape, caller=caller)
    thr = _static_threshold(rate, caller)
    return _random.keep_from_words(_random.key_words(key), shape, thr, path=path)


def path_dropout(
    x: jax.Array, rate: float, key: Any, *, path: str, residual: Residual = DEFAULT_RESIDUAL
) -> jax.Array:
    """``dropmask.dropout(x, rate, key, residual=residual)`` with the mask from ``path``.

    The mask is drawn inside ``jax.checkpoint`` with the library's policy for
    ``residual``: ``"mask"`` keeps the packed words (named ``"dropout_mask"``) where the
    path computes them, ``"none"`` keeps only the key words, and the backward pass
    draws the rest again by the same path.

    Args:
      x: floating array of any shape.
      rate: the drop probability, a Python float in ``(0, 1)``.
      key: a JAX PRNG key.
      path: one of :data:`PATHS`.
      residual: ``"mask"`` or ``"none"``, as in :func:`dropmask.dropout`.

    Returns:
      An array like ``x``: equal to ``dropmask.dropout(x, rate, key)``.

    Raises:
      DropmaskValueError: ``path`` is not one of :data:`PATHS`, ``residual`` is not a
        choice, or ``rate`` is 0.
      RateError: ``rate`` outside ``[0, 1)``.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> from dropmask import testing
      >>> x, key = jnp.ones((4, 64)), jax.random.key(0)
      >>> y = testing.path_dropout(x, 0.1, key, path="per_element", residual="none")
      >>> bool((y == dropmask.dropout(x, 0.1, key)).all())
      True
    """
    caller = "path_dropout"
    thr = _static_threshold(rate, caller)
    check_choice(path, PATHS, caller=caller, name="path")
    check_residual(residual, caller=caller)

    def body(x: jax.Array, words: jax.Array) -> jax.Array:
        keep = _random.keep_from_words(words, x.shape, thr, path=path)
        return _dropout._select_scaled(x, keep, thr.realised)

    policy = _random.SAVE_MASK_WORDS if residual == "mask" else _random.SAVE_NOTHING
    return jax.checkpoint(body, policy=policy)(x, _random.key_words(key))


def random_bits(key: Any, shape: Sequence[int]) -> jax.Array:
    """The generator's raw stream: ``uint32[*shape]``.

    Flat element ``i`` is output word ``i % 4`` of Threefry-4x32-13 at counter
    ``(i // 4, 0, 0, 0)`` under ``key_words(key)`` (for statistical test batteries).

    Args:
      key: a JAX PRNG key.
      shape: Python ints, fewer than ``2**32`` elements in all.

    Returns:
      ``uint32[*shape]``.

    Example:
      >>> import jax
      >>> from dropmask import testing
      >>> k = jax.random.key(0)
      >>> bool((testing.random_bits(k, (4, 8))[1] == testing.random_bits(k, (32,))[8:16]).all())
      True
    """
    return _random.random_bits(key, tuple(check_shape(shape, caller="random_bits")))


def tpu_kernels(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Inside it, ``dropmask.dropout`` (and the layers over it) draw their masks by the TPU
    kernel where it serves the shape, and ``dot_product_attention`` runs its Pallas TPU
    kernels for ``algorithm="pallas"`` (and ``"auto"`` from 512 x 512 scores) where they
    serve the call (``enabled=True``); or both take XLA's paths (``enabled=False``),
    whatever the backend and devices. The kernels compile on a TPU and run in Pallas's
    TPU interpreter elsewhere. Every way draws the same bits.

    Outside it the kernels are traced where the default backend is a TPU, with any
    number of devices, and run where the program is lowered for a TPU (XLA's paths for
    any other platform); under a mesh of explicit axes on each device's block, in a
    program XLA partitions itself not at all (``docs/many_chips.md``).
    ``tpu_kernels(False)`` is also the way around a kernel that Mosaic fails to compile.
    See ``docs/dropout_speed.md``, "The TPU", and ``docs/attention.md``, "On a TPU".

    The choice is made when a mask is traced, and JAX's caches key on it: a function
    jitted outside and called inside is traced again inside, once (where JAX lacks
    ``jax.make_user_context``, its caches are cleared on entry and on exit instead).

    Args:
      enabled: True for the kernel, False for XLA's path.

    Returns:
      A context manager that holds the choice while it is entered.

    Raises:
      DropmaskTypeError: ``enabled`` is not a bool.

    Example:
      >>> import jax, jax.numpy as jnp, dropmask
      >>> from dropmask import testing
      >>> x, key = jnp.ones((32, 128)), jax.random.key(0)
      >>> with testing.tpu_kernels():
      ...     y = dropmask.dropout(x, 0.1, key)
      >>> with testing.tpu_kernels(False):
      ...     z = dropmask.dropout(x, 0.1, key)
      >>> bool((y == z).all())
      True
    """
    check_instance(
        enabled,
        bool,
        caller="tpu_kernels",
        name="enabled",
        what="a bool",
        fix="Pass True to draw by the TPU kernel, False to draw by XLA's path.",
    )
    return _random.tpu_kernels(enabled)


def tpu_keep_tile(
    key_words: Sequence[Any],
    threshold_value: Any,
    row_words: jax.Array,
    first_word: Any,
    shape: tuple[int, int],
) -> jax.Array:
    """The ``"fast"`` mask's keep-flags of a tile of rows, computed as the TPU kernels
    compute them: inside a Pallas TPU kernel (or anywhere JAX runs).

    Each Threefry call is computed once and its 8 flags reach their 8 elements by a
    product on the matrix unit, so a kernel of one's own draws the same mask as
    ``dropmask.dropout`` without a lane shuffle. A tile narrower than 1024 columns has
    fewer than 128 calls a row, which would leave lanes idle: given ``row_words`` as a
    row, ``[1, rows]``, it is computed with the rows along the lanes instead (worth it
    where ``rows`` is a multiple of 128); the flags are the same either way.

    Args:
      key_words: the four key words (:func:`key_words`), as ``uint32`` scalars (read
        from scalar memory inside a kernel).
      threshold_value: the integer threshold (:func:`threshold`'s ``value``), an int or
        an ``int32`` scalar.
      row_words: ``uint32[rows, 1]`` (or ``[1, rows]``): the index, among the mask's
        words (32 elements each along its last axis), of each row's first word.
      first_word: added to every row's word: the tile's first column over 32.
      shape: ``(rows, cols)``, ``cols`` a multiple of 32.

    Returns:
      ``bool[rows, cols]``, True where the element is kept.

    Example:
      >>> import jax, numpy as np
      >>> from dropmask import keep_mask, testing
      >>> key = jax.random.key(0)
      >>> rows = np.arange(8, dtype=np.uint32)[:, None] * np.uint32(128 // 32)
      >>> thr = testing.threshold(0.9).value
      >>> tile = testing.tpu_keep_tile(testing.key_words(key), thr, rows, 0, (8, 128))
      >>> bool((tile == keep_mask(key, (8, 128), 0.1)).all())
      True

    Raises:
      DropmaskValueError: ``shape`` is not two positive ints with ``cols`` a multiple
        of 32, or ``key_words`` is not four words.
      MaskShapeError: ``row_words`` is neither ``[rows, 1]`` nor ``[1, rows]``.
    """
    caller = "testing.tpu_keep_tile"
    dims = check_shape(shape, caller=caller)
    if len(dims) != 2 or 0 in dims or dims[1] % 32:
        raise user_error(
            DropmaskValueError,
            f"shape must be (rows, cols), both positive and cols a multiple of 32 (a word "
            f"of flags), got {shape!r}",
            "Draw a wider tile and slice it, e.g. shape=(8, 128).",
            caller=caller,
        )
    words = list(key_words)
    if len(words) != 4:
        raise user_error(
            DropmaskValueError,
            f"key_words must be the key's four words, got {len(words)}",
            "Pass testing.key_words(key).",
            caller=caller,
        )
    if jax.numpy.shape(row_words) != (1, dims[0]):
        check_shape_is(
            jax.numpy.shape(row_words),
            (dims[0], 1),
            caller=caller,
            name="row_words",
            layout="uint32[rows, 1] (or [1, rows])",
            fix="Give each row's first word as a column, or as a row.",
        )
    return _random.keep_tile(words, threshold_value, row_words, first_word, dims)
