"""Which path computes a call of ``dot_product_attention`` (dense, blockwise, the Pallas
kernels), where ``"auto"`` switches, and each path's tiles."""

from __future__ import annotations

from typing import Any, Literal

from .._checks import (
    check_choice,
    check_int,
)
from .._errors import (
    DropmaskValueError,
    call_name,
    user_error,
)
from .._random import (
    auto_partitioned,
    tpu_kernels_run,
)
from . import _blockwise as bw
from ._checked import Checked

__all__ = [
    "ALGORITHMS",
    "AUTO_BLOCKWISE_SCORES",
    "AUTO_FLASH_SCORES",
    "Algorithm",
    "block_sizes",
    "choose_path",
    "flash_block_sizes",
    "flash_serves",
    "pallas_block_sizes",
]

Algorithm = Literal["auto", "dense", "blockwise", "pallas"]
ALGORITHMS = ("auto", "dense", "blockwise", "pallas")
# "auto" takes the blockwise path from this many scores per (batch, head) on, by the
# inputs' itemsize: where it measured faster than the dense path in a Transformer
# encoder layer's train step with dropout on CPU, or where the dense weights would
# outgrow the machine (`python -m benchmarks.bench_transformer_step --paths`, in
# benchmarks/RESULTS.md). In bf16 the dense path is faster at 256 tokens and the
# blockwise one from 512 on; in f32 the dense path is faster through 2048 tokens.
AUTO_BLOCKWISE_SCORES = {2: 512 * 512, 4: 4096 * 4096}
# Where the Pallas TPU kernels run (a TPU, see ``_random.tpu_kernels_run``), "auto" takes
# them from this many scores on, in either dtype. On a v5e (bf16, dropout 0.1, a mask
# per head, forward and backward, medians; one-process runs of 2026-12-06 after the
# dense path's mask was drawn by the dropout kernel, docs/dropout_speed.md): the dense
# path against the kernels, ms, at [16, L, 8, 64] causal L = 128: 1.03 / 1.26, 256:
# 1.27 / 1.45, 512: 2.62 / 2.08; ViT-B's [64, 197, 12, 64]: 4.37 / 4.58 (the kernels'
# and the dense path's times from two processes of one machine). Again on 2026-12-07
# (bench_tpu's short part, calls back to back in rotating rounds), dense / kernels,
# ms: bf16 128: 0.325 / 0.475, 197: 0.527 / 0.632, 256: 0.600 / 0.719, 512: 1.904 /
# 1.338; f32 197: 0.599 / 0.781, 512: 2.092 / 1.735; and after the narrow rows' flags
# were drawn with the rows along lanes (60aa7dc): bf16 128: 0.243 / 0.424, 197: 0.439 /
# 0.658, 256: 0.442 / 0.641, 512: 1.657 / 1.219; f32 197: 0.484 / 0.767, 512: 1.859 /
# 1.610 (benchmarks/RESULTS.md, "Short attention"). Earlier, the dense path's mask
# drawn by XLA, the kernels took 0.72x the dense path's time at [4, 1024, 16, 64],
# 0.68x at 2048 tokens, 0.42x in bench_tpu's 4-layer step.
AUTO_FLASH_SCORES = 512 * 512


def choose_path(
    algorithm: Any,
    impl: str,
    module: Any,
    custom_einsums: bool,
    long: bool,
    *,
    bias: bool,
    flash: bool = False,
    on_tpu: bool = False,
) -> str:
    """``"dense"``, ``"blockwise"``, ``"pallas"`` or ``"flash"`` (the Pallas TPU kernels);
    raises if ``algorithm`` cannot serve. ``flash``: whether the TPU kernels run here
    and serve the call (and for ``"auto"``, its length); ``on_tpu``: whether they run
    here at all."""
    check_choice(algorithm, ALGORITHMS, caller=call_name(), name="algorithm")
    dense_only = []
    if impl == "flax":
        dense_only.append(
            "impl='flax' (its masks are not counter-based: no tile can draw its part)"
        )
    if custom_einsums:
        dense_only.append("custom einsums")
    if module is not None:
        dense_only.append("module= (sowing the weights needs them whole)")
    if algorithm in ("blockwise", "pallas") and dense_only:
        raise user_error(
            DropmaskValueError,
            f"algorithm={algorithm!r} cannot take {dense_only[0]}",
            "Use algorithm='dense' (or 'auto'), or drop that argument.",
            caller=call_name(),
        )
    if algorithm == "pallas" and bias:
        raise user_error(
            DropmaskValueError,
            "algorithm='pallas' does not take bias= yet (its gradient would be a [q_len, "
            "kv_len] array per batch and head)",
            "Use algorithm='blockwise', which computes the same function with it.",
            caller=call_name(),
        )
    if algorithm == "auto":
        if not dense_only and flash:
            return "flash"
        return "blockwise" if not dense_only and long else "dense"
    if algorithm == "pallas" and on_tpu:
        # What the TPU kernels do not take (a dense mask, float16), the blockwise path
        # does, with the same dropout mask.
        return "flash" if flash else "blockwise"
    return algorithm


