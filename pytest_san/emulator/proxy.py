"""The emulated SAN proxy driver (P1-P5): pins pages, low/contiguous memory and DMA common buffers.

It keeps its own books of everything it handed out, on top of a PhysicalMemory (which may be
shared between proxies), so it can refuse frees that do not match, count what is still alive
and describe leaks.
"""

from __future__ import annotations

import dataclasses

from ..contract import DO_DIRECT_IO, FOUR_GIB, MAX_DESCRIPTION_VERSION, PAGE_SIZE, CacheType
from ..errors import SanError, WsaError
from ..protocols import Allocation, DmaAdapter
from ..types import DeviceDescription, Leak
from ..types import is_int as _is_int
from .memory import PhysicalMemory, Run, page_up

_new = object.__new__

KERNEL_VA_BASE = 0xFFFF800000000000  # invented kernel virtual address = this + physical address

_SHIFT = PAGE_SIZE.bit_length() - 1
_MASK = PAGE_SIZE - 1


class EmulatedAllocation:
    """Pinned pages backing ``length`` bytes; ``id`` is small and unique per proxy.

    Most allocations are one run, kept as its base address alone (``_runs`` None) so the hot
    path builds no lists or tuples.
    """

    __slots__ = ("_base", "_owner", "_runs", "id", "length")

    # Made only by EmulatedProxy.allocate, which fills the slots itself (no __init__ on the hot path).
    _owner: EmulatedProxy
    id: int
    length: int
    _base: int  # first page, when the allocation is one run
    _runs: list[Run] | None  # whole-page runs, when it is several

    def page_runs(self) -> list[Run]:
        """The whole-page runs taken from the physical memory."""
        if self._runs is None:
            return [(self._base, page_up(self.length))]
        return list(self._runs)

    @property
    def physical_runs(self) -> tuple[Run, ...]:
        """(physical address, bytes) runs covering exactly ``length`` bytes (the last may end mid-page)."""
        runs = self.page_runs()
        address, nbytes = runs[-1]
        runs[-1] = (address, nbytes - ((-self.length) & _MASK))
        return tuple(runs)

    def __repr__(self) -> str:
        return f"<EmulatedAllocation #{self.id} of {self._owner.node_name}: {self.length} bytes>"


@dataclasses.dataclass(frozen=True)
class _CommonBuffer:
    length: int
    virtual: int
    cache_enabled: bool
    size: int  # page-rounded bytes taken from the memory


class EmulatedDmaAdapter:
    """The adapter get_dma_adapter returns; DMA_OPERATIONS as methods."""

    def __init__(self, owner: EmulatedProxy, id: int, description: DeviceDescription) -> None:
        self._owner = owner
        self.id = id
        self.description = description
        # A bus master that does not claim 64-bit addressing is limited to 32 bits.
        self._dma32 = not description.dma64
        self._buffers: dict[int, _CommonBuffer] = {}  # logical address -> buffer
        self.put = False

    @property
    def dma32(self) -> bool:
        return self._dma32

    @property
    def common_buffers(self) -> int:
        return len(self._buffers)

    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        """(virtual, logical) of a physically contiguous buffer; logical is the physical address."""
        self._check_usable("allocate_common_buffer")
        _integers("allocate_common_buffer", length=length)
        _flag("allocate_common_buffer", "cache_enabled", cache_enabled)
        if length <= 0:
            return None
        memory = self._owner.memory
        highest = FOUR_GIB - 1 if self._dma32 else memory.end - 1
        # 32-bit adapters get low memory even under NOLOWMEM (P3); others stay high there.
        logical: int | None = None
        if self._owner.nolowmem and not self._dma32:
            logical = memory.allocate_contiguous(length, FOUR_GIB, highest)
        if logical is None:
            logical = memory.allocate_contiguous(length, 0, highest)
        if logical is None:
            return None
        virtual = KERNEL_VA_BASE + logical
        self._buffers[logical] = _CommonBuffer(length, virtual, bool(cache_enabled), page_up(length))
        self._owner._blocks_total += 1
        return virtual, logical

    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        """Needs exactly the values allocate_common_buffer was called with and returned."""
        self._check_usable("free_common_buffer")
        _integers("free_common_buffer", length=length, logical=logical, virtual=virtual)
        _flag("free_common_buffer", "cache_enabled", cache_enabled)
        buf = self._buffers.get(logical)
        if buf is None:
            same = [lg for lg, b in self._buffers.items() if b.virtual == virtual]
            hint = f" (the one at virtual {virtual:#x} has logical {same[0]:#x})" if same else ""
            raise _einval(f"free_common_buffer: logical address {logical:#x} differs: "
                          f"no common buffer there on DMA adapter #{self.id}{hint}")
        wrong = []
        if length != buf.length:
            wrong.append(f"length {length} differs from allocated {buf.length}")
        if virtual != buf.virtual:
            wrong.append(f"virtual address {virtual:#x} differs from {buf.virtual:#x}")
        if bool(cache_enabled) != buf.cache_enabled:
            wrong.append(f"cache_enabled {bool(cache_enabled)} differs from {buf.cache_enabled}")
        if wrong:
            raise _einval(f"free_common_buffer at logical {logical:#x}: {'; '.join(wrong)}")
        self._release(logical)

    def _release(self, logical: int) -> None:
        buf = self._buffers.pop(logical)
        self._owner.memory.free_run(logical, buf.size)

    def _check_usable(self, what: str) -> None:
        if self.put:
            raise _einval(f"{what}: DMA adapter #{self.id} was already put")

    def _describe(self) -> list[str]:
        return [f"common buffer of DMA adapter #{self.id}: {b.length} bytes at logical {lg:#x} "
                f"(virtual {b.virtual:#x})" for lg, b in self._buffers.items()]

    def __repr__(self) -> str:
        return f"<EmulatedDmaAdapter #{self.id} of {self._owner.node_name} dma32={self._dma32}>"


