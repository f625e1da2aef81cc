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

__all__ = ["ROUNDS", "threefry4x32"]

# Random123's rotation constants for Threefry-4x32, one pair per round (mod 8).
_ROTATIONS = ((10, 26), (11, 21), (13, 27), (23, 5), (6, 20), (17, 11), (25, 10), (18, 20))
_PARITY = 0x1BD11BDA  # the Threefish key-schedule parity constant
ROUNDS = 13
_U32 = np.uint32


def _u32(x: Any) -> Any:
    """A uint32 operand: an int stays a NumPy scalar, which a jaxpr holds as a literal."""
    if isinstance(x, int):
        return _U32(x)
    return x if isinstance(x, jax.Array) and x.dtype == _U32 else jnp.asarray(x, _U32)


# The rounds call lax directly, on operands of any rank: a scalar (a key word, a shift
# amount, a counter word) is broadcast where the program is lowered, so the jaxpr holds
# no broadcast of it. Each ``jnp`` operator is a small jitted function that tracing
# inlines, which made tracing one dropout about 1.7 times slower. Constants as literals
# also keep a differentiated scan (``nn.scan``, ``lax.scan``) from computing them before
# its loop: JAX hoists a loop-invariant broadcast out of the scanned body as an array of
# the counters' size, but a literal is no equation of the body.
def _add(x: Any, y: Any) -> jax.Array:
    return lax.add(_u32(x), _u32(y))


def _xor(x: Any, y: Any) -> jax.Array:
    return lax.bitwise_xor(_u32(x), _u32(y))


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return lax.bitwise_or(lax.shift_left(x, _U32(r)), lax.shift_right_logical(x, _U32(32 - r)))


def _common_shape(*groups: list[Any]) -> list[list[Any]]:
    """Each group's operands broadcast to the shape all of them broadcast to; scalars
    stay scalars (lax takes them beside an array of any shape)."""
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for group in groups for x in group))

    def fit(x: Any) -> Any:
        if jnp.shape(x) in ((), shape):
            return x
        return lax.broadcast_in_dim(x, shape, tuple(range(len(shape) - jnp.ndim(x), len(shape))))

    return [[fit(x) for x in group] for group in groups]


def threefry4x32(
    counter: Sequence[Any], key: Sequence[Any], rounds: int = ROUNDS
) -> list[jax.Array]:
    """Threefry-4x32 of ``counter`` under ``key``.

    Args:
      counter: four uint32 arrays or ints, broadcastable against each other.
      key: four uint32 scalars or arrays.
      rounds: the number of rounds (13 unless testing).

    Returns:
      Four uint32 arrays, the 128 output bits.

    Example:
      >>> from dropmask import testing
      >>> [hex(int(w)) for w in testing.threefry4x32([0] * 4, [0] * 4)]  # Random123's answer
      ['0x531c7e4f', '0x39491ee5', '0x2c855a92', '0x3d6abf9a']
    """
    counter, schedule = _common_shape([_u32(c) for c in counter], [_u32(k) for k in key])
    parity = _xor(_PARITY, schedule[0])
    for word in schedule[1:]:
        parity = _xor(parity, word)
    schedule.append(parity)
    x = [_add(c, schedule[i]) for i, c in enumerate(counter)]
    for r in range(rounds):
        a, b = _ROTATIONS[r % 8]
        if r % 2 == 0:
            x[0] = _add(x[0], x[1])
            x[1] = _xor(_rotl(x[1], a), x[0])
            x[2] = _add(x[2], x[3])
            x[3] = _xor(_rotl(x[3], b), x[2])
        else:
            x[0] = _add(x[0], x[3])
            x[3] = _xor(_rotl(x[3], a), x[0])
            x[2] = _add(x[2], x[1])
            x[1] = _xor(_rotl(x[1], b), x[2])
        if r % 4 == 3:  # key injection every four rounds
            s = r // 4 + 1
            x = [_add(x[i], schedule[(s + i) % 5]) for i in range(4)]
            x[3] = _add(x[3], s)
    return x
