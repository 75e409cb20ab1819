"""The proxy driver on a lab host that has pytest-san's kernel module: ``KernelProxy`` over /dev/san_proxy.

Every call the contract gives the proxy is an ioctl of the module (``hil/kmod/san_proxy.h``), in the agent's own
process: ordinary allocations (pages from wherever an ordinary allocation may come, above 4 GiB only under
NOLOWMEM), contiguous blocks of a cache type (mapped here, so that the type is read back from the page table),
DMA adapters on a device with a real 32- or 64-bit DMA mask and their common buffers, NOLOWMEM itself (the
kernel's reserve ratio, given back when the agent's file closes, however the agent ends). A pin (DO_DIRECT_IO)
is made by the process that owns the buffer (``pins.py``, in the child). The arguments are checked here first,
in the contract's order and with its codes; an errno the module still returns is mapped to a WSA code.

Each ioctl runs in one worker thread and is waited for at most ``CALL_TIMEOUT`` seconds: a module stuck in the
kernel makes that call fail with a message that says so, and every later one at once, instead of hanging the
agent.

Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

import concurrent.futures
import errno
import itertools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hil.agent.engines.verbs.proxy_module import (
    CACHE_OTHER,
    KIND_ADAPTER,
    KIND_ALLOCATION,
    KIND_COMMON,
    KIND_CONTIGUOUS,
    Info,
    ProxyDevice,
    live_counts,
)
from pytest_san.spi.contract import PAGE_SIZE, CacheType, SanError, WsaError, is_int
from pytest_san.spi.dma import CommonBuffer, DmaAdapterBooks, check_description, check_integers, checked_put

#: What the action an ioctl runs returns.
T = TypeVar("T")

CALL_TIMEOUT = 60.0  # an ioctl of the module never takes this long, even under TCG: it is stuck
COMPACT_MEMORY = Path("/proc/sys/vm/compact_memory")
ZONEINFO = Path("/proc/zoneinfo")

# errno -> the contract's code, for what the module refuses after our own checks passed
_CODES = {errno.EINVAL: WsaError.WSAEINVAL, errno.EFAULT: WsaError.WSAEFAULT, errno.ENOMEM: WsaError.WSAENOBUFS,
          errno.EBUSY: WsaError.WSAEINVAL, errno.EPERM: WsaError.WSAEOPNOTSUPP, errno.EACCES: WsaError.WSAEOPNOTSUPP,
          errno.ENOENT: WsaError.WSAEOPNOTSUPP, errno.ENODEV: WsaError.WSAEOPNOTSUPP}


def as_san_error(exc: OSError, call: str) -> SanError:
    """The SanError a call of the proxy raises for what the module (or opening it) refused."""
    code = _CODES.get(exc.errno or 0, WsaError.WSAEINVAL)
    return SanError(code, f"{call}: {exc.strerror or exc} (san_proxy: {exc})")


def zone_protection(text: str) -> dict[str, tuple[int, list[int]]]:
    """/proc/zoneinfo's zones (of node 0): name -> (managed pages, its ``protection:`` entries)."""
    zones: dict[str, tuple[int, list[int]]] = {}
    name, managed = "", 0
    for line in text.splitlines():
        head = re.match(r"Node (\d+), zone\s+(\S+)", line)
        if head:
            name, managed = (head.group(2) if head.group(1) == "0" else ""), 0
            continue
        words = line.split()
        if name and words[:1] == ["managed"]:
            managed = int(words[1])
        elif name and words[:1] == ["protection:"]:
            zones[name] = (managed, [int(w) for w in re.findall(r"\d+", line)])
    return zones


def nolowmem_in_effect(text: str) -> bool:
    """Whether /proc/zoneinfo shows NOLOWMEM: memory above 4 GiB (a Normal zone with pages), and every zone below
    it protected against allocations that may use Normal by at least all its pages."""
    zones = zone_protection(text)
    normal = zones.get("Normal")
    names = list(zones)
    if normal is None or normal[0] == 0 or "DMA32" not in zones:
        return False
    index = names.index("Normal")
    low = [zones[n] for n in ("DMA", "DMA32") if n in zones]
    return all(len(protection) > index and protection[index] >= managed for managed, protection in low)


