"""The proxy's arguments at their edges (P2, P4, P5): sizes no host has, integers of another int type, and
values that equal the right ones without being integers (``4096.0``, ``True`` for 1).

An int subclass (an IntEnum) is an integer (CONTRACT.md section 4): it must work as its value. A float or a bool that
compares equal to the value a free needs is still no integer: WSAEINVAL, and the thing stays live, to be freed
with the right values after.
"""

from __future__ import annotations

import enum

import pytest

from pytest_san import FOUR_GIB, PAGE_SIZE, CacheType, Proxy, SanError, WsaError

from .support import expect_error
from .test_proxy import nic

P = PAGE_SIZE
PETABYTE = 1 << 50  # more memory than any host has (and more than a 47-bit address space maps)


class Size(enum.IntEnum):
    """Sizes and addresses of another int type."""

    BYTE = 1
    PAGE = P
    PAGES = 3 * P + 5


PAGE, PAGES = Size(P), Size(3 * P + 5)  # members by value: the scenarios name no attribute of their own


# -- P2: sizes ----------------------------------------------------------------------------------------


@pytest.mark.san_rule("P2")
@pytest.mark.parametrize("nbytes", [PETABYTE, PETABYTE + 1])
def test_an_allocation_bigger_than_any_host_is_wsaenobufs(san_proxy: Proxy, nbytes: int) -> None:
    """Out of memory is WSAENOBUFS (not a crash, not a hang), holds nothing, and the proxy allocates after."""
    before = san_proxy.live_allocations()
    expect_error(WsaError.WSAENOBUFS, san_proxy.allocate, nbytes)
    assert san_proxy.live_allocations() == before
    san_proxy.free(san_proxy.allocate(P))
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P2")
@pytest.mark.parametrize("nbytes", list(Size), ids=lambda s: s.name)
def test_a_size_of_another_int_type_allocates_as_its_value(san_proxy: Proxy, nbytes: Size) -> None:
    before = san_proxy.live_allocations()
    allocation = san_proxy.allocate(nbytes)
    try:
        assert allocation.length >= nbytes.value
        assert san_proxy.live_allocations() == before + 1
    finally:
        san_proxy.free(allocation)
    assert san_proxy.live_allocations() == before


# -- P4: contiguous blocks ------------------------------------------------------------------------------


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
def test_a_contiguous_block_of_int_subclass_values_is_granted_and_freed(san_proxy: Proxy) -> None:
    before = san_proxy.live_allocations()
    base = san_proxy.allocate_contiguous(PAGES, PAGE, FOUR_GIB - 1, 1 << 20, CacheType.CACHED)
    assert base is not None, "a contiguous block named with IntEnum sizes refused"
    try:
        assert base % P == 0 and base >= P
        assert base // (1 << 20) == (base + PAGES - 1) // (1 << 20)
    finally:
        san_proxy.free_contiguous(base, PAGES, CacheType.CACHED)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize("highest", [-1, -P, -(1 << 40)])
def test_a_contiguous_range_below_zero_holds_no_block(san_proxy: Proxy, highest: int) -> None:
    """[0, highest] with highest negative is empty: no block (None, or WSAEINVAL for the negative address)."""
    before = san_proxy.live_allocations()
    try:
        base = san_proxy.allocate_contiguous(P, 0, highest, 0, CacheType.CACHED)
    except SanError as err:
        assert err.code is WsaError.WSAEINVAL, f"expected WSAEINVAL or None, got {err}"
    else:
        if base is not None:
            san_proxy.free_contiguous(base, P, CacheType.CACHED)
        assert base is None, f"granted {base:#x} in a range that ends at {highest}"
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize("cache", [CacheType.WRITE_COMBINED, CacheType.CACHED])
def test_free_contiguous_with_equal_values_that_are_no_integers_is_wsaeinval(san_proxy: Proxy,
                                                                           cache: CacheType) -> None:
    """The base, the size or the cache type as a float (or a bool) equal to the right one: WSAEINVAL, the block
    stays live; 7 is no cache type at all."""
    nbytes = 2 * P
    base = san_proxy.allocate_contiguous(nbytes, 0, FOUR_GIB - 1, 0, cache)
    assert base is not None
    try:
        live = san_proxy.live_allocations()
        wrong = [(float(base), nbytes, cache), (base, float(nbytes), cache), (base, nbytes, float(cache)),
                 (base, nbytes, 7)]
        if cache == 1:
            wrong.append((base, nbytes, True))
        for args in wrong:
            expect_error(WsaError.WSAEINVAL, san_proxy.free_contiguous, *args)
            assert san_proxy.live_allocations() == live, f"free_contiguous{args} released the block"
    finally:
        san_proxy.free_contiguous(base, nbytes, cache)


# -- P5: common buffers ---------------------------------------------------------------------------------


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
@pytest.mark.parametrize("cached", [True, False])
def test_free_common_buffer_with_equal_values_that_are_no_integers_is_wsaeinval(san_proxy: Proxy,
                                                                              cached: bool) -> None:
    """Each value free_common_buffer needs, in turn as a float (or an int for the flag) equal to the right one:
    WSAEINVAL, the buffer stays live. A length of another int type allocates."""
    adapter = san_proxy.get_dma_adapter(nic())
    try:
        buf = adapter.allocate_common_buffer(PAGES, cached)
        assert buf is not None, "a common buffer of an IntEnum length refused"
        virtual, logical = buf
        length = int(PAGES)
        try:
            live = san_proxy.live_allocations()
            for args in [(float(length), logical, virtual, cached), (length, float(logical), virtual, cached),
                         (length, logical, float(virtual), cached), (length, logical, virtual, int(cached))]:
                expect_error(WsaError.WSAEINVAL, adapter.free_common_buffer, *args)
                assert san_proxy.live_allocations() == live, f"free_common_buffer{args} released the buffer"
        finally:
            adapter.free_common_buffer(length, logical, virtual, cached)
    finally:
        san_proxy.put_dma_adapter(adapter)


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
def test_a_description_whose_maximum_length_was_left_zero_is_refused(san_proxy: Proxy) -> None:
    """Zero-initialised, every other field of the NIC filled in, maximum_length left at its zero: not filled in
    (P5), WSAEINVAL, no adapter."""
    before = san_proxy.live_allocations()
    description = nic()
    description.maximum_length = 0
    expect_error(WsaError.WSAEINVAL, san_proxy.get_dma_adapter, description)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_description_version_is_accepted(san_proxy: Proxy, version: int) -> None:
    """DEVICE_DESCRIPTION_VERSION (0) through DEVICE_DESCRIPTION_VERSION3 (wdm.h): each is a version a NIC's
    driver fills in (P5), so each gives an adapter, put again at once."""
    description = nic()
    description.version = version
    adapter = san_proxy.get_dma_adapter(description)
    san_proxy.put_dma_adapter(adapter)
