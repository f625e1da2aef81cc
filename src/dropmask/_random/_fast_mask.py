"""The ``"fast"`` keep-mask: Threefry blocks cut into bit-packed words of 32 elements.

The mask is cut into words of 32 consecutive elements along its *packing axis* (its
last axis longer than 1). Word ``n`` (its row-major index among all words of the
global mask) takes four 128-bit Threefry-4x32-13 blocks at counters ``(n, j, 0, 0)``
under the four key words; its element ``l`` reads the ``l``-th 16-bit field of those
blocks and is kept when the field is below an integer threshold, ``round(p * 2**16)``
for a keep probability ``p`` in float32. Every rate, a Python number or a JAX scalar,
is drawn at that one precision, so a static rate and the same rate as a JAX scalar draw
the same mask. Element values depend only on ``(key, global position)``, so the mask is
the same under ``jit`` or not, under ``vmap`` over keys and for any sharding.

Speed. One Threefry call serves 8 elements on CPU and CUDA GPUs: a call's keep-flags
are computed once, bit-packed (1 bit per element in memory) and unpacked inside the
consumer's fusion. A word's flags are stored in the four bytes its four calls fill
(the parts of a word are its ``uint32``'s little-endian bytes), so a mask's program
holds the rounds once, not once per call of a word, and the parts are unpacked as they
are, never joined. XLA:CPU would fuse the generator into the elementwise consumer and
recompute it for every element, so there the parts end in an integer division by a
run-time 1, which XLA counts as expensive and does not duplicate into a consumer that
reads each part many times (``_jitted_flags``). XLA:GPU's cost model keeps the
generator in its own fusion unaided (seen on an H200 at 2**24 and 2**26 elements; at
2**16 it fused them, where recomputing is cheap). Other backends compute each
element's field directly, which needs no materialised flags. All paths give identical
masks.

Backward pass. The packed paths name their flags ``MASK_NAME`` (``"dropout_mask"``)
with ``jax.ad_checkpoint.checkpoint_name``, so that a ``jax.checkpoint`` policy can keep
them as the residual of reverse-mode autodiff (``_random``'s entry point does by
default): the backward pass is then one unpack-and-select. The per-element path names
nothing and is always regenerated from the key words.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from .._errors import DropmaskValueError, user_error
from ._sharding import Block, explicitly_sharded_axes
from ._threefry import threefry4x32

__all__ = [
    "FIELD_BITS",
    "MASK_NAME",
    "Threshold",
    "default_path",
    "first_element",
    "keep_from_words",
    "key_source",
    "key_words",
    "loop_zero",
    "packed_keep_words",
    "packed_words",
    "random_bits",
    "threshold",
    "unpack_words",
    "words_of",
]

MASK_NAME = "dropout_mask"
"""The name the packed words carry for ``jax.checkpoint`` policies.

Saving them (1 bit per element) spares the backward pass a second Threefry pass, which
costs more than writing and reading that bit; a policy that does not save them makes
the backward pass regenerate them from the key words.
"""
LANES = 32  # elements per packed word: one uint32 of keep-flags
_BLOCK_BITS = 128  # bits per Threefry-4x32 call
_U32 = np.uint32
# Every "fast" mask compares 16-bit fields: a keep probability is drawn to 2**-16, static
# or run-time alike, and the threshold (at most 2**16) is exact in float32.
FIELD_BITS = 16
_LEVELS = 2**FIELD_BITS
# The two key words a Threefry key adds to its own two: its words xor these constants
# (the fractional parts of the golden ratio and of sqrt(3), as in TEA and SHA-256), so
# that all four Threefry key words vary with the key from the first round on.
_KEY_SPREAD = (0x9E3779B9, 0xBB67AE85)


def key_source(key: Any) -> jax.Array:
    """What the generator takes from ``key``: a Threefry key's own two words (the
    generator derives the other two, so a backward pass that draws again keeps only
    these), or the four key words of another impl (:func:`key_words`)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) == "threefry2x32":
            return jax.random.key_data(key)
    elif jax.config.values["jax_default_prng_impl"] == "threefry2x32":
        return jnp.asarray(key, _U32)
    return jax.random.bits(key, (4,), _U32)


