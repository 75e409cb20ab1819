"""The proxy driver: P1-P5, on the public Proxy protocol only.

Every scenario frees what it allocated (in ``finally`` blocks), so the leak check after each
test sees the proxy as it was. Scenarios that look at physical addresses need the backend's
``physical_addresses`` capability; NOLOWMEM, contiguous memory, DMA adapters and fault
injection have capabilities of their own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from pytest_san import (
    DO_DIRECT_IO,
    FOUR_GIB,
    PAGE_SIZE,
    Backend,
    CacheType,
    DeviceDescription,
    DmaAdapter,
    Proxy,
    SanError,
    WsaError,
)
from pytest_san.batch import Later, batch, values
from pytest_san.spi.protocols import Allocation

from .support import expect_error, fail_allocations

P = PAGE_SIZE
DO_BUFFERED_IO = 0x4  # wdm.h; a device object uses one buffer method, never both
SIZES = (1, 100, P - 1, P, P + 1, 3 * P, 64 * 1024 + 17)
NO_RAM = 1 << 52  # a physical range no lab host has memory in


def overlapping(runs: Sequence[tuple[int, int]]) -> bool:
    ordered = sorted(runs)
    return any(a + n > b for (a, n), (b, _) in itertools.pairwise(ordered))


@contextmanager
def nolowmem(proxy: Proxy) -> Iterator[None]:
    """The proxy in NOLOWMEM mode for the block, then as it was."""
    before = proxy.nolowmem
    proxy.set_nolowmem(True)
    try:
        yield
    finally:
        proxy.set_nolowmem(before)


def nic(*, dma32: bool = True, dma64: bool = False) -> DeviceDescription:
    """As the proxy must build it: zero-initialised, then the SAN NIC's fields written in."""
    description = DeviceDescription.zeroed()
    description.version = 2
    description.master = True
    description.scatter_gather = True
    description.dma32 = dma32
    description.dma64 = dma64
    description.maximum_length = 1 << 20
    return description


def free_all(proxy: Proxy, allocations: Sequence[Allocation]) -> None:
    for allocation in allocations:
        proxy.free(allocation)


# -- P1: DO_DIRECT_IO -----------------------------------------------------------------------------


@pytest.mark.san_rule("P1")
def test_device_object_has_direct_io(san_proxy: Proxy) -> None:
    assert san_proxy.device_flags & DO_DIRECT_IO == DO_DIRECT_IO


@pytest.mark.san_rule("P1")
def test_device_object_is_not_buffered_io(san_proxy: Proxy) -> None:
    assert not san_proxy.device_flags & DO_BUFFERED_IO, "DO_BUFFERED_IO and DO_DIRECT_IO exclude each other"


# -- P2: allocate and free whenever asked ---------------------------------------------------------


@pytest.mark.san_rule("P2")
def test_allocates_and_frees_on_request(san_proxy: Proxy) -> None:
    before = san_proxy.live_allocations()
    held: list[Allocation] = []
    try:
        for i, nbytes in enumerate(SIZES, 1):
            held.append(san_proxy.allocate(nbytes))
            assert held[-1].length >= nbytes
            assert san_proxy.live_allocations() == before + i
    finally:
        free_all(san_proxy, held)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P2")
def test_many_allocate_free_cycles_stay_balanced(san_backend: Backend, san_proxy: Proxy) -> None:
    before = san_proxy.live_allocations()
    with batch(san_backend) as bt:  # each free names the allocation just made: in order, together where it can
        cycles: list[Later[object]] = []
        for i in range(200):
            allocation = bt.call(san_proxy.allocate, P * (1 + i % 4))
            cycles += [allocation, bt.call(san_proxy.free, allocation.ref)]
    values(cycles)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P2")
@pytest.mark.san_requires("physical_addresses")
def test_live_allocations_are_distinct_pages(san_proxy: Proxy) -> None:
    held: list[Allocation] = []
    try:
        held = [san_proxy.allocate(nbytes) for nbytes in SIZES]
        for allocation in held:
            runs = allocation.physical_runs
            assert runs, f"{allocation!r} reports no physical memory"
            assert all(address % P == 0 and nbytes > 0 for address, nbytes in runs)
            assert sum(nbytes for _, nbytes in runs) >= allocation.length
        assert not overlapping([run for a in held for run in a.physical_runs]), \
            "two live allocations share physical memory"
    finally:
        free_all(san_proxy, held)


@pytest.mark.san_rule("P2")
def test_double_free_is_refused(san_proxy: Proxy) -> None:
    before = san_proxy.live_allocations()
    allocation = san_proxy.allocate(P)
    san_proxy.free(allocation)
    expect_error(WsaError.WSAEINVAL, san_proxy.free, allocation)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P2")
@pytest.mark.san_requires("faults")
def test_allocation_failure_is_wsaenobufs_and_holds_nothing(san_backend: Backend, san_proxy: Proxy) -> None:
    faults = san_backend.faults
    assert faults is not None
    node = next(n for n in san_backend.nodes if n.proxy is san_proxy)
    before = san_proxy.live_allocations()
    faults.fail_allocations(node, 2)
    for nbytes in (P, 8 * P):
        expect_error(WsaError.WSAENOBUFS, san_proxy.allocate, nbytes)
    assert san_proxy.live_allocations() == before
    san_proxy.free(san_proxy.allocate(P))  # the injected failures are spent


