"""EmulatedProxy: pinned allocations, NOLOWMEM, contiguous blocks, DMA adapters, books and faults."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from pytest_san import DO_DIRECT_IO, FOUR_GIB, PAGE_SIZE, CacheType, DeviceDescription, SanError, WsaError
from pytest_san.spi.emulator.backend import EmulatorBackend
from pytest_san.spi.emulator.memory import FREE, PAGE_SHIFT, RESERVED_FRAMES, PhysicalMemory
from pytest_san.spi.emulator.proxy import KERNEL_VA_BASE, EmulatedAllocation, EmulatedDmaAdapter, EmulatedProxy
from pytest_san.spi.protocols import Proxy

P = PAGE_SIZE


def nic(**fields: Any) -> DeviceDescription:
    """A zero-initialised description with a bus-master NIC's fields filled in."""
    description = DeviceDescription.zeroed()
    description.version, description.master, description.scatter_gather = 2, True, True
    description.maximum_length = 1 << 20
    return dataclasses.replace(description, **fields)


def overlapping(runs: list[tuple[int, int]]) -> bool:
    runs = sorted(runs)
    return any(a + n > b for (a, n), (b, _) in itertools.pairwise(runs))


def all_free(memory: PhysicalMemory) -> bool:
    return memory.free_frames == memory.frames - RESERVED_FRAMES


def is_free(memory: PhysicalMemory, address: int) -> bool:
    """Whether the page holding ``address`` is free."""
    return memory.frame_map[address >> PAGE_SHIFT:][:1] == FREE


@pytest.fixture
def proxy() -> EmulatedProxy:
    return EmulatedProxy("node0")


def test_is_a_proxy_with_direct_io() -> None:
    p: Proxy = EmulatedProxy("n")  # mypy checks the protocol
    assert p.device_flags & DO_DIRECT_IO
    assert p.nolowmem is False


# -- P2: allocate / free ------------------------------------------------------------------------


def test_allocations_cover_their_length_and_never_overlap(proxy: EmulatedProxy) -> None:
    sizes = [1, P, P + 1, 3 * P, 10_000, 64 * 1024]
    allocations = [proxy.allocate(n) for n in sizes]
    for a, n in zip(allocations, sizes, strict=True):
        assert isinstance(a, EmulatedAllocation) and a.length == n
        assert sum(b for _, b in a.physical_runs) == n
        assert all(address % P == 0 for address, _ in a.physical_runs)
    assert not overlapping([r for a in allocations for r in a.physical_runs])
    assert proxy.live_allocations() == len(sizes)
    for a in allocations:
        proxy.free(a)
    assert proxy.live_allocations() == 0
    assert all_free(proxy.memory)


def test_an_allocation_is_one_run_first_fit_from_the_bottom() -> None:
    p = EmulatedProxy("n", PhysicalMemory(RESERVED_FRAMES + 8))
    held = [p.allocate(P) for _ in range(8)]
    start = RESERVED_FRAMES << PAGE_SHIFT
    assert [a.physical_runs for a in held[:2]] == [((start, P),), ((start + P, P),)]
    p.free(held[1])
    p.free(held[5])
    p.free(held[6])
    a = p.allocate(P + 100)  # the hole at page 1 is too small: the one at pages 5-6 fits
    assert a.physical_runs == ((start + 5 * P, P + 100),)
    assert p.allocate(1).physical_runs == ((start + P, 1),)
    assert p.memory.free_frames == 0


@pytest.mark.parametrize("nbytes", [3 * P, 1 << 50])
def test_out_of_memory_is_wsaenobufs(nbytes: int) -> None:
    p = EmulatedProxy("n", PhysicalMemory(RESERVED_FRAMES + 4))
    a = p.allocate(2 * P)
    with pytest.raises(SanError) as info:
        p.allocate(nbytes)
    assert info.value.code is WsaError.WSAENOBUFS
    assert p.live_allocations() == 1 and p.memory.free_frames == 2
    p.free(a)


