"""``bench_swap``'s long-sequence rows at ``--quick`` size: compiled, not timed."""

from __future__ import annotations

from benchmarks import bench_swap


def test_swapped_attention_holds_no_byte_mask_where_flax_holds_one() -> None:
    rows = bench_swap.long_rows(quick=True)
    temps, mask = rows["temp_bytes"], rows["mask_bytes"]
    assert rows["bit_identical"]
    assert temps[bench_swap.SWAPPED] - temps[bench_swap.SWAPPED0] < mask / 4
    assert temps[bench_swap.FLAX] - temps[bench_swap.FLAX0] >= mask