def flash_serves(c: Checked, bias: bool, precision: Any, interpret: bool) -> bool:
    """Whether the Pallas TPU kernels run here and serve the call's inputs and precision:
    not in a program XLA partitions itself (``_flash_sharding``). ``interpret``: whether
    they would run in Pallas's interpreter (which serves any head depth)."""
    if not tpu_kernels_run() or auto_partitioned(c.q):
        return False
    from . import _flash_tpu as ft

    if ft.kernel_precision(precision) is None:
        return False

    return ft.serves(
        c.dtype,
        c.kv_len,
        c.drops,
        (c.q.shape[-1], c.v.shape[-1]),
        mask=c.mask is not None,
        bias=bias,
        interpret=interpret,
    )


def flash_block_sizes(block_q: Any, block_k: Any, q_len: int, kv_len: int) -> tuple[int, int]:
    """The TPU kernels' tiles: ``block_q`` a multiple of 16 (a bfloat16 tile's rows),
    ``block_k`` of 128 (a vector register's lanes), at most the padded lengths."""
    from . import _flash_tpu as ft

    sizes = []
    for size, name, length, default, unit in (
        (block_q, "block_q", q_len, ft.DEFAULT_BLOCKS[0], 16),
        (block_k, "block_k", kv_len, ft.DEFAULT_BLOCKS[1], 128),
    ):
        if size is None:
            size = default
        size = check_int(size, name=name, caller=call_name(), minimum=1, shape=True)
        if size % unit:
            raise user_error(
                DropmaskValueError,
                f"{name} must be a multiple of {unit} for algorithm='pallas' on a TPU "
                f"(its kernels' tiles), got {size}",
                f"Pass e.g. {name}={default}, or leave it unset.",
                caller=call_name(),
            )
        sizes.append(min(size, -(-length // unit) * unit))
    return sizes[0], sizes[1]


def pallas_block_sizes(block_q: Any, block_k: Any, q_len: int, kv_len: int) -> tuple[int, int]:
    """Power-of-two tiles of at least 16 (Triton's), at most the padded lengths."""
    from . import _flash_triton as pa

    sizes = []
    for size, name, length, default in (
        (block_q, "block_q", q_len, pa.DEFAULT_BLOCK_Q),
        (block_k, "block_k", kv_len, pa.DEFAULT_BLOCK_K),
    ):
        if size is None:
            size = default
        size = check_int(size, name=name, caller=call_name(), minimum=1, shape=True)
        if size < 16 or size & (size - 1):
            raise user_error(
                DropmaskValueError,
                f"{name} must be a power of two >= 16 for algorithm='pallas' (Triton's tile "
                f"sizes), got {size}",
                f"Pass e.g. {name}={default}.",
                caller=call_name(),
            )
        sizes.append(min(size, max(16, _next_power_of_two(length))))
    return sizes[0], sizes[1]


def _next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 2 ** (n - 1).bit_length()


def block_sizes(block_q: Any, block_k: Any, q_len: int, kv_len: int) -> tuple[int, int]:
    sizes = []
    for size, name, length in ((block_q, "block_q", q_len), (block_k, "block_k", kv_len)):
        size = (
            bw.default_block(length)
            if size is None
            else check_int(size, name=name, caller=call_name(), minimum=1, shape=True)
        )
        sizes.append(max(min(size, length), 1))
    return sizes[0], sizes[1]