@pytest.mark.parametrize("nbytes", [0, -1])
def test_empty_allocation_is_wsaeinval(proxy: EmulatedProxy, nbytes: int) -> None:
    with pytest.raises(SanError) as info:
        proxy.allocate(nbytes)
    assert info.value.code is WsaError.WSAEINVAL


def test_double_free_is_wsaeinval(proxy: EmulatedProxy) -> None:
    a = proxy.allocate(P)
    proxy.free(a)
    with pytest.raises(SanError, match="double free") as info:
        proxy.free(a)
    assert info.value.code is WsaError.WSAEINVAL
    assert all_free(proxy.memory)


def test_foreign_allocation_is_wsaeinval() -> None:
    shared = PhysicalMemory()
    p0, p1 = EmulatedProxy("node0", shared), EmulatedProxy("node1", shared)
    a = p1.allocate(P)
    with pytest.raises(SanError, match="node1") as info:
        p0.free(a)
    assert info.value.code is WsaError.WSAEINVAL
    with pytest.raises(SanError, match="not a live allocation") as info:
        p0.free(object())  # type: ignore[arg-type]
    assert info.value.code is WsaError.WSAEINVAL
    assert p1.live_allocations() == 1
    p1.free(a)


def test_proxies_sharing_memory_never_overlap_and_reset_only_their_own() -> None:
    shared = PhysicalMemory()
    p0, p1 = EmulatedProxy("node0", shared), EmulatedProxy("node1", shared)
    mine = [p0.allocate(3 * P) for _ in range(3)]
    theirs = [p1.allocate(5 * P) for _ in range(3)]
    assert not overlapping([r for a in mine + theirs for r in a.physical_runs])
    p0.reset()
    assert p0.live_allocations() == 0 and p1.live_allocations() == 3
    for a in theirs:
        assert not is_free(shared, a.physical_runs[0][0])
        p1.free(a)
    assert all_free(shared)


# -- P3: NOLOWMEM -------------------------------------------------------------------------------


def test_nolowmem_allocations_never_land_below_4_gib() -> None:
    p = EmulatedProxy("n")
    p.set_nolowmem(True)
    assert p.nolowmem
    held = [p.allocate(n) for n in (1, P, 5 * P, 1 << 20)]
    assert all(address >= FOUR_GIB for a in held for address, _ in a.physical_runs)
    p.set_nolowmem(False)
    low = p.allocate(P)
    assert low.physical_runs[0][0] < FOUR_GIB  # first fit again once NOLOWMEM is off
    for a in [*held, low]:
        p.free(a)


def test_nolowmem_refuses_rather_than_going_low() -> None:
    p = EmulatedProxy("n", PhysicalMemory((FOUR_GIB >> PAGE_SHIFT) + 2))
    p.set_nolowmem(True)
    a = p.allocate(2 * P)
    with pytest.raises(SanError) as info:
        p.allocate(P)
    assert info.value.code is WsaError.WSAENOBUFS
    # ... yet the proxy still gets low memory for RDMA when it asks for it explicitly.
    base = p.allocate_contiguous(P, 0, FOUR_GIB - 1, 0, CacheType.NON_CACHED)
    assert base is not None and base < FOUR_GIB
    adapter = p.get_dma_adapter(nic(dma32=True))
    buf = adapter.allocate_common_buffer(P, True)
    assert buf is not None and buf[1] + P <= FOUR_GIB
    adapter.free_common_buffer(P, buf[1], buf[0], True)
    p.put_dma_adapter(adapter)
    p.free_contiguous(base, P, CacheType.NON_CACHED)
    p.free(a)


def test_nolowmem_common_buffer_of_a_64_bit_adapter_stays_high() -> None:
    p = EmulatedProxy("n")
    p.set_nolowmem(True)
    adapter = p.get_dma_adapter(nic(dma64=True))
    assert adapter.dma32 is False
    buf = adapter.allocate_common_buffer(3 * P, False)
    assert buf is not None and buf[1] >= FOUR_GIB
    adapter.free_common_buffer(3 * P, buf[1], buf[0], False)
    p.put_dma_adapter(adapter)


# -- P4: contiguous -----------------------------------------------------------------------------


