"""The proxy driver's part on a real host: ``PinnedProxy`` and the capabilities a host declares.

Pinned memory (mmap + mlock), physical addresses from /proc/self/pagemap (root only, physical.py),
contiguous memory from hugetlb pages, DMA adapters whose common buffers are such contiguous blocks
(``HostDmaAdapter``) -- with capabilities declared only for what this host really gives
(``host_capabilities``).

Standard library only; Python 3.9+.
"""

from __future__ import annotations

import ctypes
import itertools
import os
from typing import Any, Protocol

from hil.agent.engines.verbs.libc import MAP_HUGETLB, libc, map_anonymous
from hil.agent.engines.verbs.physical import _touch, physical_frames, physical_runs
from hil.agent.engines.verbs.pin_witness import vm_pin_pages
from pytest_san.spi.contract import (
    DO_DIRECT_IO,
    FOUR_GIB,
    MAX_SGE,
    PAGE_SIZE,
    CacheType,
    SanError,
    WsaError,
    is_int,
)
from pytest_san.spi.dma import CommonBuffer, DmaAdapterBooks, check_description, check_integers, checked_put

HUGE_PAGE_SIZE = 2 << 20


class HostAllocation:
    """Pinned memory the proxy handed out (implements the Allocation protocol)."""

    __slots__ = ("address", "id", "length", "physical_runs", "size")

    def __init__(self, id: int, address: int, length: int, size: int, runs: tuple[tuple[int, int], ...]) -> None:
        self.id = id
        self.address = address  # user virtual address of the pinned pages
        self.length = length
        self.size = size
        self.physical_runs = runs

    def __repr__(self) -> str:
        return f"<HostAllocation #{self.id}: {self.length} bytes at {self.address:#x}>"


class _Block:
    __slots__ = ("address", "cache_type", "nbytes", "size")

    def __init__(self, address: int, size: int, nbytes: int, cache_type: int) -> None:
        self.address = address
        self.size = size
        self.nbytes = nbytes
        self.cache_type = cache_type


def _cache_type(value: Any) -> None:
    if not is_int(value) or value not in tuple(CacheType):
        raise SanError(WsaError.WSAEINVAL, f"unknown cache type {value!r}")


class HostDmaAdapter(DmaAdapterBooks):
    """IoGetDmaAdapter's adapter on a Linux host: common buffers are pinned hugetlb blocks (P5)."""

    def __init__(self, owner: PinnedProxy, id: int, description: dict[str, Any]) -> None:
        super().__init__(not description.get("dma64"))
        self._owner = owner
        self.id = id
        self.description = description

    def _take(self, length: int, cache_enabled: bool) -> tuple[int, int, object] | None:
        highest = FOUR_GIB - 1 if self.dma32 else (1 << 64) - 1
        got = self._owner._contiguous_block(length, 0, highest, 0)
        if got is None:
            return None
        virtual, logical, size = got
        return virtual, logical, size

    def _give_back(self, buf: CommonBuffer) -> None:
        assert isinstance(buf.held, int)  # the mapped size _take kept
        self._owner._release_block(buf.virtual, buf.held)

    def __repr__(self) -> str:
        return f"<DMA adapter #{self.id} dma32={self.dma32}: {len(self.buffers)} common buffer(s)>"


