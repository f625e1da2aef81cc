"""``bench_scan`` at ``--quick`` size: the rows build, and the temporaries compare."""

from __future__ import annotations

import math

from benchmarks import bench_scan


def test_rows_measure_every_step_and_dropmask_adds_less_than_flax() -> None:
    r = bench_scan.rows(quick=True)
    assert set(r["seconds"]) == set(bench_scan.KINDS)
    assert all(math.isfinite(s) for v in r["seconds"].values() for s in v if s == s)
    temps = r["temp_bytes"]
    ours, flax = temps["dropmask"] - temps["none"], temps["flax"] - temps["none"]
    assert 0 <= ours < flax / 2, (ours, flax)


def test_targets_are_two_rows_with_their_bounds() -> None:
    rows = bench_scan.targets(quick=True)
    assert [t.bound for t in rows] == [1.05, 1.5]
    assert all(t.values for t in rows)