def test_contiguous_respects_range_alignment_and_boundary(proxy: EmulatedProxy) -> None:
    lowest, highest, boundary = 0x1000000, 0x2000000 - 1, 0x10000
    blocks = []
    for nbytes in (1, P, 3 * P, 0x10000):
        base = proxy.allocate_contiguous(nbytes, lowest, highest, boundary, CacheType.CACHED)
        assert base is not None
        assert base % P == 0 and lowest <= base and base + nbytes - 1 <= highest
        assert base // boundary == (base + nbytes - 1) // boundary
        blocks.append((base, nbytes))
    assert not overlapping(blocks)
    assert proxy.live_allocations() == 4
    for base, nbytes in blocks:
        proxy.free_contiguous(base, nbytes, CacheType.CACHED)
    assert proxy.live_allocations() == 0


@pytest.mark.parametrize(("nbytes", "lowest", "highest", "boundary"), [
    (3 * P, 0, FOUR_GIB - 1, 2 * P),
    (2 * P, 0x200000, 0x200000 + P - 1, 0),
    (P, FOUR_GIB, FOUR_GIB - 1, 0),
    (P, 1 << 40, (1 << 41) - 1, 0),
    (7 << 30, 0, (8 << 30) - 1, 0),
    (P, 0x200000 + 1, 0x200000 + 2 * P - 2, 0),  # whole pages inside: none
    (3 * P, 0, FOUR_GIB - 1, 3 * P - 1),
])
def test_impossible_contiguous_is_none(proxy: EmulatedProxy, nbytes: int, lowest: int, highest: int,
                                       boundary: int) -> None:
    assert proxy.allocate_contiguous(nbytes, lowest, highest, boundary, CacheType.NON_CACHED) is None
    assert proxy.live_allocations() == 0


def test_contiguous_rejects_bad_arguments(proxy: EmulatedProxy) -> None:
    for args in [(0, 0, FOUR_GIB - 1, 0, CacheType.CACHED), (P, -1, FOUR_GIB - 1, 0, CacheType.CACHED),
                 (P, 0, FOUR_GIB - 1, -P, CacheType.CACHED), (P, 0, FOUR_GIB - 1, 0, 7)]:
        with pytest.raises(SanError) as info:
            proxy.allocate_contiguous(*args)  # type: ignore[arg-type]
        assert info.value.code is WsaError.WSAEINVAL


@pytest.mark.parametrize(("delta_base", "delta_size", "cache"), [
    (P, 0, CacheType.WRITE_COMBINED),
    (0, P, CacheType.WRITE_COMBINED),
    (0, -1, CacheType.WRITE_COMBINED),
    (0, 0, CacheType.CACHED),
    (0, 0, 9),
    (0, 0, 2.0),
])
def test_free_contiguous_needs_the_same_values(proxy: EmulatedProxy, delta_base: int, delta_size: int,
                                               cache: CacheType) -> None:
    base = proxy.allocate_contiguous(2 * P, 0, FOUR_GIB - 1, 0, CacheType.WRITE_COMBINED)
    assert base is not None
    with pytest.raises(SanError, match="no such contiguous block") as info:
        proxy.free_contiguous(base + delta_base, 2 * P + delta_size, cache)
    assert info.value.code is WsaError.WSAEINVAL
    assert proxy.live_allocations() == 1
    assert not is_free(proxy.memory, base) and not is_free(proxy.memory, base + P)
    proxy.free_contiguous(base, 2 * P, CacheType.WRITE_COMBINED)
    with pytest.raises(SanError):
        proxy.free_contiguous(base, 2 * P, CacheType.WRITE_COMBINED)  # twice
    assert all_free(proxy.memory)


def test_contiguous_ignores_fault_injection(proxy: EmulatedProxy) -> None:
    proxy.fail_next(5)
    base = proxy.allocate_contiguous(P, 0, FOUR_GIB - 1, 0, CacheType.CACHED)
    assert base is not None
    proxy.free_contiguous(base, P, CacheType.CACHED)
    with pytest.raises(SanError):
        proxy.allocate(P)


# -- P5: DMA adapters ---------------------------------------------------------------------------