@pytest.mark.san_rule("P2")
@pytest.mark.san_requires("faults")
def test_an_allocation_failure_after_others_keeps_what_succeeded(san_backend: Backend, san_proxy: Proxy) -> None:
    """A failure once ``after`` allocations succeeded (how a switch's second region is refused, R11): those keep
    their memory, the refused one holds nothing, and the next one succeeds."""
    faults = san_backend.faults
    assert faults is not None
    node = next(n for n in san_backend.nodes if n.proxy is san_proxy)
    before = san_proxy.live_allocations()
    fail_allocations(faults, node, 1, 2)
    held = [san_proxy.allocate(P), san_proxy.allocate(2 * P)]
    try:
        expect_error(WsaError.WSAENOBUFS, san_proxy.allocate, P)
        assert san_proxy.live_allocations() == before + 2
        held.append(san_proxy.allocate(P))
    finally:
        free_all(san_proxy, held)
    assert san_proxy.live_allocations() == before


# -- P3: NOLOWMEM ---------------------------------------------------------------------------------


@pytest.mark.san_rule("P3")
@pytest.mark.san_requires("nolowmem", "physical_addresses")
def test_nolowmem_allocations_never_land_below_4_gib(san_proxy: Proxy) -> None:
    held: list[Allocation] = []
    with nolowmem(san_proxy):
        assert san_proxy.nolowmem
        try:
            held = [san_proxy.allocate(nbytes) for nbytes in SIZES for _ in range(3)]
            low = [(a, address) for a in held for address, _ in a.physical_runs if address < FOUR_GIB]
            assert not low, f"NOLOWMEM, yet allocated below 4 GiB: {low[:3]}"
        finally:
            free_all(san_proxy, held)


@pytest.mark.san_rule("P3", "P4")
@pytest.mark.san_requires("nolowmem", "contiguous", "physical_addresses")
def test_nolowmem_still_gives_low_contiguous_memory(san_proxy: Proxy) -> None:
    with nolowmem(san_proxy):
        base = san_proxy.allocate_contiguous(2 * P, 0, FOUR_GIB - 1, 0, CacheType.NON_CACHED)
        assert base is not None, "no low contiguous memory under NOLOWMEM"
        try:
            assert base + 2 * P <= FOUR_GIB
        finally:
            san_proxy.free_contiguous(base, 2 * P, CacheType.NON_CACHED)


@pytest.mark.san_rule("P3", "P5")
@pytest.mark.san_requires("nolowmem", "dma_adapter")
def test_nolowmem_still_gives_low_common_buffers_to_32_bit_adapters(san_proxy: Proxy) -> None:
    with nolowmem(san_proxy):
        adapter = san_proxy.get_dma_adapter(nic(dma32=True))
        try:
            assert adapter.dma32
            buf = adapter.allocate_common_buffer(3 * P, True)
            assert buf is not None, "no common buffer for a 32-bit adapter under NOLOWMEM"
            virtual, logical = buf
            adapter.free_common_buffer(3 * P, logical, virtual, True)
            assert logical + 3 * P <= FOUR_GIB
        finally:
            san_proxy.put_dma_adapter(adapter)


