"""The samples of shapes the property scenarios run are what their docstrings promise: every position of a bad
entry in a full list, lists of every allowed length, the access each call needs, and the same sample every run
(a failure on a lab host must replay on the emulator)."""

from __future__ import annotations

import pytest

from pytest_san import Access
from pytest_san.scenarios.support import MAX_SGE, SOURCE_KINDS, scatter_shapes
from pytest_san.scenarios.test_lifetime import IN_USE_SHAPES

KINDS = ["send", "recv", "rdma_write", "rdma_read"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_entry_is_tried_first_in_the_middle_and_last_of_a_full_list(kind: str) -> None:
    shapes = scatter_shapes("a scenario", kind)
    full = [s.bad for s in shapes if len(s.lengths) == MAX_SGE]
    assert {0, MAX_SGE - 1} <= set(full) and any(0 < bad < MAX_SGE - 1 for bad in full)
    for shape in shapes:
        assert 1 <= len(shape.lengths) <= MAX_SGE and 0 <= shape.bad < len(shape.lengths)
        assert len(shape.accesses) == len(shape.lengths) and all(n >= 1 for n in shape.lengths)
        need = Access.READ if kind in SOURCE_KINDS else Access.WRITE
        assert all(access & need for access in shape.accesses), f"{kind}: {shape} has an entry without {need.name}"
        assert shape.side in ("before", "after")


def test_the_sample_is_the_same_every_run_and_differs_between_scenarios() -> None:
    assert scatter_shapes("a scenario", "recv") == scatter_shapes("a scenario", "recv")
    assert scatter_shapes("a scenario", "recv") != scatter_shapes("another scenario", "recv")


def test_over_many_scenarios_drawn_lists_take_every_length_and_position() -> None:
    drawn = [s for name in range(40) for s in scatter_shapes(f"scenario {name}", "send")[3:]]
    assert {len(s.lengths) for s in drawn} == set(range(1, MAX_SGE + 1))
    assert {(len(s.lengths), s.bad) for s in drawn} == {(n, i) for n in range(1, MAX_SGE + 1) for i in range(n)}


def test_every_in_use_shape_has_two_or_more_operations_on_the_handle() -> None:
    for uses in IN_USE_SHAPES:
        assert len(uses.lengths) >= 2 and len(uses.at) == len(uses.lengths), uses
        assert all(0 <= at < n <= MAX_SGE for n, at in zip(uses.lengths, uses.at, strict=True)), uses
    positions = {at for uses in IN_USE_SHAPES for n, at in zip(uses.lengths, uses.at, strict=True) if n == MAX_SGE}
    assert {0, MAX_SGE - 1} <= positions and any(0 < at < MAX_SGE - 1 for at in positions)
