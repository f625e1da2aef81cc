"""Where the TPU kernels run: the one choice both kernel families read.

The dropout kernel (``_tpu_mask``) and the attention kernels (``_attention._flash_tpu``)
run where :func:`tpu_kernels_run` says, and in Pallas's TPU interpreter where
:func:`tpu_interpret` says; ``dropmask.testing.tpu_kernels`` (:func:`enabled`) overrides
the choice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.extend

__all__ = ["enabled", "tpu_interpret", "tpu_kernels_run"]


_CHOSEN: list[bool] = []  # inside ``enabled(...)``: each entry's choice, innermost last


def tpu_kernels_run() -> bool:
    """Whether the TPU kernels run (this one for dropout's masks, and the attention
    kernels of ``_attention._flash_tpu``): the innermost :func:`enabled`'s choice, else
    on a TPU with one device (see the module's docstring). Decided when traced."""
    return _CHOSEN[-1] if _CHOSEN else _one_tpu()


def _one_tpu() -> bool:
    """Whether JAX runs on a TPU with one device in all (hosts included)."""
    return jax.default_backend() == "tpu" and jax.device_count() == 1


def tpu_interpret() -> bool:
    """Whether the kernel runs in Pallas's TPU interpreter: off a TPU. Decided by the
    default backend, as ``default_path`` is."""
    return jax.extend.backend.get_backend().platform != "tpu"


@contextlib.contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Draws dropout's masks by the kernel (``on``) or by XLA's path (not ``on``) while
    tracing inside it, whatever the backend and devices: the kernel compiled on a TPU,
    in Pallas's TPU interpreter elsewhere (tests on a CPU). A traced draw does not
    record which way it was drawn, so JAX's caches are cleared on entry and on exit
    where the choice changes there."""
    before = tpu_kernels_run()
    if on != before:
        jax.clear_caches()
    _CHOSEN.append(on)
    try:
        yield
    finally:
        _CHOSEN.pop()
        if tpu_kernels_run() != on:
            jax.clear_caches()