class KernelAllocation:
    """Pages the module allocated (the Allocation protocol)."""

    __slots__ = ("id", "length", "physical_runs")

    def __init__(self, id: int, length: int, runs: tuple[tuple[int, int], ...]) -> None:
        self.id = id
        self.length = length
        self.physical_runs = runs

    def __repr__(self) -> str:
        return f"<san_proxy allocation #{self.id}: {self.length} bytes>"


class KernelPin:
    """A buffer's pages the module pinned in the buffer's own process (``pins.py``)."""

    __slots__ = ("id", "length", "pages", "physical_runs", "process")

    def __init__(self, process: Any, id: int, length: int, pages: int, runs: tuple[tuple[int, int], ...]) -> None:
        self.process = process  # the engine's ModelledProcess
        self.id = id
        self.length = length
        self.pages = pages  # pinned, in the process's VmPin
        self.physical_runs = runs

    def __repr__(self) -> str:
        return f"<san_proxy pin #{self.id} of {self.length} bytes in pid {self.process.pid}>"


class KernelBlock:
    __slots__ = ("base", "cache_type", "id", "nbytes", "virtual")

    def __init__(self, id: int, base: int, nbytes: int, cache_type: int, virtual: int) -> None:
        self.id = id
        self.base = base
        self.nbytes = nbytes
        self.cache_type = cache_type
        self.virtual = virtual  # where the agent mapped it


