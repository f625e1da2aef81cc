"""Threefry-4x32-13: the counter-based block function behind ``impl="fast"``.

Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011):
Threefry is the Threefish block cipher with the key schedule kept and the tweak dropped;
4x32 maps a 128-bit counter and a 128-bit key to 128 random bits. Its authors report
that Threefry-4x32 passes TestU01's BigCrush from 12 rounds on; Random123 offers 13 as
the fast choice with a margin and 20 (its default) with a wide one, and publishes
known-answer vectors for both, which the tests check. 13 rounds keep a dropout site's
compiled program small (each round is ten ops that every site compiles; see
``docs/design.md``). It needs only 32-bit adds, rotates and xors, which vectorise on every
backend without 64-bit integers (Philox needs a 32x32->64 multiply, which costs about
twice as much emulated in 32 bits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["ROUNDS", "Ops", "threefry4x32"]

# Random123's rotation constants for Threefry-4x32, one pair per round (mod 8).
_ROTATIONS = ((10, 26), (11, 21), (13, 27), (23, 5), (6, 20), (17, 11), (25, 10), (18, 20))
_PARITY = 0x1BD11BDA  # the Threefish key-schedule parity constant
ROUNDS = 13
_U32 = np.uint32


def _u32(x: Any) -> jax.Array:
    return x if isinstance(x, jax.Array) and x.dtype == _U32 else jnp.asarray(x, _U32)


# The rounds call lax directly: each ``jnp`` operator is a small jitted function that
# tracing inlines, which made tracing one dropout about 1.7 times slower. Same ops.
class Ops:
    """uint32 add, xor and rotate whose smaller operand (a shift amount, a key word, a
    counter word) is broadcast to the other's shape once per call of the block function,
    not at every use: lax broadcasts a scalar operand again each time, which put 195
    broadcasts of 20 distinct values into one mask's program.

    ``tie``, a uint32 scalar 0 computed from the key, is or-ed into every constant
    before it is broadcast. Differentiating a scan (``nn.scan``, ``lax.scan``), JAX
    computes whatever in the scanned body depends on no carried or scanned value once,
    before the loop, and passes it in whole: a broadcast constant becomes an array of
    the counters' size read from memory at every iteration. Tied to the key, each stays
    a constant XLA folds into the generator's fusion.
    """

    def __init__(self, tie: jax.Array | None = None) -> None:
        self._made: dict[tuple[tuple[int, ...], Any], tuple[Any, jax.Array]] = {}
        self._tie = tie

    def like(self, x: Any, value: int) -> Any:
        """The constant ``value`` in ``x``'s shape (a uint32 scalar for a scalar ``x``)."""
        return self._like(jnp.shape(x), value)

    def _like(self, shape: tuple[int, ...], y: Any) -> Any:
        if jnp.shape(y) == shape:
            return _u32(y)
        key = (shape, y if isinstance(y, int) else id(y))
        if key not in self._made:  # keeps ``y`` alive, so its id is not reused
            value = _u32(y)
            if isinstance(y, int) and self._tie is not None:
                value = lax.bitwise_or(value, self._tie)
            self._made[key] = (y, lax.broadcast_in_dim(value, shape, ()))
        return self._made[key][1]

    def _pair(self, x: Any, y: Any) -> tuple[Any, Any]:
        shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y))
        return self._like(shape, _u32(x) if isinstance(x, int) else x), self._like(shape, y)

    def add(self, x: Any, y: Any) -> jax.Array:
        return lax.add(*self._pair(_u32(x), y if isinstance(y, int) else _u32(y)))

    def xor(self, x: Any, y: Any) -> jax.Array:
        return lax.bitwise_xor(*self._pair(_u32(x), y if isinstance(y, int) else _u32(y)))

    def rotl(self, x: jax.Array, r: int) -> jax.Array:
        shape = jnp.shape(x)
        left = lax.shift_left(x, self._like(shape, r) if shape else _U32(r))
        right = lax.shift_right_logical(x, self._like(shape, 32 - r) if shape else _U32(32 - r))
        return lax.bitwise_or(left, right)


def threefry4x32(
    counter: Sequence[jax.Array],
    key: Sequence[jax.Array],
    rounds: int = ROUNDS,
    ops: Ops | None = None,
) -> list[jax.Array]:
    """Threefry-4x32 of ``counter`` under ``key``.

    Args:
      counter: four uint32 arrays (broadcastable against each other).
      key: four uint32 scalars or arrays.
      rounds: the number of rounds (13 unless testing).
      ops: the broadcasts to share with the caller's own ops on the outputs.

    Returns:
      Four uint32 arrays, the 128 output bits.
    """
    ops = Ops() if ops is None else ops
    schedule = [_u32(k) for k in key]
    parity = ops.xor(_U32(_PARITY), schedule[0])
    for word in schedule[1:]:
        parity = ops.xor(parity, word)
    schedule.append(parity)
    x = [ops.add(_u32(c), schedule[i]) for i, c in enumerate(counter)]
    for r in range(rounds):
        a, b = _ROTATIONS[r % 8]
        if r % 2 == 0:
            x[0] = ops.add(x[0], x[1])
            x[1] = ops.xor(ops.rotl(x[1], a), x[0])
            x[2] = ops.add(x[2], x[3])
            x[3] = ops.xor(ops.rotl(x[3], b), x[2])
        else:
            x[0] = ops.add(x[0], x[3])
            x[3] = ops.xor(ops.rotl(x[3], a), x[0])
            x[2] = ops.add(x[2], x[1])
            x[1] = ops.xor(ops.rotl(x[1], b), x[2])
        if r % 4 == 3:  # key injection every four rounds
            s = r // 4 + 1
            x = [ops.add(x[i], schedule[(s + i) % 5]) for i in range(4)]
            x[3] = ops.add(x[3], s)
    return x
