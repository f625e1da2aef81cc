"""What both Pallas kernel families (``_flash_triton``: Triton's, ``_flash_tpu``: Mosaic's) take
beside ``q``, ``k`` and ``v`` (:class:`KernelInputs`), and what they make of it: a state
per position, and each batch row's key tiles."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from . import _blockwise as bw

__all__ = ["NONFINITE", "VALID", "KernelInputs", "key_tiles", "position_states"]

VALID, NONFINITE = 1, 2  # key states; 0 is a padding (invalid) key


@dataclasses.dataclass(frozen=True)
class KernelInputs:
    """A call's inputs beside ``q``, ``k`` and ``v``, as the blockwise path takes them.

    Attributes:
      kv_valid: broadcasts to ``[*batch, Lk]``; None: every key.
      q_segments, kv_segments: broadcast to ``[*batch, L]``; None without segments.
      bad_q, bad_kv: ``bool[*batch, Lq, H]`` and ``bool[*batch, Lk, Hk]``, where an
        input entry was non-finite (and is now zero).
      key: the dropout key.
      run_time_keep: the keep probability as a ``float32`` scalar when the rate is a
        run-time value, else None.
    """

    kv_valid: Any
    q_segments: Any
    kv_segments: Any
    bad_q: jax.Array
    bad_kv: jax.Array
    key: Any
    run_time_keep: Any = None


def position_states(plan: bw.Plan, inputs: KernelInputs) -> tuple[jax.Array, jax.Array]:
    """``q_state: int32[B, H, Lq]`` (1 for a query holding a non-finite entry) and
    ``kv_state: int32[B, Hk, Lk]`` (0 padding, ``VALID``, ``NONFINITE``), ``B`` the batch
    dims merged."""
    bad_q, bad_kv = inputs.bad_q, inputs.bad_kv
    bsz = bad_q.size // (plan.q_len * plan.heads)
    valid = jnp.ones((), bool) if inputs.kv_valid is None else inputs.kv_valid
    valid = jnp.broadcast_to(valid, (*plan.batch, plan.kv_len)).reshape(bsz, 1, plan.kv_len)
    bad_kv3 = bad_kv.reshape(bsz, plan.kv_len, plan.kv_heads).transpose(0, 2, 1)
    kv_state = jnp.where(valid, jnp.where(bad_kv3, NONFINITE, VALID), 0).astype(jnp.int32)
    q_state = bad_q.reshape(bsz, plan.q_len, plan.heads).transpose(0, 2, 1).astype(jnp.int32)
    return q_state, kv_state


def key_tiles(kv_state: jax.Array, block_k: int) -> jax.Array:
    """``int32[B]``: how many key tiles reach the last valid key of each batch row."""
    valid = jnp.any(kv_state != 0, axis=1)  # [B, Lk]
    position = lax.broadcasted_iota(jnp.int32, valid.shape, 1) + 1
    end = jnp.max(jnp.where(valid, position, 0), axis=1)
    return (end + block_k - 1) // block_k