def _pages(nbytes: int) -> int:
    return -(-nbytes // PAGE_SIZE)


class KernelDmaAdapter(DmaAdapterBooks):
    """IoGetDmaAdapter's adapter: a device of the module's with a 32- or 64-bit DMA mask; common buffers are
    dma_alloc_coherent's, mapped here."""

    def __init__(self, owner: KernelProxy, id: int, dma32: bool, description: dict[str, Any]) -> None:
        super().__init__(dma32)
        self._owner = owner
        self.id = id
        self.description = description

    def _take(self, length: int, cache_enabled: bool) -> tuple[int, int, object] | None:
        owner = self._owner
        got = owner.ioctl("allocate_common_buffer", lambda d: d.allocate_common(self.id, length, cache_enabled))
        if got is None:
            return None
        buf_id, logical = got
        virtual = owner.mapped(buf_id, length, KIND_COMMON, logical, length, int(cache_enabled))
        return virtual, logical, buf_id

    def _give_back(self, buf: CommonBuffer) -> None:
        held = buf.held
        assert isinstance(held, int)  # the module's id of the buffer, which _take kept
        self._owner.unmapped(buf.virtual, buf.length)
        self._owner.ioctl("free_common_buffer", lambda d: d.free(held, KIND_COMMON, buf.logical, buf.length,
                                                                 int(buf.cache_enabled)))

    def __repr__(self) -> str:
        return f"<san_proxy DMA adapter #{self.id} dma32={self.dma32}: {len(self.buffers)} common buffer(s)>"


class KernelProxy:
    """The proxy driver of a host with the san_proxy module (P1-P5; ``DirectIoProxy`` and ``CacheTypeProxy``)."""

    def __init__(self, name: str, device: ProxyDevice | None = None) -> None:
        self.name = name
        self.device = device or ProxyDevice()
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="san_proxy")
        self._stuck: str | None = None
        self.info: Info = self.ioctl("info", lambda d: d.info())
        self._allocations: dict[int, KernelAllocation] = {}
        self._pins: dict[int, KernelPin] = {}
        self._pin_keys = itertools.count(1)
        self._blocks: dict[int, KernelBlock] = {}  # base -> block
        self._adapters: dict[int, KernelDmaAdapter] = {}
        self._nolowmem = False
        self._caps: frozenset[str] | None = None

    # -- the module, bounded ----------------------------------------------------------------------

    def ioctl(self, call: str, action: Callable[[ProxyDevice], T]) -> T:
        """``action(device)`` in the worker, at most CALL_TIMEOUT s; an errno becomes the contract's SanError."""
        if self._stuck is not None:
            raise SanError(WsaError.WSAENETDOWN, f"{call}: the san_proxy module is stuck in the kernel since "
                                                 f"{self._stuck} (see the guest's console)")
        future = self._worker.submit(action, self.device)
        try:
            return future.result(CALL_TIMEOUT)
        except concurrent.futures.TimeoutError:
            self._stuck = f"{call} did not return within {CALL_TIMEOUT:g} s"
            raise SanError(WsaError.WSAENETDOWN, f"{call}: {self._stuck}: the san_proxy module is stuck in the "
                                                 "kernel (see the guest's console)") from None
        except OSError as exc:
            raise as_san_error(exc, f"{call} on {self.name}") from None

    def mapped(self, obj: int, length: int, kind: int, base: int, nbytes: int, cache: int) -> int:
        """The object mapped into the agent (its user page-table entries are what P4 reads back); freed again if
        it cannot be."""
        try:
            return self.ioctl("mmap", lambda d: d.map(obj, length))
        except SanError:
            self.ioctl("free", lambda d: d.free(obj, kind, base, nbytes, cache))
            raise

    def unmapped(self, virtual: int, length: int) -> None:
        self.ioctl("munmap", lambda d: d.unmap(virtual, length))

    # -- P1, P3 -----------------------------------------------------------------------------------

    @property
    def device_flags(self) -> int:
        return self.info.device_flags  # what the module's device object says, not a constant of ours

    @property
    def nolowmem(self) -> bool:
        return self._nolowmem

    def set_nolowmem(self, enabled: bool) -> None:
        if type(enabled) is not bool:
            raise TypeError(f"set_nolowmem takes True or False, got {enabled!r:.80}")
        if enabled and "nolowmem" not in self.capabilities():
            raise SanError(WsaError.WSAEOPNOTSUPP, f"NOLOWMEM on {self.name}: the guest has no memory above 4 GiB to "
                                                   "fall back on (capability 'nolowmem' absent; san-hil lab up "
                                                   "--low-memory gives it some)")
        if enabled != self._nolowmem:
            self.ioctl("set_nolowmem", lambda d: d.set_nolowmem(enabled))
            self._nolowmem = enabled

    def capabilities(self) -> frozenset[str]:
        """What the module gives: every proxy capability, ``cache_types`` where PAT is on, ``nolowmem`` where
        taking it shows in /proc/zoneinfo (memory above 4 GiB, and the zones below protected)."""
        if self._caps is None:
            caps = {"physical_addresses", "contiguous", "dma_adapter", "direct_io"}
            if self.info.pat:
                caps.add("cache_types")
            if not self._nolowmem:
                self.ioctl("set_nolowmem", lambda d: d.set_nolowmem(True))
                try:
                    shown = nolowmem_in_effect(ZONEINFO.read_text())
                finally:
                    self.ioctl("set_nolowmem", lambda d: d.set_nolowmem(False))
                if shown:
                    caps.add("nolowmem")
            self._caps = frozenset(caps)
        return self._caps

    def describe(self) -> dict[str, Any]:
        """For the report: which proxy ran here."""
        return {"kind": "kernel module", "module": "san_proxy", "abi": self.info.abi,
                "device_flags": self.info.device_flags, "pat": self.info.pat,
                "max_contiguous": self.info.max_contiguous}

    # -- P1: pins (in the buffer's own process), where a buffer is, compaction ------------------

    @staticmethod
    def _buffer(call: str, buffer: Any) -> tuple[Any, int, int]:
        """(process, address, length) of a buffer of a live process of this host: the checks of a pin."""
        process: Any = getattr(buffer, "process", None)
        address, length = getattr(buffer, "address", None), getattr(buffer, "length", None)
        if not hasattr(process, "child") or not is_int(address) or not is_int(length):
            raise SanError(WsaError.WSAEFAULT, f"{call}: {buffer!r:.80} is no buffer of a process of this host")
        if length < 0:
            raise SanError(WsaError.WSAEINVAL, f"{call}: {buffer!r:.80} has a negative length")
        if length == 0 or not process.alive:
            raise SanError(WsaError.WSAEFAULT, f"{call}: {buffer!r:.80} is empty, or its process has ended")
        return process, address, length

    def pin(self, buffer: Any) -> KernelPin:
        process, address, length = self._buffer("pin", buffer)
        got = process.child.call("proxy_pin", address=address, length=length)
        pin = KernelPin(process, int(got["id"]), length, int(got["pages"]),
                        tuple((int(a), int(n)) for a, n in got["runs"]))
        self._pins[next(self._pin_keys)] = pin
        return pin

    def physical_runs(self, buffer: Any) -> tuple[tuple[int, int], ...]:
        process, address, length = self._buffer("physical_runs", buffer)
        runs = process.child.call("proxy_frames", address=address, length=length)
        return tuple((int(a), int(n)) for a, n in runs)

    def compact_memory(self) -> None:
        try:
            COMPACT_MEMORY.write_text("1\n")
        except OSError as exc:
            raise SanError(WsaError.WSAEOPNOTSUPP, f"compact_memory on {self.name}: {exc}") from None

    def pinned_pages(self, pid: int) -> int:
        """Pages the proxy's books say it pinned in process ``pid`` (the pin witness adds them to its MRs')."""
        return sum(p.pages for p in self._pins.values() if p.process.pid == pid and p.process.alive)

    def _ended_pins(self) -> None:
        """A pin of a process that ended is gone: the module unpinned it when the process's file closed."""
        for key in [k for k, p in self._pins.items() if not p.process.alive]:
            del self._pins[key]

    # -- P2 ---------------------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> KernelAllocation:
        if not is_int(nbytes) or nbytes <= 0:
            raise SanError(WsaError.WSAEINVAL, f"proxy of {self.name}: cannot allocate {nbytes!r:.80} bytes")
        obj, _ = self.ioctl(f"allocate({nbytes})", lambda d: d.allocate(nbytes))
        try:
            runs = self.ioctl("query", lambda d: d.query(obj)).runs
        except SanError:
            self.ioctl("free", lambda d: d.free(obj, KIND_ALLOCATION))
            raise
        allocation = KernelAllocation(obj, nbytes, runs)
        self._allocations[obj] = allocation
        return allocation

    def free(self, allocation: Any) -> None:
        if isinstance(allocation, KernelPin):
            self._ended_pins()
            key = next((k for k, p in self._pins.items() if p is allocation), None)
            if key is not None:
                allocation.process.child.call("proxy_unpin", pin_id=allocation.id)
                del self._pins[key]
                return
        mine = self._allocations.get(allocation.id) if isinstance(allocation, KernelAllocation) else None
        if mine is None or mine is not allocation:
            raise SanError(WsaError.WSAEINVAL, f"free: {allocation!r:.120} is not a live allocation of the proxy of "
                                               f"{self.name} (a double free, or its process ended?)")
        self._free_allocation(mine.id)

    def _free_allocation(self, obj: int) -> None:
        self.ioctl("free", lambda d: d.free(obj, KIND_ALLOCATION))
        del self._allocations[obj]

    # -- P4 ---------------------------------------------------------------------------------------

    @staticmethod
    def _cache_type(value: Any) -> int:
        if not is_int(value) or value not in tuple(CacheType):
            raise SanError(WsaError.WSAEINVAL, f"unknown cache type {value!r:.80}")
        return int(value)

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: int) -> int | None:
        check_integers("allocate_contiguous", nbytes=nbytes, lowest=lowest, highest=highest, boundary=boundary)
        cache = self._cache_type(cache_type)
        if nbytes <= 0 or lowest < 0 or highest < 0 or boundary < 0:
            raise SanError(WsaError.WSAEINVAL, f"allocate_contiguous({nbytes!r}, {lowest!r}, {highest!r}, "
                                               f"{boundary!r}): the size must be positive, addresses and boundary "
                                               "not negative")
        if boundary % PAGE_SIZE or highest >= 1 << 64 or lowest >= 1 << 64:
            return None  # no block of whole pages keeps within such a boundary, nor lies past 64 bits
        got = self.ioctl("allocate_contiguous", lambda d: d.allocate_contiguous(nbytes, lowest, highest, boundary,
                                                                                 cache))
        if got is None:
            return None
        obj, base = got
        virtual = self.mapped(obj, nbytes, KIND_CONTIGUOUS, base, nbytes, cache)
        self._blocks[base] = KernelBlock(obj, base, nbytes, cache, virtual)
        return base

    def free_contiguous(self, base: int, nbytes: int, cache_type: int) -> None:
        check_integers("free_contiguous", base=base, nbytes=nbytes)
        cache = self._cache_type(cache_type)
        block = self._blocks.get(base)
        if block is None or nbytes != block.nbytes or cache != block.cache_type:
            raise SanError(WsaError.WSAEINVAL, f"free_contiguous({base:#x}, {nbytes}, {cache_type!r:.40}): no such "
                                               f"contiguous block of {self.name} (the base, size and cache type must "
                                               "be the allocation's)")
        self._release_block(block)

    def _release_block(self, block: KernelBlock) -> None:
        self.unmapped(block.virtual, block.nbytes)
        self.ioctl("free_contiguous", lambda d: d.free(block.id, KIND_CONTIGUOUS, block.base, block.nbytes,
                                                       block.cache_type))
        del self._blocks[block.base]

    def cache_type_of(self, base: int) -> CacheType:
        block = self._blocks.get(base) if is_int(base) else None
        if block is None:
            raise SanError(WsaError.WSAEINVAL, f"cache_type_of({base!r:.40}): no live contiguous block of "
                                               f"{self.name} starts there")
        ptes = self.ioctl("ptes", lambda d: d.ptes(block.virtual, _pages(block.nbytes)))
        types = {pte.cache_type if pte.present else CACHE_OTHER for pte in ptes}
        if len(types) != 1 or CACHE_OTHER in types:
            raise SanError(WsaError.WSAEINVAL, f"cache_type_of({base:#x}): its pages are mapped "
                                               f"{sorted(types)} (mixed, or none of the three)")
        return CacheType(types.pop())

    # -- P5 ---------------------------------------------------------------------------------------

    def get_dma_adapter(self, description: Any) -> KernelDmaAdapter:
        values = check_description(description)
        got = self.ioctl("get_dma_adapter", lambda d: d.get_adapter(
            version=values["version"], master=values["master"], scatter_gather=values["scatter_gather"],
            dma32=values["dma32"], dma64=values["dma64"], interface_type=values["interface_type"],
            maximum_length=values["maximum_length"]))
        adapter = KernelDmaAdapter(self, got.id, not values["dma64"], values)  # the module's device: 32 bits
        self._adapters[adapter.id] = adapter
        return adapter

    def put_dma_adapter(self, adapter: Any) -> None:
        self._release_adapter(checked_put(self._adapters.values(), adapter, KernelDmaAdapter, self.name))

    def _release_adapter(self, adapter: KernelDmaAdapter) -> None:
        adapter.release()
        self.ioctl("put_dma_adapter", lambda d: d.free(adapter.id, KIND_ADAPTER))
        del self._adapters[adapter.id]

    # -- books ------------------------------------------------------------------------------------

    def allocated_bytes(self) -> int:
        """Bytes of the live allocations (P2), which no process's VmPin counts."""
        return sum(a.length for a in self._allocations.values())

    def live_allocations(self) -> int:
        self._ended_pins()
        return len(self._allocations) + len(self._pins) + len(self._blocks) + \
            sum(1 + len(a.buffers) for a in self._adapters.values())

    def leaks(self) -> list[str]:
        self._ended_pins()
        out = [f"allocation {a!r}" for a in self._allocations.values()]
        out += [f"pin {p!r}" for p in self._pins.values()]
        out += [f"contiguous block of {b.nbytes} bytes at {b.base:#x}" for b in self._blocks.values()]
        for adapter in self._adapters.values():
            out += [f"common buffer at logical {logical:#x}" for logical in adapter.buffers]
        out += [f"DMA adapter #{i}" for i in self._adapters]
        return out

    def module_live(self) -> dict[str, int]:
        """What the module says every open file holds (its own count, apart from our books)."""
        try:
            return live_counts()
        except OSError:
            return {}

    def reset(self) -> None:
        """Everything given back, NOLOWMEM left (the end of every test)."""
        for pin in list(self._pins.values()):
            if pin.process.alive:
                pin.process.child.call("proxy_unpin", pin_id=pin.id)
        self._pins.clear()
        for obj in list(self._allocations):
            self._free_allocation(obj)
        for block in list(self._blocks.values()):
            self._release_block(block)
        for adapter in list(self._adapters.values()):
            self._release_adapter(adapter)
        if self._nolowmem:
            self.set_nolowmem(False)

    def close(self) -> None:
        """The agent ends: everything given back; closing the file would do it too."""
        try:
            if self._stuck is None:
                self.reset()
        finally:
            if self._stuck is None:
                self.device.close()
            self._worker.shutdown(wait=False)


def module_available(path: str = "/dev/san_proxy") -> bool:
    return os.path.exists(path)