# -- P4: contiguous memory ------------------------------------------------------------------------


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize("cache_type", list(CacheType), ids=lambda c: c.name)
def test_contiguous_is_aligned_in_range_and_within_boundary(san_proxy: Proxy, cache_type: CacheType) -> None:
    lowest, highest, boundary = 0x1000000, FOUR_GIB - 1, 16 * P
    before = san_proxy.live_allocations()
    blocks: list[tuple[int, int]] = []
    try:
        for nbytes in (1, P, 3 * P, 16 * P):
            base = san_proxy.allocate_contiguous(nbytes, lowest, highest, boundary, cache_type)
            assert base is not None, f"{nbytes} contiguous bytes below 4 GiB refused"
            blocks.append((base, nbytes))
            assert base % P == 0, f"{base:#x} is not page aligned"
            assert lowest <= base and base + nbytes - 1 <= highest, f"{base:#x} outside the range"
            assert base // boundary == (base + nbytes - 1) // boundary, f"{base:#x} crosses a boundary"
        assert blocks[-1][0] % boundary == 0  # as big as the boundary: must start on a multiple
        assert not overlapping(blocks)
        assert san_proxy.live_allocations() == before + len(blocks)
    finally:
        for base, nbytes in blocks:
            san_proxy.free_contiguous(base, nbytes, cache_type)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize(("nbytes", "lowest", "highest", "boundary"), [
    pytest.param(3 * P, 0, FOUR_GIB - 1, 2 * P, id="bigger-than-boundary"),
    pytest.param(4 * P, 0x1000000, 0x1000000 + 2 * P - 1, 0, id="range-too-small"),
    pytest.param(P, 0x2000000, 0x1000000, 0, id="lowest-above-highest"),
    pytest.param(P, NO_RAM, NO_RAM + (1 << 30) - 1, 0, id="no-memory-there"),
])
def test_impossible_contiguous_is_none(san_proxy: Proxy, nbytes: int, lowest: int, highest: int,
                                       boundary: int) -> None:
    before = san_proxy.live_allocations()
    base = san_proxy.allocate_contiguous(nbytes, lowest, highest, boundary, CacheType.CACHED)
    if base is not None:  # free it before failing, so the leak check stays about this test only
        san_proxy.free_contiguous(base, nbytes, CacheType.CACHED)
    assert base is None, f"impossible request granted at {base:#x}"
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
def test_free_contiguous_needs_same_base_size_and_cache_type(san_proxy: Proxy) -> None:
    nbytes, cache = 2 * P, CacheType.WRITE_COMBINED
    base = san_proxy.allocate_contiguous(nbytes, 0, FOUR_GIB - 1, 0, cache)
    assert base is not None
    freed = False
    try:
        live = san_proxy.live_allocations()
        for wrong in [(base + P, nbytes, cache), (base, nbytes + P, cache), (base, nbytes - 1, cache),
                      (base, nbytes, CacheType.CACHED), (base, nbytes, CacheType.NON_CACHED)]:
            expect_error(WsaError.WSAEINVAL, san_proxy.free_contiguous, *wrong)
            assert san_proxy.live_allocations() == live, f"free_contiguous{wrong} released something"
        san_proxy.free_contiguous(base, nbytes, cache)
        freed = True
        expect_error(WsaError.WSAEINVAL, san_proxy.free_contiguous, base, nbytes, cache)
    finally:
        if not freed:
            san_proxy.free_contiguous(base, nbytes, cache)


# -- P5: DMA adapter and common buffers -----------------------------------------------------------


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
def test_uninitialised_description_is_refused(san_proxy: Proxy) -> None:
    before = san_proxy.live_allocations()
    partly = DeviceDescription(version=2, master=True, dma32=True, maximum_length=1 << 20)  # rest never set
    for description in (DeviceDescription(), partly, DeviceDescription.zeroed()):
        try:
            adapter = san_proxy.get_dma_adapter(description)
        except SanError as err:
            assert err.code is WsaError.WSAEINVAL
        else:
            san_proxy.put_dma_adapter(adapter)
            pytest.fail(f"get_dma_adapter accepted {description}")
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
@pytest.mark.parametrize(("dma32", "dma64"), [(True, False), (False, True)])
def test_common_buffers_are_contiguous_and_32_bit_when_asked(san_proxy: Proxy, dma32: bool, dma64: bool) -> None:
    before = san_proxy.live_allocations()
    adapter = san_proxy.get_dma_adapter(nic(dma32=dma32, dma64=dma64))
    buffers: list[tuple[int, int, int]] = []
    try:
        assert adapter.dma32 is dma32
        for length in (P, 5 * P + 10):
            buf = adapter.allocate_common_buffer(length, True)
            assert buf is not None
            virtual, logical = buf
            buffers.append((length, logical, virtual))
            if dma32:
                assert logical + length <= FOUR_GIB, f"32-bit adapter got a buffer at {logical:#x}"
        assert not overlapping([(logical, length) for length, logical, _ in buffers])
        assert len({virtual for _, _, virtual in buffers}) == len(buffers)
    finally:
        for length, logical, virtual in buffers:
            adapter.free_common_buffer(length, logical, virtual, True)
        san_proxy.put_dma_adapter(adapter)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
def test_free_common_buffer_needs_the_exact_values(san_proxy: Proxy) -> None:
    adapter = san_proxy.get_dma_adapter(nic())
    length = 2 * P
    buf = adapter.allocate_common_buffer(length, False)
    assert buf is not None
    virtual, logical = buf
    freed = False
    try:
        live = san_proxy.live_allocations()
        for wrong in [(length + P, logical, virtual, False), (length, logical + P, virtual, False),
                      (length, logical, virtual + P, False), (length, logical, virtual, True)]:
            expect_error(WsaError.WSAEINVAL, adapter.free_common_buffer, *wrong)
            assert san_proxy.live_allocations() == live, f"free_common_buffer{wrong} released something"
        adapter.free_common_buffer(length, logical, virtual, False)
        freed = True
    finally:
        if not freed:
            adapter.free_common_buffer(length, logical, virtual, False)
        san_proxy.put_dma_adapter(adapter)


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
def test_put_adapter_only_after_every_common_buffer_is_freed(san_proxy: Proxy) -> None:
    before = san_proxy.live_allocations()
    adapter: DmaAdapter = san_proxy.get_dma_adapter(nic())
    buf = adapter.allocate_common_buffer(P, True)
    assert buf is not None
    try:
        expect_error(WsaError.WSAEINVAL, san_proxy.put_dma_adapter, adapter)
    finally:
        adapter.free_common_buffer(P, buf[1], buf[0], True)
    san_proxy.put_dma_adapter(adapter)
    assert san_proxy.live_allocations() == before
