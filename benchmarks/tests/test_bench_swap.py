"""``bench_swap``'s long-sequence rows at ``--quick`` size: compiled, not timed."""

from __future__ import annotations

from benchmarks import bench_swap
from benchmarks import bench_transformer_step as ts


def test_swapped_attention_holds_no_byte_mask_where_flax_holds_one() -> None:
    rows = bench_swap.long_rows(quick=True)
    temps, mask = rows["temp_bytes"], rows["mask_bytes"]
    assert rows["bit_identical"]
    assert temps[bench_swap.SWAPPED] - temps[bench_swap.SWAPPED0] < mask / 4
    assert temps[bench_swap.FLAX] - temps[bench_swap.FLAX0] >= mask


def test_swapped_attention_dropout_adds_under_a_quarter_mask_at_full_size() -> None:
    # The 2048-token row of `make bench`, compiled only: the packed words are 1/8 of a
    # byte mask, and the backward pass's order keeps the rest under another 1/8.
    size = bench_swap.LONG_FULL
    steps, args, _ = bench_swap._setup(**size, rate=0.0, attention=ts.RATE)
    with_dropout, without = (
        ts.temp_bytes(steps[name], args) for name in (bench_swap.SWAPPED, bench_swap.SWAPPED0)
    )
    mask = size["batch"] * size["heads"] * size["length"] ** 2
    assert with_dropout - without <= mask / 4