def test_uninitialised_description_is_refused_naming_the_fields(proxy: EmulatedProxy) -> None:
    with pytest.raises(SanError, match=r"version.*maximum_length.*master.*zero-initialised") as info:
        proxy.get_dma_adapter(DeviceDescription())
    assert info.value.code is WsaError.WSAEINVAL
    partly = DeviceDescription(version=2, master=True, scatter_gather=True, dma32=True, maximum_length=4096)
    with pytest.raises(SanError, match=r"interface_type.*dma64"):
        proxy.get_dma_adapter(partly)
    assert proxy.live_allocations() == 0


@pytest.mark.parametrize(("fields", "named"), [
    ({"master": False}, "master"),
    ({"maximum_length": 0}, "maximum_length"),
    ({"version": 9}, "version"),
])
def test_description_without_the_nics_fields_is_refused(proxy: EmulatedProxy, fields: dict[str, object],
                                                        named: str) -> None:
    with pytest.raises(SanError, match=named) as info:
        proxy.get_dma_adapter(nic(**fields))
    assert info.value.code is WsaError.WSAEINVAL
    with pytest.raises(SanError):
        proxy.get_dma_adapter(DeviceDescription.zeroed())  # zeroed but nothing filled in
    with pytest.raises(SanError):
        proxy.get_dma_adapter("not a description")  # type: ignore[arg-type]


def test_adapter_is_not_changed_by_its_description_changing(proxy: EmulatedProxy) -> None:
    description = nic(dma32=True)
    adapter = proxy.get_dma_adapter(description)
    description.dma64 = True
    assert adapter.dma32
    proxy.put_dma_adapter(adapter)


@pytest.mark.parametrize(("dma32", "dma64", "low"), [(True, False, True), (False, False, True),
                                                      (True, True, False), (False, True, False)])
def test_common_buffers_are_contiguous_and_low_for_32_bit_adapters(proxy: EmulatedProxy, dma32: bool,
                                                                   dma64: bool, low: bool) -> None:
    adapter = proxy.get_dma_adapter(nic(dma32=dma32, dma64=dma64))
    assert isinstance(adapter, EmulatedDmaAdapter) and adapter.dma32 is low
    length = 5 * P + 10
    buf = adapter.allocate_common_buffer(length, True)
    assert buf is not None
    virtual, logical = buf
    assert virtual == KERNEL_VA_BASE + logical and logical % P == 0
    assert not is_free(proxy.memory, logical) and not is_free(proxy.memory, logical + length - 1)
    if low:
        assert logical + length <= FOUR_GIB
    assert proxy.live_allocations() == 2  # the adapter and its buffer
    adapter.free_common_buffer(length, logical, virtual, True)
    proxy.put_dma_adapter(adapter)
    assert proxy.live_allocations() == 0
    assert all_free(proxy.memory)


def test_common_buffer_is_none_when_impossible(proxy: EmulatedProxy) -> None:
    adapter = proxy.get_dma_adapter(nic(dma32=True))
    assert adapter.allocate_common_buffer(FOUR_GIB, False) is None  # 4 GiB never fits below 4 GiB
    assert adapter.allocate_common_buffer(0, False) is None
    proxy.put_dma_adapter(adapter)


@pytest.mark.parametrize("wrong", ["length", "logical", "virtual", "cache_enabled"])
def test_free_common_buffer_needs_the_same_four_values(proxy: EmulatedProxy, wrong: str) -> None:
    adapter = proxy.get_dma_adapter(nic(dma32=True))
    buf = adapter.allocate_common_buffer(2 * P, False)
    assert buf is not None
    values: dict[str, Any] = {"length": 2 * P, "logical": buf[1], "virtual": buf[0], "cache_enabled": False}
    bad = dict(values)
    bad[wrong] = not values[wrong] if wrong == "cache_enabled" else values[wrong] + P
    with pytest.raises(SanError, match=rf"{wrong}=.*: no such common buffer") as info:
        adapter.free_common_buffer(**bad)
    assert info.value.code is WsaError.WSAEINVAL
    with pytest.raises(SanError, match="common buffer"):
        proxy.put_dma_adapter(adapter)  # still has its buffer
    adapter.free_common_buffer(**values)
    proxy.put_dma_adapter(adapter)
    assert proxy.live_allocations() == 0