class EmulatedProxy:
    """The proxy driver of one emulated node (implements protocols.Proxy)."""

    def __init__(self, node_name: str, memory: PhysicalMemory | None = None, nolowmem: bool = False) -> None:
        self.node_name = node_name
        self._memory = memory if memory is not None else PhysicalMemory()
        self._take = self._memory.take  # bound once: allocate/free are the registration hot path
        self._free_run = self._memory.free_run
        self._nolowmem = bool(nolowmem)
        self._min_address = FOUR_GIB if nolowmem else 0
        self._fail_next = 0
        self._next_id = 0
        self._allocations: set[EmulatedAllocation] = set()
        self._contiguous: dict[int, tuple[int, CacheType, int]] = {}  # base -> (nbytes, cache type, size)
        self._adapters: dict[int, EmulatedDmaAdapter] = {}
        self._next_adapter = 0
        self._blocks_total = 0  # contiguous blocks and common buffers ever allocated

    @property
    def memory(self) -> PhysicalMemory:
        return self._memory

    # -- P1, P3 ------------------------------------------------------------------------------

    @property
    def device_flags(self) -> int:
        return DO_DIRECT_IO

    @property
    def nolowmem(self) -> bool:
        return self._nolowmem

    def set_nolowmem(self, enabled: bool) -> None:
        if type(enabled) is not bool:
            raise TypeError(f"set_nolowmem takes True or False, got {enabled!r:.80}")
        self._nolowmem = enabled
        self._min_address = FOUR_GIB if enabled else 0

    # -- P2: pinned pages (the hot path of every registration) -------------------------------

    def allocate(self, nbytes: int) -> EmulatedAllocation:
        if self._fail_next or type(nbytes) is not int or nbytes <= 0:
            if _is_int(nbytes) and type(nbytes) is not int:  # an int subclass (not bool): as its int
                return self.allocate(int(nbytes))
            raise self._refusal(nbytes)
        size = (nbytes + _MASK) & ~_MASK  # inline: allocate is on every registration's path
        base = self._take(size, self._min_address)
        runs = None
        if base < 0:  # the first free extent is too small: spread over several
            runs = self._memory.allocate_pages(size >> _SHIFT, self._min_address)
            if runs is None:
                raise SanError(WsaError.WSAENOBUFS, f"proxy of {self.node_name}: out of physical memory "
                                                    f"for {nbytes} bytes")
        # Built field by field: a Python __init__ call would cost as much again.
        allocation = _new(EmulatedAllocation)
        allocation._owner = self
        self._next_id = allocation.id = self._next_id + 1
        allocation.length = nbytes
        allocation._base = base
        allocation._runs = runs
        self._allocations.add(allocation)
        return allocation

    def free(self, allocation: Allocation) -> None:
        # Membership in our own books refuses double frees and foreign objects alike.
        mine: EmulatedAllocation = allocation  # type: ignore[assignment]  # checked just below
        if type(mine) is not EmulatedAllocation:
            raise _einval(self._why_not_mine(allocation))
        try:
            self._allocations.remove(mine)
        except KeyError:
            raise _einval(self._why_not_mine(allocation)) from None
        runs = mine._runs
        if runs is None:
            self._free_run(mine._base, page_up(mine.length))
        else:
            self._memory.free(runs)

    def _refusal(self, nbytes: int) -> SanError:
        if not _is_int(nbytes) or nbytes <= 0:
            return _einval(f"proxy of {self.node_name}: cannot allocate {nbytes!r:.80} bytes")
        self._fail_next -= 1
        return SanError(WsaError.WSAENOBUFS, f"proxy of {self.node_name}: injected allocation failure")

    def _why_not_mine(self, allocation: object) -> str:
        if isinstance(allocation, EmulatedAllocation):
            if allocation._owner is self:
                return (f"free: allocation #{allocation.id} of {self.node_name} was already freed "
                        "(double free, or released by reset)")
            return (f"free: allocation #{allocation.id} belongs to the proxy of "
                    f"{allocation._owner.node_name}, not {self.node_name}")
        return f"free: {allocation!r:.80} is not an allocation of the proxy of {self.node_name}"

    def fail_next(self, count: int) -> None:
        """Fault injection: the next ``count`` calls to ``allocate`` raise WSAENOBUFS."""
        if not _is_int(count):
            raise TypeError(f"fail_next needs an integer count, got {count!r:.80}")
        if count < 0:
            raise ValueError(f"fail_next needs a count >= 0, got {count}")
        self._fail_next = count

    # -- P4: contiguous memory ---------------------------------------------------------------

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        _integers("allocate_contiguous", nbytes=nbytes, lowest=lowest, highest=highest, boundary=boundary)
        cache = self._cache_type(cache_type)
        nbytes, lowest, highest, boundary = int(nbytes), int(lowest), int(highest), int(boundary)
        if nbytes <= 0 or lowest < 0 or highest < 0 or boundary < 0:
            raise _einval(f"allocate_contiguous({nbytes}, {lowest}, {highest}, {boundary}): "
                          "the size must be positive, addresses and boundary not negative")
        # The caller named its range, so low memory is fine even under NOLOWMEM (P3).
        base = self._memory.allocate_contiguous(nbytes, lowest, highest, boundary)
        if base is None:
            return None
        self._contiguous[base] = (nbytes, cache, page_up(nbytes))
        self._blocks_total += 1
        return base

    def free_contiguous(self, base: int, nbytes: int, cache_type: CacheType) -> None:
        _integers("free_contiguous", base=base, nbytes=nbytes)
        block = self._contiguous.get(base)
        if block is None:
            inside = [b for b, (n, _, _) in self._contiguous.items() if b <= base < b + n]
            hint = f" (it lies inside the block at {inside[0]:#x})" if inside else ""
            raise _einval(f"free_contiguous: base {base:#x} differs: "
                          f"no contiguous block of {self.node_name} starts there{hint}")
        want_bytes, want_cache, size = block
        wrong = []
        if nbytes != want_bytes:
            wrong.append(f"size {nbytes} differs from allocated {want_bytes}")
        try:
            cache_ok = _is_int(cache_type) and CacheType(cache_type) is want_cache
        except ValueError:
            cache_ok = False
        if not cache_ok:
            wrong.append(f"cache type {cache_type!r} differs from {want_cache.name}")
        if wrong:
            raise _einval(f"free_contiguous at {base:#x}: {'; '.join(wrong)}")
        del self._contiguous[base]
        self._memory.free_run(base, size)

    @staticmethod
    def _cache_type(value: CacheType) -> CacheType:
        try:
            if _is_int(value):  # True and 1.0 equal CACHED, but are no cache types
                return CacheType(value)
        except ValueError:
            pass
        raise _einval(f"unknown cache type {value!r:.80}")

    # -- P5: DMA adapters --------------------------------------------------------------------

    def get_dma_adapter(self, description: DeviceDescription) -> EmulatedDmaAdapter:
        if not isinstance(description, DeviceDescription):
            raise _einval(f"get_dma_adapter needs a DeviceDescription, got {description!r}")
        missing = description.uninitialised()
        if missing:
            raise _einval("get_dma_adapter: DEVICE_DESCRIPTION was not zero-initialised; "
                          f"uninitialised fields: {', '.join(missing)}")
        problems = [f"{name} must be an integer, got {getattr(description, name)!r:.40}"
                    for name in _DESCRIPTION_INTS if not _is_int(getattr(description, name))]
        problems += [f"{name} must be True or False, got {getattr(description, name)!r:.40}"
                     for name in _DESCRIPTION_FLAGS if type(getattr(description, name)) is not bool]
        if problems:
            raise _einval(f"get_dma_adapter: {'; '.join(problems)}")
        if description.master is not True:
            problems.append("master must be True (a SAN NIC is a bus master)")
        if not (description.maximum_length or 0) > 0:
            problems.append(f"maximum_length must be positive, got {description.maximum_length}")
        if not 0 <= (description.version or 0) <= MAX_DESCRIPTION_VERSION:
            problems.append(f"version {description.version} is not 0..{MAX_DESCRIPTION_VERSION}")
        if problems:
            raise _einval(f"get_dma_adapter: {'; '.join(problems)}")
        self._next_adapter += 1
        # A copy: the caller's structure may be reused or changed afterwards.
        adapter = EmulatedDmaAdapter(self, self._next_adapter, dataclasses.replace(description))
        self._adapters[adapter.id] = adapter
        return adapter

    def put_dma_adapter(self, adapter: DmaAdapter) -> None:
        if not isinstance(adapter, EmulatedDmaAdapter) or self._adapters.get(adapter.id) is not adapter:
            already = isinstance(adapter, EmulatedDmaAdapter) and adapter._owner is self and adapter.put
            raise _einval(f"put_dma_adapter: {adapter!r} "
                          + ("was already put" if already else f"is not an adapter of {self.node_name}"))
        if adapter.common_buffers:
            raise _einval(f"put_dma_adapter: DMA adapter #{adapter.id} still has "
                          f"{adapter.common_buffers} common buffer(s); free them first")
        del self._adapters[adapter.id]
        adapter.put = True

    # -- books -------------------------------------------------------------------------------

    @property
    def allocated_total(self) -> int:
        """Memory allocations ever made: pinned pages, contiguous blocks, common buffers (R12)."""
        return self._next_id + self._blocks_total

    @property
    def freed_total(self) -> int:
        """Memory allocations freed so far (by their owner or by ``reset``)."""
        return self.allocated_total - self._live_memory()

    def _live_memory(self) -> int:
        return (len(self._allocations) + len(self._contiguous)
                + sum(a.common_buffers for a in self._adapters.values()))

    def live_allocations(self) -> int:
        """Allocations, contiguous blocks, common buffers and adapters not yet freed or put."""
        return self._live_memory() + len(self._adapters)

    def leaks(self) -> list[Leak]:
        details = [f"pinned allocation #{a.id}: {a.length} bytes at {a.page_runs()[0][0]:#x}"
                   for a in sorted(self._allocations, key=_by_id)]
        details += [f"contiguous block: {n} bytes at {b:#x} ({c.name})"
                    for b, (n, c, _) in self._contiguous.items()]
        for adapter in self._adapters.values():
            details += adapter._describe()
            details.append(f"DMA adapter #{adapter.id} not put")
        return [Leak(node=self.node_name, kind="allocation", detail=d) for d in details]

    def reset(self) -> None:
        """Free everything still alive (after a leak was reported) and clear fault injection."""
        for allocation in sorted(self._allocations, key=_by_id):
            self.free(allocation)
        for base, (nbytes, cache, _) in list(self._contiguous.items()):
            self.free_contiguous(base, nbytes, cache)
        for adapter in list(self._adapters.values()):
            for logical in list(adapter._buffers):
                adapter._release(logical)
            self.put_dma_adapter(adapter)
        self._fail_next = 0

    def __repr__(self) -> str:
        return f"<EmulatedProxy {self.node_name} nolowmem={self._nolowmem} live={self.live_allocations()}>"


_DESCRIPTION_INTS = ("version", "maximum_length", "interface_type")
_DESCRIPTION_FLAGS = ("master", "scatter_gather", "dma32", "dma64")


def _einval(message: str) -> SanError:
    return SanError(WsaError.WSAEINVAL, message)



def _integers(call: str, **values: object) -> None:
    """WSAEINVAL, before anything changes, for a size or address that is not an integer (True, 1.0)."""
    bad = [f"{name} {value!r:.40}" for name, value in values.items() if not _is_int(value)]
    if bad:
        raise _einval(f"{call}: not integers: {', '.join(bad)}")


def _flag(call: str, name: str, value: object) -> None:
    if type(value) is not bool:
        raise _einval(f"{call}: {name} must be True or False, got {value!r:.40}")


def _by_id(allocation: EmulatedAllocation) -> int:
    return allocation.id