def _words(source: jax.Array) -> list[jax.Array]:
    """The four Threefry key words from :func:`key_source`: a Threefry key's own two
    words ``(k0, k1)`` give ``(k0, k1, k0 ^ c0, k1 ^ c1)``; no hash, so a mask's program
    computes no key of its own (``split`` and ``fold_in`` already hash their keys)."""
    words = [lax.index_in_dim(source, i, keepdims=False) for i in range(source.shape[0])]
    if len(words) == 4:
        return words
    k0, k1 = words
    return [
        k0,
        k1,
        lax.bitwise_xor(k0, _U32(_KEY_SPREAD[0])),
        lax.bitwise_xor(k1, _U32(_KEY_SPREAD[1])),
    ]


def words_of(source: jax.Array) -> jax.Array:
    """``uint32[4]``: the four Threefry key words from :func:`key_source`'s words."""
    return jnp.stack(_words(source))


def key_words(key: Any) -> jax.Array:
    """``uint32[4]``: the Threefry key words of ``key`` (a key of any impl, or raw): a
    Threefry key's ``(k0, k1, k0 ^ c0, k1 ^ c1)``, another impl's ``jax.random.bits(key,
    (4,), uint32)``."""
    return words_of(key_source(key))


@dataclasses.dataclass(frozen=True)
class Threshold:
    """``keep = field < value`` for a ``FIELD_BITS``-bit random field.

    True with probability ``realised = value / 2**FIELD_BITS``.

    Example:
      >>> import numpy as np
      >>> from dropmask import testing
      >>> t = testing.threshold(0.25)
      >>> fields = np.arange(2**16)  # every 16-bit field once
      >>> t.value, float(np.mean(fields < t.value)) == t.realised
      (16384, True)
    """

    value: Any  # int in [0, 2**16], or a traced uint32 scalar
    realised: Any  # float, or a traced float32 scalar


def threshold(p: Any) -> Threshold:
    """The integer threshold for "True with probability p", static or traced ``p``.

    ``round(float32(p) * 2**16)`` (half to even) either way, so a Python ``p`` and the
    same value as a float32 scalar give the same threshold.
    """
    if isinstance(p, int | float):
        value = int(np.round(np.float32(p) * np.float32(_LEVELS)))
        return Threshold(value, value / _LEVELS)
    p = jnp.asarray(p, jnp.float32)
    value = jnp.round(jnp.clip(p, 0.0, 1.0) * jnp.float32(_LEVELS))
    # A run-time probability cannot be validated at trace time; outside [0, 1] (or NaN)
    # it yields realised = NaN, which callers turn into NaN outputs or an all-dropped
    # mask, never a clip.
    realised = jnp.where((p >= 0) & (p <= 1), value / _LEVELS, jnp.nan)
    return Threshold(value.astype(_U32), realised)


def compare(field: jax.Array, thr: Threshold) -> jax.Array:
    """Boolean keep-flags from random fields (an integer compare, no floats)."""
    if isinstance(thr.value, int) and thr.value >= _LEVELS:
        return jnp.ones(field.shape, bool)
    return field < jnp.asarray(thr.value, _U32)


