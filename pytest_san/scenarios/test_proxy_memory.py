"""The proxy on real memory: DO_DIRECT_IO's pins (P1), cache types read back (P4), NOLOWMEM while memory above
4 GiB runs short (P3).

A direct-I/O driver works on the requester's own pages, locked where they are: the scenarios pin a buffer
(``DirectIoProxy.pin``), compare the frames locked with where the buffer's process maps it, ask the host to move
what it can (``compact_memory``) and compare again, and let the NIC write into the pinned pages. Each needs the
capability that names its optional methods (``direct_io``, ``cache_types``), and frees what it took in
``finally`` blocks, so the leak check after each test sees the proxy as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest

from pytest_san import FOUR_GIB, PAGE_SIZE, Access, Backend, CacheType, Proxy, SanError, Status, WsaError
from pytest_san.spi.protocols import Allocation, CacheTypeProxy, DirectIoProxy, SwitchConnection

from .support import TIMEOUT, expect_error
from .test_proxy import free_all, nolowmem

P = PAGE_SIZE
# (bytes, offset in the first page): a byte, a page, an unaligned buffer over several pages, one past 64 KiB
PIN_SHAPES = ((1, 5), (P, 0), (3 * P + 100, 17), (64 * 1024 + 17, P - 5))
PRESSURE_CHUNK = 16 << 20
PRESSURE_LIMIT = 3 << 30  # a bigger host is not drained: it keeps the scenario's cost bounded


def direct(proxy: Proxy) -> DirectIoProxy:
    """The proxy's DirectIoProxy methods (the scenario's ``direct_io`` requirement vouches for them)."""
    return cast(DirectIoProxy, proxy)


def covers(runs: Sequence[tuple[int, int]], nbytes: int, offset: int) -> None:
    """``runs`` cover exactly ``nbytes`` from ``offset`` into a page, each run's end meeting a page's end."""
    assert runs, "no physical runs"
    assert sum(n for _, n in runs) == nbytes, f"runs {runs} cover {sum(n for _, n in runs)} bytes, not {nbytes}"
    assert runs[0][0] % P == offset % P, f"the first run {runs[0][0]:#x} does not start {offset % P} into its page"
    assert all((address + n) % P == 0 for address, n in runs[:-1]), f"a run ends inside a page: {runs}"


# -- P1: the caller's own pages, locked where they are -----------------------------------------------------------


@pytest.mark.san_rule("P1")
@pytest.mark.san_requires("direct_io", "physical_addresses")
@pytest.mark.parametrize(("nbytes", "offset"), PIN_SHAPES, ids=lambda v: str(v))
def test_a_pin_locks_the_buffers_own_pages_where_they_are(san_backend: Backend, san_proxy: Proxy, nbytes: int,
                                                          offset: int) -> None:
    """DO_DIRECT_IO: the frames a pin locks are those the buffer's process maps, byte for byte, and a compaction
    of the host's memory leaves them where they are, with the buffer's bytes."""
    process = san_backend.nodes[0].default_process
    buf = process.alloc(offset + nbytes).view(offset, nbytes)
    data = bytes((i * 7 + nbytes) & 0xFF for i in range(nbytes))
    buf.write(data)
    before = san_proxy.live_allocations()
    pin = direct(san_proxy).pin(buf)
    try:
        assert pin.length == nbytes
        runs = list(pin.physical_runs)
        covers(runs, nbytes, buf.address)
        assert list(direct(san_proxy).physical_runs(buf)) == runs, "the pinned frames are not where the buffer is"
        assert san_proxy.live_allocations() == before + 1, "a pin is an allocation of the proxy (P2)"
        direct(san_proxy).compact_memory()
        assert list(direct(san_proxy).physical_runs(buf)) == runs, "a pinned page moved when memory was compacted"
        assert list(pin.physical_runs) == runs
        assert buf.read() == data
    finally:
        san_proxy.free(pin)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P1")
@pytest.mark.san_requires("direct_io", "physical_addresses")
def test_rdma_lands_in_the_pinned_pages(conn: SwitchConnection) -> None:
    """The NIC writes into the very pages the receiver's proxy locked: the bytes are in the user's buffer, with
    no copy in between, and the pages are still those frames after a compaction."""
    a, b = conn.local, conn.remote
    dst = b.process.alloc(2 * P + 10)
    data = bytes(range(256)) * (dst.length // 256) + bytes(dst.length % 256)
    pin = direct(b.proxy).pin(dst)
    try:
        runs = list(pin.physical_runs)
        desc = b.provider.register_rdma_memory(b.socket, dst, Access.WRITE)
        src = a.process.alloc(dst.length)
        src.write(data)
        handle = a.provider.register_memory(a.socket, src, Access.READ)
        done = a.provider.rdma_write(a.socket, [(src, handle)], desc, 0).wait(TIMEOUT)
        assert done.status is Status.SUCCESS and done.bytes == dst.length, done
        assert dst.read() == data
        direct(b.proxy).compact_memory()
        assert list(direct(b.proxy).physical_runs(dst)) == runs, "the RDMA target's pinned pages moved"
        assert dst.read() == data
        a.provider.deregister_memory(a.socket, handle)
        b.provider.deregister_rdma_memory(b.socket, desc)
    finally:
        b.proxy.free(pin)


@pytest.mark.san_rule("P1", "P3")
@pytest.mark.san_requires("direct_io", "nolowmem", "physical_addresses")
def test_under_nolowmem_a_buffers_pages_stay_above_4_gib(san_backend: Backend, san_proxy: Proxy) -> None:
    """A process's own pages are ordinary memory: under NOLOWMEM they are above 4 GiB when first touched, pinned
    or not, and a compaction that moves the unpinned ones keeps them there."""
    process = san_backend.nodes[0].default_process
    with nolowmem(san_proxy):
        pinned, loose = process.alloc(4 * P), process.alloc(4 * P)
        pinned.write(b"p" * pinned.length)
        loose.write(b"l" * loose.length)
        pin = direct(san_proxy).pin(pinned)
        try:
            for when in ("touched", "compacted"):
                for name, buf in (("pinned", pinned), ("unpinned", loose)):
                    low = [run for run in direct(san_proxy).physical_runs(buf) if run[0] < FOUR_GIB]
                    assert not low, f"NOLOWMEM, yet a {name} page of the process, {when}, is below 4 GiB: " \
                                    f"{low[0][0]:#x}"
                direct(san_proxy).compact_memory()
        finally:
            san_proxy.free(pin)


@pytest.mark.san_rule("P1")
@pytest.mark.san_requires("direct_io")
def test_a_pin_of_memory_that_is_not_the_callers_is_refused(san_backend: Backend, san_proxy: Proxy) -> None:
    """Nothing but a process's own mapped memory is pinned: an unmapped range, an empty or negative one, a buffer
    of a process that ended, another host's buffer, something that is no buffer at all; a refused pin holds
    nothing, and a pin freed twice is WSAEINVAL."""
    node = san_backend.nodes[0]
    before = san_proxy.live_allocations()
    buf = node.default_process.alloc(P)
    for unmapped in (node.default_process.buffer_at(0x1000, P),  # never mapped
                     node.default_process.buffer_at(buf.address, 1 << 30)):  # runs off the end of the mapping
        expect_error(WsaError.WSAEFAULT, direct(san_proxy).pin, unmapped)
    expect_error(WsaError.WSAEFAULT, direct(san_proxy).pin, "a buffer's name")
    if len(san_backend.nodes) > 1:
        expect_error(WsaError.WSAEFAULT, direct(san_proxy).pin, san_backend.nodes[1].default_process.alloc(P))
    expect_error(WsaError.WSAEFAULT, direct(san_proxy).pin, buf.view(0, 0))
    expect_error(WsaError.WSAEINVAL, direct(san_proxy).pin, node.default_process.buffer_at(buf.address, -P))
    ended = node.spawn_process()
    gone = ended.alloc(P)
    ended.kill()
    expect_error(WsaError.WSAEFAULT, direct(san_proxy).pin, gone)
    assert san_proxy.live_allocations() == before
    pin = direct(san_proxy).pin(buf)
    san_proxy.free(pin)
    expect_error(WsaError.WSAEINVAL, san_proxy.free, pin)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P1", "P2")
@pytest.mark.san_requires("direct_io", "process_kill")
def test_a_pin_ends_with_its_process(san_backend: Backend, san_proxy: Proxy) -> None:
    """A process that ends takes its pins with it: the proxy no longer counts them, and freeing one is refused."""
    node = san_backend.nodes[0]
    before = san_proxy.live_allocations()
    process = node.spawn_process()
    pin = direct(san_proxy).pin(process.alloc(2 * P))
    assert san_proxy.live_allocations() == before + 1
    process.kill()
    assert san_proxy.live_allocations() == before, "a pin outlived its process"
    expect_error(WsaError.WSAEINVAL, san_proxy.free, pin)


# -- P4: the cache type a block is really mapped with --------------------------------------------------------------


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous", "cache_types")
@pytest.mark.parametrize("cache_type", list(CacheType), ids=lambda c: c.name)
def test_a_contiguous_block_is_mapped_with_its_cache_type(san_proxy: Proxy, cache_type: CacheType) -> None:
    """MmAllocateContiguousMemorySpecifyCache maps the block with the cache type asked for: read back from the
    page table, not from what the proxy remembers."""
    for nbytes in (P, 3 * P + 1):
        base = san_proxy.allocate_contiguous(nbytes, 0, FOUR_GIB - 1, 0, cache_type)
        assert base is not None, f"{nbytes} contiguous bytes below 4 GiB refused"
        try:
            got = cast(CacheTypeProxy, san_proxy).cache_type_of(base)
            assert got == cache_type, f"a {cache_type.name} block of {nbytes} bytes is mapped {CacheType(got).name}"
            expect_error(WsaError.WSAEINVAL, cast(CacheTypeProxy, san_proxy).cache_type_of, float(base))
        finally:
            san_proxy.free_contiguous(base, nbytes, cache_type)
    expect_error(WsaError.WSAEINVAL, cast(CacheTypeProxy, san_proxy).cache_type_of, base)


# -- P3: NOLOWMEM holds when memory above 4 GiB runs short -----------------------------------------------------------


@pytest.mark.san_rule("P3")
@pytest.mark.san_requires("nolowmem", "physical_addresses")
def test_nolowmem_holds_while_memory_above_4_gib_runs_short(san_proxy: Proxy) -> None:
    """Under NOLOWMEM ordinary allocations never fall back below 4 GiB, not even once the memory above it runs
    short: the proxy refuses (WSAENOBUFS) instead. Allocates 16 MiB at a time until refused, or up to 3 GiB
    (past what many a host has above 4 GiB: a fallback shows only once that runs out)."""
    held: list[Allocation] = []
    with nolowmem(san_proxy):
        try:
            while len(held) * PRESSURE_CHUNK < PRESSURE_LIMIT:
                try:
                    held.append(san_proxy.allocate(PRESSURE_CHUNK))
                except SanError as err:
                    assert err.code is WsaError.WSAENOBUFS, f"allocation {len(held) + 1} under NOLOWMEM: {err}"
                    break
                low = [run for run in held[-1].physical_runs if run[0] < FOUR_GIB]
                assert not low, f"NOLOWMEM, yet allocation {len(held)} ({len(held) * 16} MiB in) is below 4 GiB " \
                                f"at {low[0][0]:#x}"
        finally:
            free_all(san_proxy, held)
