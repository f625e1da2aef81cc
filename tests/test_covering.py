"""The fast suite's covering sets (``tests/covering.py``)."""

from __future__ import annotations

import pytest
from tests.covering import covering


def test_cases_outside_the_fast_set_are_marked_slow():
    params = covering(["a", "b", ("c", 1)], ["a"])
    assert params[0] == "a"
    assert [p.values for p in params[1:]] == [("b",), (("c", 1),)]
    assert all(m.name == "slow" for p in params[1:] for m in p.marks)
    unpacked = covering([(1, 2), (3, 4)], [(1, 2)], unpack=True)
    assert unpacked[0] == (1, 2) and unpacked[1].values == (3, 4)


def test_a_fast_case_it_cannot_find_is_refused():
    with pytest.raises(ValueError, match="not among"):
        covering(["a", "b"], ["renamed"])