class PinnedProxy:
    """The proxy driver on a real host (P1, P2, P4, P5 where the host allows; never P3/NOLOWMEM).

    ``allocate`` pins (mmap + mlock) and reports physical runs when /proc/self/pagemap gives
    frame numbers (root). ``allocate_contiguous`` uses 2 MiB hugetlb pages: physically contiguous
    by construction; it returns None when the host has no hugetlb pages, when physical addresses
    cannot be read, or when no page meets the bounds. Linux user space cannot choose a caching
    type: ``cache_type`` is validated and remembered (free must repeat it), not applied.
    """

    def __init__(self, name: str = "host", why: str = "") -> None:
        self.name = name
        self.why = why  # why the host's kernel module is not the proxy here
        self._ids = itertools.count(1)
        self._allocations: dict[int, HostAllocation] = {}
        self._contiguous: dict[int, tuple[_Block, int]] = {}  # base physical -> (block, virtual)
        self._adapters: dict[int, HostDmaAdapter] = {}
        self._adapter_ids = itertools.count(1)
        self._caps: frozenset[str] | None = None

    # -- P1, P3 ---------------------------------------------------------------------------------

    @property
    def device_flags(self) -> int:
        return DO_DIRECT_IO

    @property
    def nolowmem(self) -> bool:
        return False  # a Linux host has no NOLOWMEM mode to switch on

    def set_nolowmem(self, value: bool) -> None:
        if value:
            raise SanError(WsaError.WSAEOPNOTSUPP,
                           "NOLOWMEM cannot be set on a Linux host (capability 'nolowmem' absent)")

    def describe(self) -> dict[str, Any]:
        """For the report: which proxy ran here."""
        return {"kind": "userspace stand-in", "memory": "mmap + mlock, hugetlb for contiguity", "why": self.why}

    # -- P1, P4 on real memory: what only the kernel module can do -------------------------------

    def _cannot(self, call: str) -> SanError:
        return SanError(WsaError.WSAEOPNOTSUPP, f"{call} on {self.name}: the userspace stand-in cannot do it "
                                                f"(capabilities 'direct_io', 'cache_types' absent; {self.why})")

    def pin(self, buffer: Any) -> HostAllocation:
        raise self._cannot("pin")

    def physical_runs(self, buffer: Any) -> tuple[tuple[int, int], ...]:
        raise self._cannot("physical_runs")

    def compact_memory(self) -> None:
        raise self._cannot("compact_memory")

    def cache_type_of(self, base: int) -> int:
        raise self._cannot("cache_type_of")

    @staticmethod
    def pinned_pages(pid: int) -> int:
        return 0  # the stand-in pins nothing in a process

    # -- capabilities ---------------------------------------------------------------------------

    def capabilities(self) -> frozenset[str]:
        """What this host's proxy really gives: "physical_addresses" (pagemap PFNs), "contiguous" (hugetlb)."""
        if self._caps is None:
            caps = set()
            address = map_anonymous(PAGE_SIZE)
            if address is not None:
                _touch(address, PAGE_SIZE)
                if all(physical_frames(address, PAGE_SIZE)):
                    caps.add("physical_addresses")
                libc.munmap(address, PAGE_SIZE)
            if "physical_addresses" in caps:
                huge = map_anonymous(HUGE_PAGE_SIZE, MAP_HUGETLB)
                if huge is not None:
                    try:
                        _touch(huge, HUGE_PAGE_SIZE, HUGE_PAGE_SIZE)
                        if all(physical_frames(huge, PAGE_SIZE)):
                            caps.add("contiguous")
                    finally:
                        libc.munmap(huge, HUGE_PAGE_SIZE)
            self._caps = frozenset(caps)
        return self._caps

    # -- P2 -------------------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> HostAllocation:
        if not is_int(nbytes) or nbytes <= 0:
            raise SanError(WsaError.WSAEINVAL, f"proxy of {self.name}: cannot allocate {nbytes!r} bytes")
        size = -(-nbytes // PAGE_SIZE) * PAGE_SIZE
        address = map_anonymous(size)
        if address is None:
            raise SanError(WsaError.WSAENOBUFS, f"proxy of {self.name}: mmap of {size} bytes failed: "
                           f"{os.strerror(ctypes.get_errno())}")
        if libc.mlock(address, size) != 0:
            err = ctypes.get_errno()
            libc.munmap(address, size)
            raise SanError(WsaError.WSAENOBUFS, f"proxy of {self.name}: mlock of {size} bytes failed: "
                           f"{os.strerror(err)} (RLIMIT_MEMLOCK?)")
        allocation = HostAllocation(next(self._ids), address, nbytes, size, physical_runs(address, nbytes))
        self._allocations[allocation.id] = allocation
        return allocation

    def free(self, allocation: Any) -> None:
        aid = getattr(allocation, "id", allocation)
        mine = self._allocations.get(aid) if is_int(aid) else None
        if mine is None or (isinstance(allocation, HostAllocation) and mine is not allocation):
            raise SanError(WsaError.WSAEINVAL, f"free: {allocation!r} is not a live allocation of the proxy of "
                                      f"{self.name} (double free?)")
        del self._allocations[mine.id]
        self._release_block(mine.address, mine.size)

    # -- P4 -------------------------------------------------------------------------------------

    def _contiguous_block(self, nbytes: int, lowest: int, highest: int, boundary: int,
                          attempts: int = 4) -> tuple[int, int, int] | None:
        """(virtual, physical base, mapped size) of a pinned, physically contiguous block, or None."""
        if "contiguous" not in self.capabilities():
            return None
        size = -(-nbytes // HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE
        rejected = []
        try:
            for _ in range(attempts):
                address = map_anonymous(size, MAP_HUGETLB)
                if address is None:
                    return None
                if libc.mlock(address, size) != 0:
                    libc.munmap(address, size)
                    return None
                _touch(address, size, HUGE_PAGE_SIZE)
                frames = physical_frames(address, size)
                contiguous = all(frames) and all(frames[i + 1] == frames[i] + 1 for i in range(len(frames) - 1))
                base = frames[0] * PAGE_SIZE if frames else 0
                last = base + nbytes - 1
                fits = contiguous and base >= lowest and last <= highest and (
                    not boundary or base // boundary == last // boundary)
                if fits:
                    return address, base, size
                rejected.append(address)  # keep it while trying others, so the next try gets other pages
            return None
        finally:
            for address in rejected:
                self._release_block(address, size)

    def _release_block(self, address: int, size: int) -> None:
        libc.munlock(address, size)
        libc.munmap(address, size)

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: int) -> int | None:
        check_integers("allocate_contiguous", nbytes=nbytes, lowest=lowest, highest=highest, boundary=boundary)
        _cache_type(cache_type)
        if nbytes <= 0 or lowest < 0 or highest < 0 or boundary < 0:
            raise SanError(WsaError.WSAEINVAL,
                           f"allocate_contiguous({nbytes!r}, {lowest!r}, {highest!r}, {boundary!r}): "
                                      "the size must be positive, addresses and boundary not negative")
        got = self._contiguous_block(nbytes, lowest, highest, boundary)
        if got is None:
            return None
        virtual, base, size = got
        self._contiguous[base] = (_Block(virtual, size, nbytes, int(cache_type)), virtual)
        return base

    def free_contiguous(self, base: int, nbytes: int, cache_type: int) -> None:
        check_integers("free_contiguous", base=base, nbytes=nbytes)
        _cache_type(cache_type)
        entry = self._contiguous.get(base)
        if entry is None:
            raise SanError(WsaError.WSAEINVAL,
                           f"free_contiguous: no contiguous block of {self.name} starts at {base:#x}")
        block, virtual = entry
        wrong = []
        if nbytes != block.nbytes:
            wrong.append(f"size {nbytes} differs from allocated {block.nbytes}")
        if int(cache_type) != block.cache_type:
            wrong.append(f"cache type {cache_type!r} differs from {block.cache_type}")
        if wrong:
            raise SanError(WsaError.WSAEINVAL, "free_contiguous at {:#x}: {}".format(base, "; ".join(wrong)))
        del self._contiguous[base]
        self._release_block(virtual, block.size)

    # -- P5 -------------------------------------------------------------------------------------

    def get_dma_adapter(self, description: Any) -> HostDmaAdapter:
        adapter = HostDmaAdapter(self, next(self._adapter_ids), check_description(description))
        self._adapters[adapter.id] = adapter
        return adapter

    def put_dma_adapter(self, adapter: Any) -> None:
        self._release_adapter(checked_put(self._adapters.values(), adapter, HostDmaAdapter, self.name))

    def _release_adapter(self, adapter: HostDmaAdapter) -> None:
        adapter.release()
        del self._adapters[adapter.id]

    # -- books ----------------------------------------------------------------------------------

    def allocated_bytes(self) -> int:
        """Bytes of the live allocations (P2), which no process's VmPin counts."""
        return sum(a.length for a in self._allocations.values())

    def live_allocations(self) -> int:
        return len(self._allocations) + len(self._contiguous) + sum(1 + len(a.buffers) for a in self._adapters.values())

    def leaks(self) -> list[str]:
        out = [f"allocation {a!r}" for a in self._allocations.values()]
        out += [f"contiguous block of {b.nbytes} bytes at {base:#x}" for base, (b, _) in self._contiguous.items()]
        for adapter in self._adapters.values():
            out += [f"common buffer at logical {logical:#x}" for logical in adapter.buffers]
        out += [f"DMA adapter #{i}" for i in self._adapters]
        return out

    def reset(self) -> None:
        """Free everything (after a leak was reported)."""
        for allocation in list(self._allocations.values()):
            self.free(allocation)
        for base, (block, virtual) in list(self._contiguous.items()):
            del self._contiguous[base]
            self._release_block(virtual, block.size)
        for adapter in list(self._adapters.values()):
            self._release_adapter(adapter)

    close = reset


class HostProxy(Protocol):
    """What host_capabilities reads of a host's proxy (the stand-in's, or the kernel module's)."""

    def capabilities(self) -> frozenset[str]: ...


def host_capabilities(proxy: HostProxy, hello: dict[str, Any] | None = None) -> frozenset[str]:
    """Capabilities to declare for a host: "verbs", "rdma_read"; "memory_windows" when its children
    bind type-2 windows; "send_waits" on IB and RoCE (receiver-not-ready flow control: a send waits for
    the peer's receive; iWARP ends the connection instead), "iwarp" on iWARP; "rdma_read_scatter" when
    the device scatters an RDMA read into the contract's MAX_SGE buffers (its max_sge_rd); plus what the
    proxy really gives. Never "nolowmem" nor "faults"."""
    caps = {"verbs", "rdma_read"}
    if hello is not None and hello.get("mw_mode") == "mw2":
        caps.add("memory_windows")
    if hello is not None:
        caps.add("iwarp" if hello.get("transport") == "iwarp" else "send_waits")
        if int(hello.get("max_sge_rd", 0)) >= MAX_SGE:
            caps.add("rdma_read_scatter")
    caps |= proxy.capabilities()
    if vm_pin_pages(os.getpid()) is not None:
        caps.add("pinned_bytes")  # the kernel counts each process's pinned pages (VmPin)
    if "contiguous" in caps:
        caps.add("dma_adapter")  # common buffers come from the same hugetlb pages
    return frozenset(caps)