@dataclasses.dataclass(frozen=True)
class Fields:
    """Where lane ``l`` of a word finds its ``nbits`` bits in the word's Threefry blocks."""

    nbits: int

    @property
    def per_output(self) -> int:  # fields per 32-bit output word
        return 32 // self.nbits

    @property
    def per_call(self) -> int:  # fields per 128-bit block
        return _BLOCK_BITS // self.nbits

    @property
    def calls(self) -> int:  # Threefry calls per word of LANES elements
        return -(-LANES // self.per_call)

    @property
    def part_bits(self) -> int:
        """Bits of one packed part: the lanes of one call (of two for 32-bit fields), at
        least a byte, at most a word."""
        return min(LANES, max(self.per_call, 8))

    @property
    def parts(self) -> int:  # parts per word of LANES elements
        return LANES // self.part_bits

    @property
    def calls_per_part(self) -> int:
        return self.calls // self.parts

    @property
    def part_dtype(self) -> Any:
        return {8: jnp.uint8, 16: jnp.uint16, 32: _U32}[self.part_bits]

    def locate(self, lane: Any) -> tuple[Any, Any, Any]:
        """(call ``j``, output word ``o``, bit offset) of ``lane``'s field."""
        within = lane % self.per_call
        return (
            lane // self.per_call,
            within // self.per_output,
            (within % self.per_output) * self.nbits,
        )

    def extract(self, output: jax.Array, bit: Any) -> jax.Array:
        field = output >> jnp.asarray(bit, _U32) if not isinstance(bit, int) or bit else output
        return field & _U32(2**self.nbits - 1) if self.nbits < 32 else field


FIELDS = Fields(FIELD_BITS)  # the layout of every "fast" mask


def packing_axis(global_shape: tuple[int, ...]) -> int:
    """The axis words run along: the last one longer than 1 (so [batch, time, 1] packs time)."""
    longer = [i for i, d in enumerate(global_shape) if d > 1]
    return longer[-1] if longer else len(global_shape) - 1


def check_word_count(global_word_shape: tuple[int, ...]) -> None:
    size = math.prod(global_word_shape)
    if size >= 2**32:
        raise user_error(
            DropmaskValueError,
            f"impl='fast' numbers mask words ({LANES} elements each) with 32 bits, but the mask "
            f"needs {size} >= 2**32 words (global word shape {global_word_shape})",
            "Split the array, share the mask along an axis with broadcast_dims, or use "
            "impl='flax'.",
            caller=None,
        )


def _row_major(coords: Sequence[jax.Array], global_word_shape: tuple[int, ...]) -> jax.Array:
    """uint32 row-major index, among the global words, of global word coordinates."""
    index = lax.bitwise_and(coords[0], _U32(0))  # 0, as varying as the coordinates
    stride = 1
    for axis in reversed(range(len(global_word_shape))):
        if global_word_shape[axis] > 1:
            index = lax.add(index, lax.mul(coords[axis], _U32(stride)))
        stride *= global_word_shape[axis]
    return index


def _coords(shape: tuple[int, ...], start: Sequence[Any]) -> list[jax.Array]:
    """Global coordinates ``start + iota`` of every entry of a local ``shape``, per axis;
    built from iotas so that any sharding computes them locally.

    Each axis's coordinates are its length's iota plus its start, broadcast: with a
    start that depends on the key (:func:`_tie`), nothing of ``shape``'s size is a
    constant that a differentiated scan would compute before its loop (:func:`loop_zero`).
    """
    return [
        lax.broadcast_in_dim(
            lax.add(lax.iota(_U32, shape[axis]), _as_u32(start[axis])), shape, (axis,)
        )
        for axis in range(len(shape))
    ]


def _as_u32(x: Any) -> Any:
    """``x`` as a uint32 operand: an int as a NumPy scalar (a literal), an array converted
    in lax (a ``jnp`` conversion traces several times slower)."""
    if isinstance(x, int):
        return _U32(x)
    return lax.convert_element_type(x, _U32)


def _packed_flags(
    words: jax.Array, index: jax.Array, part: jax.Array, thr: Threshold, apart: bool = False
) -> jax.Array:
    """Keep-flags of part ``part`` of the words numbered ``index``: bit ``l`` for lane
    ``l`` of the part, in ``FIELDS.part_dtype``; kept out of the consumer's fusion when
    ``apart``.

    One ``jax.jit`` per threshold kind and shape: a mask's generator ops are traced once
    and enter every enclosing program, and every transformation of it, as one call (XLA
    inlines it before fusing).
    """
    value, static_value = _split_value(thr)
    return _jitted_flags(words, index, part, value, static_value, apart)


def loop_zero(x: jax.Array) -> jax.Array:
    """A 0 of ``x``'s dtype computed from ``x``'s first element, which XLA folds away;
    it broadcasts against ``x``.

    Differentiating a scan (``nn.scan``, ``lax.scan``), JAX computes whatever in the
    scanned body depends on no carried or scanned value once, before the loop, and
    passes it in whole. ``jnp.where(m, x, c)`` broadcasts ``c`` (and a constant ``m``)
    to ``x``'s shape, so such a fill becomes an array of ``x``'s size, held for the
    whole loop and read back at every iteration. A fill of ``loop_zero(x) + c``, and a
    mask ``m | (loop_zero(x) != 0)``, depend on ``x`` instead; XLA folds them back to
    the constant and the mask inside the fusion that uses them.

    A scalar, except for an ``x`` sharded under a mesh of explicit axes: one element
    of a sharded axis lives on one device, so a scalar from it would need the others
    to receive it (JAX refuses the slice). There the 0 keeps ``x``'s sharded axes
    whole and its other axes 1 (``x``'s rank), and each device computes its part.
    """
    if x.size == 0:
        return jnp.zeros((), x.dtype)
    first = first_element(x)
    unsigned = np.dtype(f"uint{np.dtype(x.dtype).itemsize * 8}")
    if x.dtype == np.bool_:  # flags: no bit cast from bool
        bits = lax.convert_element_type(first, unsigned)
    else:
        bits = lax.bitcast_convert_type(first, unsigned)
    return lax.convert_element_type(lax.bitwise_and(bits, unsigned.type(0)), x.dtype)


def first_element(x: jax.Array) -> jax.Array:
    """``x``'s first element, computed where ``x`` lives: a scalar, except for an ``x``
    sharded under a mesh of explicit axes, where one element of a sharded axis lives on
    one device (JAX refuses that slice). There it keeps ``x``'s sharded axes whole and
    its other axes 1 (``x``'s rank): each device's first element."""
    sharded = explicitly_sharded_axes(x)
    size = tuple(n if axis in sharded else 1 for axis, n in enumerate(x.shape))
    first = lax.slice(x, (0,) * x.ndim, size)
    return first if sharded else lax.reshape(first, ())


def _tie(source: jax.Array) -> jax.Array:
    """:func:`loop_zero` of ``source`` (the key's words, or the packed flags) as a
    uint32: added to a mask's counter starts and bit patterns, it ties them to the key
    or the flags."""
    return loop_zero(source).astype(_U32)


def _run_time_zero(source: jax.Array) -> jax.Array:
    """A uint32 0 that XLA cannot fold, from the key's first word.

    The counters of a mask depend on no key; inside a loop (a scan over layers, a loop
    of passes) XLA hoists them out as a uint32 array per part and reads it back at every
    iteration (the [4096, 4096] forward+backward pass in a loop took 1.8x ``x * c``
    against 1.6x). Started from this 0 they vary with the key and stay in the
    generator's fusion, computed from iotas.
    """
    first = lax.index_in_dim(lax.reshape(source, (source.size,)), 0, keepdims=False)
    return lax.sub(lax.bitwise_or(lax.shift_right_logical(first, _U32(31)), _U32(1)), _U32(1))


def _split_value(thr: Threshold) -> tuple[Any, int | None]:
    """``(traced, static)`` threshold value for a jitted core: one of them is None."""
    return (None, thr.value) if isinstance(thr.value, int) else (thr.value, None)


def _call_lanes(outputs: list[jax.Array], value: Any) -> jax.Array:
    """The keep-flags of one Threefry call's lanes (its 128-bit block ``outputs``): bit
    ``l`` for lane ``l``, in a uint32."""
    packed = None
    for lane in range(FIELDS.per_call):
        _, o, bit = FIELDS.locate(lane)
        field = outputs[o]
        if bit:  # the high half: the shift leaves 16 bits
            field = lax.shift_right_logical(field, _U32(bit))
        else:
            field = lax.bitwise_and(field, _U32(_LEVELS - 1))
        keep = lax.convert_element_type(lax.lt(field, value), _U32)
        if lane:
            keep = lax.shift_left(keep, _U32(lane))
        packed = keep if packed is None else lax.bitwise_or(packed, keep)
    assert packed is not None
    return packed


@functools.partial(jax.jit, static_argnums=(4, 5))
def _jitted_flags(
    words: jax.Array,
    index: jax.Array,
    part: jax.Array,
    value: jax.Array | None,
    static_value: int | None,
    apart: bool,
) -> jax.Array:
    """The packed keep-flags, one part per element of ``index``.

    A word's four calls are spread over its four parts (call ``j`` fills part ``j``),
    not written side by side: the program holds one copy of the rounds instead of one
    per call, and the parts need no reduction to join, since the consumer unpacks them
    as they are.

    ``apart``: the parts end in an integer division by a run-time 1 (derived from a key
    word, so XLA cannot fold it). XLA counts such a division as expensive and does not
    fuse an expensive producer into a consumer that reads each of its elements many
    times, as unpacking does; so the rounds run once per part, in a fusion of their
    own, and are not recomputed for each of a part's elements. It replaced a
    ``lax.cond`` that did the same at a higher compile cost (docs/dropout_speed.md).
    """
    key = _words(words)
    if static_value is not None and static_value >= _LEVELS:  # a threshold of 2**16
        # All ones, from the counters: a constant array would be computed before a
        # differentiated scan's loop (``_coords``).
        packed = lax.bitwise_or(lax.bitwise_and(index, _U32(0)), _U32(2**FIELDS.per_call - 1))
    else:
        threshold = value if static_value is None else _U32(static_value)
        packed = _call_lanes(threefry4x32((index, part, 0, 0), key), threshold)
    packed = lax.convert_element_type(packed, FIELDS.part_dtype)
    if apart:
        one = lax.bitwise_or(lax.shift_right_logical(key[0], _U32(31)), _U32(1))
        packed = lax.div(packed, one.astype(packed.dtype))
    return packed


def packed_keep_words(words: jax.Array, shape: tuple[int, ...], thr: Threshold) -> jax.Array:
    """The keep-flags of a whole ``shape`` mask as the packed paths compute them, unexpanded
    and joined into ``uint32`` words along the packing axis: bit ``l`` of word ``w`` for
    element ``32 * w + l`` (for measuring the generator apart from applying the mask).

    A word's parts are computed along an axis of their own, ahead of the packing axis,
    and joined by ors of its slices: the generator's loop then runs along the words, as
    the packed paths' loop runs along the parts. Joined along a trailing axis of 4 parts,
    XLA:CPU vectorised the rounds 4 wide (one word at a time) instead of 16 wide, and
    the generator took twice as long.
    """
    shape = shape or (1,)
    axis = packing_axis(shape)
    word_shape = _with(shape, axis, -(-shape[axis] // LANES))
    check_word_count(word_shape)
    split = (*word_shape[:axis], FIELDS.parts, *word_shape[axis:])
    coords = _coords(split, (_tie(words),) * len(split))
    part = coords.pop(axis)
    parts = _packed_flags(words, _row_major(coords, word_shape), part, thr).astype(_U32)
    bits = jnp.iinfo(FIELDS.part_dtype).bits
    joined = lax.index_in_dim(parts, 0, axis, keepdims=False)
    for p in range(1, FIELDS.parts):
        part_p = lax.index_in_dim(parts, p, axis, keepdims=False)
        joined = joined | lax.shift_left(part_p, _U32(p * bits))
    return joined


def _part_counters(
    part_shape: tuple[int, ...],
    part_start: Sequence[Any],
    axis: int,
    global_word_shape: tuple[int, ...],
) -> tuple[jax.Array, jax.Array]:
    """The word numbers (row-major among the global words) and part numbers within them
    of a block of parts starting at global part coordinates ``part_start``."""
    coords = _coords(part_shape, part_start)
    # Four parts a word: a mask and a shift, not jnp's floor_divide and remainder.
    part = lax.bitwise_and(coords[axis], _U32(FIELDS.parts - 1))
    coords[axis] = lax.shift_right_logical(coords[axis], _U32(FIELDS.parts.bit_length() - 1))
    return _row_major(coords, global_word_shape), part


PATHS = ("packed", "packed_inline", "per_element")


def keep_from_words(
    words: jax.Array,
    shape: tuple[int, ...],
    thr: Threshold,
    block: Block | None = None,
    *,
    path: str | None = None,
) -> jax.Array:
    """``bool[*shape]`` keep-mask from ``key_source(key)`` (or ``key_words(key)``), True
    with probability
    ``thr.realised``; within ``block``'s global mask when given.

    ``path`` picks how it is computed; all give the same mask. ``"packed"``: packed
    flags kept out of the consumer's fusion (by a division XLA counts as expensive);
    ``"packed_inline"``: packed flags as plain ops; ``"per_element"``: one Threefry call
    per element. None means the fastest measured per backend: packed on CPU,
    packed_inline on CUDA, per_element elsewhere (the default backend's, when the mask
    is traced). The packed paths name their flags (the ``uint8`` parts of the words)
    ``MASK_NAME`` for ``jax.checkpoint`` policies (1 bit per element to save for the
    backward pass).
    """
    if path is not None and path not in PATHS:
        raise user_error(
            DropmaskValueError,
            f"path must be one of {PATHS} or None, got {path!r}",
            caller=None,
        )
    if not shape:
        scalar = None if block is None else Block((1,), (0,))
        return keep_from_words(words, (1,), thr, scalar, path=path)[0]
    global_shape = shape if block is None else block.global_shape
    offset = (0,) * len(shape) if block is None else block.offset
    axis = packing_axis(global_shape)
    global_word_shape = _with(global_shape, axis, -(-global_shape[axis] // LANES))
    check_word_count(global_word_shape)
    lane0 = offset[axis] % LANES  # where the local block starts within its first word
    word_start = _with(offset, axis, offset[axis] // LANES)

    def packed_path(apart: bool) -> jax.Array:
        return unpack_words(packed_words(words, shape, thr, block, apart=apart), shape, block)

    def per_element_path() -> jax.Array:
        # Static starts stay Python ints (constants XLA folds, nothing a backward pass
        # keeps); traced ones (shard_map's axis_index) are the jitted core's arguments.
        start = (*_with(offset, axis, lane0), word_start[axis])
        static = tuple(s if isinstance(s, int) else None for s in start)
        traced = tuple(None if isinstance(s, int) else s for s in start)
        value, static_value = _split_value(thr)
        return _per_element_flags(
            words, traced, value, static, shape, axis, global_word_shape, static_value
        )

    path = default_path() if path is None else path
    if path == "packed":
        return packed_path(apart=True)
    if path == "packed_inline":
        return packed_path(apart=False)
    return per_element_path()


def _packed_layout(
    shape: tuple[int, ...], block: Block | None
) -> tuple[int, tuple[int, ...], tuple[Any, ...], Any]:
    """``(axis, global word shape, offset, first)`` of a non-scalar mask's packed parts:
    ``first`` is the bit of its first part where the local block starts."""
    global_shape = shape if block is None else block.global_shape
    offset = (0,) * len(shape) if block is None else block.offset
    axis = packing_axis(global_shape)
    global_word_shape = _with(global_shape, axis, -(-global_shape[axis] // LANES))
    return axis, global_word_shape, tuple(offset), offset[axis] % FIELDS.part_bits


def packed_words(
    words: jax.Array, shape: tuple[int, ...], thr: Threshold, block: Block | None, *, apart: bool
) -> jax.Array:
    """The packed paths' keep-flags of a non-scalar ``shape`` mask (within ``block``'s
    global mask when given), as the parts that :func:`unpack_words` expands, named
    ``MASK_NAME``; kept out of the consumer's fusion when ``apart``."""
    axis, global_word_shape, offset, first = _packed_layout(shape, block)
    check_word_count(global_word_shape)
    bits = FIELDS.part_bits
    # One part more when the block may start mid-part (its last part then spills).
    spill = 0 if isinstance(first, int) and first == 0 else 1
    part_shape = _with(shape, axis, -(-shape[axis] // bits) + spill)
    part_start = _with(offset, axis, offset[axis] // bits)
    # Every axis starts at a 0 from the key: an invariant axis's share of the counter
    # would be hoisted out of a loop. Apart, by XLA too, so there the 0 is one XLA
    # cannot fold.
    zero = _run_time_zero(words) if apart else _tie(words)
    part_start = tuple(lax.add(zero, _as_u32(s)) for s in part_start)
    index, part = _part_counters(part_shape, part_start, axis, global_word_shape)
    return checkpoint_name(_packed_flags(words, index, part, thr, apart), MASK_NAME)


def unpack_words(packed: jax.Array, shape: tuple[int, ...], block: Block | None) -> jax.Array:
    """``bool[*shape]`` from :func:`packed_words`' parts."""
    axis, _, _, first = _packed_layout(shape, block)
    # Tied to the packed flags, not the key: a backward pass that keeps the flags
    # unpacks them without the key's words.
    return _unpack(packed, shape, axis, first, _tie(packed))


def default_path() -> str:
    """The fastest measured path on the default backend: packed on CPU, packed_inline on
    CUDA, per_element elsewhere (ROCm also calls itself ``"gpu"``).

    Chosen when the mask is traced, not when it is lowered: ``lax.platform_dependent``
    would trace all three paths at every mask (the inline one with all of a word's
    Threefry calls), about half of what tracing a dropout site costs. A program
    exported for another platform still draws the same mask, by this backend's path.
    """
    backend = jax.extend.backend.get_backend()
    if backend.platform == "cpu":
        return "packed"
    if backend.platform == "gpu" and "rocm" not in backend.platform_version.lower():
        return "packed_inline"
    return "per_element"


@functools.partial(jax.jit, static_argnums=range(3, 8))
def _per_element_flags(
    words: jax.Array,
    traced_start: tuple[Any, ...],
    value: jax.Array | None,
    static_start: tuple[int | None, ...],
    shape: tuple[int, ...],
    axis: int,
    global_word_shape: tuple[int, ...],
    static_value: int | None,
) -> jax.Array:
    """``keep_from_words``'s per-element path (one Threefry call per element), traced
    once per shape and threshold kind as ``_jitted_flags`` is. The start (per axis, then
    the packing axis's first word) is split into static and traced parts."""
    thr = Threshold(static_value if value is None else value, None)
    start = [t if s is None else s for s, t in zip(static_start, traced_start, strict=True)]
    tie = _tie(words)
    start = [tie + s for s in start]
    coords = _coords(shape, start[:-1])
    position = coords[axis]  # counted from the start of the block's first word
    coords[axis] = position // _U32(LANES) + jnp.asarray(start[-1]).astype(_U32)
    index = _row_major(coords, global_word_shape)
    j, o, bit = FIELDS.locate(position % _U32(LANES))
    zero = jnp.zeros((), _U32)
    outputs = threefry4x32((index, j.astype(_U32), zero, zero), _words(words))
    chosen = outputs[0]
    for k in range(1, 4):
        chosen = jnp.where(o == k, outputs[k], chosen)
    return compare(FIELDS.extract(chosen, bit), thr)


def _with(values: Sequence[Any], axis: int, value: Any) -> tuple[Any, ...]:
    return tuple(value if i == axis else v for i, v in enumerate(values))


def _unpack(
    flags: jax.Array, shape: tuple[int, ...], axis: int, lane0: Any, tie: jax.Array
) -> jax.Array:
    """``bool[*shape]`` from packed parts along ``axis`` (as many lanes each as the bits
    of their dtype), starting at bit ``lane0`` of the first; ``tie`` is :func:`_tie`."""
    n_parts, dtype = flags.shape[axis], flags.dtype
    bits = jnp.iinfo(dtype).bits
    spread = lax.broadcast_in_dim(
        flags,
        (*flags.shape[: axis + 1], bits, *flags.shape[axis + 1 :]),
        tuple(d if d <= axis else d + 1 for d in range(flags.ndim)),
    )
    spread = lax.reshape(spread, _with(flags.shape, axis, n_parts * bits))
    if isinstance(lane0, int):
        spread = lax.slice_in_dim(spread, lane0, lane0 + shape[axis], axis=axis)
    else:
        spread = lax.dynamic_slice_in_dim(spread, lane0, shape[axis], axis=axis)
    # One axis's bit pattern, broadcast: tied to the flags, nothing of ``shape``'s size
    # is a constant a differentiated scan would hoist (``_coords``).
    lane = lax.add(lax.add(lax.iota(_U32, shape[axis]), _as_u32(lane0)), tie)
    lane = lax.convert_element_type(lax.bitwise_and(lane, _U32(bits - 1)), dtype)
    bit = lax.broadcast_in_dim(lax.shift_left(np.dtype(dtype).type(1), lane), shape, (axis,))
    # Testing the bit in place, not shifting it down: the bf16 forward pass ran 6% faster
    # per pass on CPU (median of 81 paired passes at [4096, 4096]; f32 unchanged).
    return lax.ne(lax.bitwise_and(spread, bit), np.dtype(dtype).type(0))


def random_bits(key: Any, shape: Sequence[int]) -> jax.Array:
    """The generator's raw stream: ``uint32[*shape]``; flat element ``i`` is output word
    ``i % 4`` of Threefry-4x32-13 at counter ``(i // 4, 0, 0, 0)`` under ``key_words(key)``.

    Example:
      >>> import jax, dropmask._random._fast_mask as r
      >>> k = jax.random.key(0)
      >>> bool((r.random_bits(k, (4, 8))[1] == r.random_bits(k, (32,))[8:16]).all())
      True
    """
    return _jitted_bits(key, tuple(int(d) for d in shape))


@functools.partial(jax.jit, static_argnums=1)
def _jitted_bits(key: Any, shape: tuple[int, ...]) -> jax.Array:
    size = math.prod(shape)
    if size >= 2**32:
        raise user_error(
            DropmaskValueError,
            "random_bits indexes words with 32 bits, so it draws fewer than 2**32 at a time; "
            f"shape {shape} has {size}",
            "Draw it in pieces.",
            caller=None,
        )
    words = key_words(key)
    # Element by element (each computes its block and keeps one word of it): stacking
    # the four outputs instead makes XLA's concatenate emitter re-expand the shared
    # round expressions, which is thousands of times slower.
    flat = lax.iota(_U32, size)
    zero = jnp.zeros((), _U32)
    outputs = threefry4x32((flat >> _U32(2), zero, zero, zero), [words[i] for i in range(4)])
    which = flat & _U32(3)
    chosen = outputs[0]
    for k in range(1, 4):
        chosen = jnp.where(which == k, outputs[k], chosen)
    return chosen.reshape(shape)
