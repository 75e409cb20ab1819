"""Contiguous blocks against a boundary inside a free range (P4): the block that fits only below the multiple
the top of the range would cross, and a range whose one block would cross one.

Each range lies in a block below 4 GiB that was just allocated and freed, so it is free; a proxy may still
refuse (P4 promises no block when impossible, not one whenever possible), except for a range exactly as big
as the one block it holds (as ``test_proxy_shapes.py::test_contiguous_fits_a_free_range_to_the_byte``).
"""

from __future__ import annotations

import pytest

from pytest_san import PAGE_SIZE, CacheType, Proxy

from .test_proxy_shapes import grant, just_freed

P = PAGE_SIZE


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize("pages", [2, 4, 16])
def test_the_one_block_within_a_boundary_is_found_below_the_top(san_proxy: Proxy, pages: int) -> None:
    """A free range of one boundary window and a page more: the block at its top crosses the multiple, the
    window below it holds the block exactly: that block is granted."""
    boundary, cache = pages * P, CacheType.CACHED
    before = san_proxy.live_allocations()
    with just_freed(san_proxy, 2 * boundary, cache) as b:
        window = -(-b // boundary) * boundary  # the first multiple in the free range; window + boundary + P fits
        base = grant(san_proxy, boundary, window, window + boundary + P - 1, boundary, cache)
        assert base == window, f"{boundary:#x} bytes within a {boundary:#x} boundary in " \
                               f"[{window:#x}, {window + boundary + P:#x}): got {base}"
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize("pages", [2, 4, 16])
def test_a_range_whose_one_block_crosses_the_boundary_has_none(san_proxy: Proxy, pages: int) -> None:
    """A free range as big as the block, centred on a multiple of the boundary: the one block in it crosses the
    multiple: None (and never a block outside the range)."""
    boundary, cache = pages * P, CacheType.NON_CACHED
    before = san_proxy.live_allocations()
    with just_freed(san_proxy, 2 * boundary, cache) as b:
        middle = -(-(b + boundary // 2) // boundary) * boundary  # a multiple with half a block free either side
        lowest = middle - boundary // 2
        base = grant(san_proxy, boundary, lowest, lowest + boundary - 1, boundary, cache)
        assert base is None, f"granted {base:#x}: the one {boundary:#x}-byte block in [{lowest:#x}, " \
                             f"{lowest + boundary:#x}) crosses {middle:#x}"
    assert san_proxy.live_allocations() == before