def test_put_adapter_rules(proxy: EmulatedProxy) -> None:
    adapter = proxy.get_dma_adapter(nic())
    other = EmulatedProxy("node1").get_dma_adapter(nic())
    with pytest.raises(SanError, match="not a live adapter of node0"):
        proxy.put_dma_adapter(other)
    proxy.put_dma_adapter(adapter)
    with pytest.raises(SanError, match="put already") as info:
        proxy.put_dma_adapter(adapter)
    assert info.value.code is WsaError.WSAEINVAL
    with pytest.raises(SanError, match="already put"):
        adapter.allocate_common_buffer(P, True)


# -- fault injection, books, leaks, reset -------------------------------------------------------


def test_fail_next_fails_exactly_that_many_allocations(proxy: EmulatedProxy) -> None:
    proxy.fail_next(2)
    for _ in range(2):
        with pytest.raises(SanError, match="injected") as info:
            proxy.allocate(P)
        assert info.value.code is WsaError.WSAENOBUFS
    a = proxy.allocate(P)
    assert proxy.live_allocations() == 1
    proxy.free(a)
    proxy.fail_next(1)
    proxy.fail_next(0)  # replaces, does not add
    proxy.free(proxy.allocate(P))
    with pytest.raises(ValueError):
        proxy.fail_next(-1)


def test_fail_next_after_lets_that_many_through_first(proxy: EmulatedProxy) -> None:
    """``after``: the scenario of a connect refused at an end's second region (issue 30's held-out switch bug)."""
    proxy.fail_next(2, 1)
    first = proxy.allocate(P)
    for _ in range(2):
        with pytest.raises(SanError, match="injected"):
            proxy.allocate(P)
    proxy.free(proxy.allocate(P))
    proxy.free(first)
    proxy.fail_next(1, 3)
    proxy.fail_next(1)  # replaces `after` too
    with pytest.raises(SanError, match="injected"):
        proxy.allocate(P)
    proxy.fail_next(1, 2)
    proxy.reset()  # clears both
    for _ in range(3):
        proxy.free(proxy.allocate(P))
    with pytest.raises(ValueError, match="after"):
        proxy.fail_next(1, -1)
    with pytest.raises(TypeError, match="after"):
        proxy.fail_next(1, 1.5)  # type: ignore[arg-type]


def test_live_lists_everything_alive_and_reset_frees_it(proxy: EmulatedProxy) -> None:
    assert proxy.live() == []
    a = proxy.allocate(3 * P)
    base = proxy.allocate_contiguous(2 * P, 0, FOUR_GIB - 1, 0, CacheType.NON_CACHED)
    assert base is not None
    adapter = proxy.get_dma_adapter(nic(dma32=True))
    buf = adapter.allocate_common_buffer(P, True)
    assert buf is not None
    idle = proxy.get_dma_adapter(nic())
    assert proxy.live_allocations() == 5
    text = "\n".join(repr(thing) for thing in proxy.live())
    assert f"{a.physical_runs[0][0]:#x}" in text and f"base={base}" in text and f"logical={buf[1]}" in text
    assert text.count("DMA adapter") == 2
    proxy.fail_next(3)
    proxy.reset()
    assert proxy.live_allocations() == 0 and proxy.live() == []
    assert all_free(proxy.memory)
    proxy.free(proxy.allocate(P))  # fault injection was cleared
    with pytest.raises(SanError, match="released by reset"):
        proxy.free(a)
    with pytest.raises(SanError):
        proxy.put_dma_adapter(idle)
    proxy.reset()  # nothing to do is fine


def test_backend_reports_the_live_things_as_leaks() -> None:
    backend = EmulatorBackend(1)
    node = backend.nodes[0]
    a = node.proxy.allocate(P)
    leaks = backend.leaks()
    assert [(leak.node, leak.kind) for leak in leaks] == [("node0", "allocation")]
    assert f"{a.physical_runs[0][0]:#x}" in leaks[0].detail
    backend.reset()
    assert backend.leaks() == []
