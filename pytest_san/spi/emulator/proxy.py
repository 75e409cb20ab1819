"""The emulated SAN proxy driver (P1-P5): pins pages, low/contiguous memory and DMA common buffers.

It keeps its own books of everything it handed out, on top of a PhysicalMemory (which may be
shared between proxies), so it can refuse frees that do not match and count what is still alive.
Each live thing knows how to give itself back (``_release``): the frees, once checked, and ``reset``
use that one path.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ..contract import (
    DO_DIRECT_IO,
    PAGE_SIZE,
    CacheType,
    DeviceDescription,
    SanError,
    WsaError,
)
from ..contract import is_int as _is_int
from ..dma import CommonBuffer, DmaAdapterBooks, check_description, checked_put
from ..protocols import Allocation, Buffer, DmaAdapter
from .memory import FOUR_GIB_FRAME, PAGE_SHIFT, PhysicalMemory
from .paging import Page, PageFrames, runs
from .process import EmulatedBuffer

_new = object.__new__

KERNEL_VA_BASE = 0xFFFF800000000000  # invented kernel virtual address = this | physical address

_MASK = PAGE_SIZE - 1

# The first frame an ordinary allocation may use, without and with NOLOWMEM (P3).
_FLOOR = {False: 0, True: FOUR_GIB_FRAME}
_ANYWHERE = 1 << 62  # a frame past any memory: the searches stop at the memory's end
# The frames a common buffer may lie in, by (32-bit adapter, NOLOWMEM): a 32-bit adapter's below 4 GiB even
# under NOLOWMEM, a 64-bit adapter's above it under NOLOWMEM and anywhere otherwise (P3, P5).
_COMMON_BUFFER_FRAMES = {(True, False): (0, FOUR_GIB_FRAME), (True, True): (0, FOUR_GIB_FRAME),
                         (False, False): (0, _ANYWHERE), (False, True): (FOUR_GIB_FRAME, _ANYWHERE)}


def _frames(nbytes: int) -> int:
    """How many page frames hold ``nbytes``."""
    return (nbytes + _MASK) >> PAGE_SHIFT


class _Live(Protocol):
    """Something the proxy handed out: it gives itself back."""

    def _release(self) -> None: ...


class EmulatedAllocation:
    """Pinned pages backing ``length`` bytes: one run of frames from ``_first``."""

    __slots__ = ("_first", "_owner", "length")

    # Made only by EmulatedProxy.allocate, which fills the slots itself (no __init__ on the hot path).
    _owner: EmulatedProxy
    _first: int
    length: int

    @property
    def physical_runs(self) -> tuple[tuple[int, int], ...]:
        """(physical address, bytes) runs covering exactly ``length`` bytes."""
        return ((self._first << PAGE_SHIFT, self.length),)

    def _release(self) -> None:
        owner = self._owner
        owner._allocations.remove(self)
        owner.memory.free(self._first, _frames(self.length))

    def __repr__(self) -> str:
        return f"<pinned allocation of {self._owner.node_name}: {self.length} bytes at {self._first << PAGE_SHIFT:#x}>"


class EmulatedPin:
    """A process buffer's pages locked where they are (DO_DIRECT_IO, P1): ``physical_runs`` cover exactly its
    bytes. It ends with ``free``, or with its process."""

    __slots__ = ("_owner", "_pages", "length", "physical_runs", "process")

    def __init__(self, owner: EmulatedProxy, buffer: EmulatedBuffer, pages: list[Page],
                 physical_runs: tuple[tuple[int, int], ...]) -> None:
        self._owner = owner
        self._pages = pages
        self.process = buffer.process
        self.length = buffer.length
        self.physical_runs = physical_runs

    def _release(self) -> None:
        self._owner._pins.remove(self)
        self._owner.paging.unpin(self._pages)

    def __repr__(self) -> str:
        return f"<pin of {self.length} bytes of pid {self.process.pid} on {self._owner.node_name}>"


@dataclasses.dataclass(frozen=True)
class _Block:
    """A contiguous block (P4)."""

    owner: EmulatedProxy = dataclasses.field(repr=False)
    base: int
    nbytes: int
    cache: CacheType

    def _release(self) -> None:
        del self.owner._blocks[self.base]
        self.owner.memory.free(self.base >> PAGE_SHIFT, _frames(self.nbytes))


class EmulatedDmaAdapter(DmaAdapterBooks):
    """The adapter get_dma_adapter returns: its common buffers are runs of the proxy's page frames (the logical
    address is the physical one) within what the adapter can reach (P3, P5)."""

    def __init__(self, owner: EmulatedProxy, dma32: bool) -> None:
        super().__init__(dma32)
        self._owner = owner

    def _take(self, length: int, cache_enabled: bool) -> tuple[int, int, object] | None:
        owner = self._owner
        first = owner.memory.take_contiguous(_frames(length), *_COMMON_BUFFER_FRAMES[self.dma32, owner.nolowmem])
        if first is None:
            return None
        logical = first << PAGE_SHIFT
        return KERNEL_VA_BASE | logical, logical, None

    def _give_back(self, buf: CommonBuffer) -> None:
        self._owner.memory.free(buf.logical >> PAGE_SHIFT, _frames(buf.length))

    def _release(self) -> None:
        self.release()
        self._owner._adapters.remove(self)

    def __repr__(self) -> str:
        return f"<DMA adapter of {self._owner.node_name} dma32={self.dma32}: {len(self.buffers)} common buffer(s)>"


class EmulatedProxy:
    """The proxy driver of one emulated node (implements protocols.Proxy)."""

    # Until set_nolowmem and fail_next say otherwise: outside NOLOWMEM, no injected failures.
    _nolowmem = False
    _fail_next = 0
    _fail_after = 0

    def __init__(self, node_name: str, memory: PhysicalMemory | None = None) -> None:
        self.node_name = node_name
        self.memory = memory or PhysicalMemory()
        self._allocations: set[EmulatedAllocation] = set()
        self._blocks: dict[int, _Block] = {}  # base -> block
        self._adapters: set[EmulatedDmaAdapter] = set()
        self.paging = PageFrames(self.memory)
        self._pins: set[EmulatedPin] = set()

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

    # -- P1: direct I/O on the caller's own pages (DirectIoProxy) ----------------------------

    def _pages(self, call: str, buffer: Buffer) -> tuple[EmulatedBuffer, list[Page]]:
        """``buffer``, a wholly mapped, non-empty buffer of a live process of this node, and its pages."""
        if not isinstance(buffer, EmulatedBuffer):
            raise SanError(WsaError.WSAEFAULT, f"{call}: {buffer!r:.80} is no buffer of a process of {self.node_name}")
        if type(buffer.length) is int and buffer.length < 0:
            raise _einval(f"{call}: {buffer!r} has a negative length")
        if buffer.process.node.name != self.node_name or buffer.mem is None or buffer.length <= 0 \
                or not buffer.process.alive:
            raise SanError(WsaError.WSAEFAULT, f"{call}: {buffer!r} is not memory of a live process of "
                                               f"{self.node_name} (or is empty)")
        return buffer, self.paging.pages(buffer.process, buffer.address, buffer.length)

    def _frames(self, call: str, pages: list[Page]) -> list[int]:
        frames = self.paging.frames(pages, _FLOOR[self._nolowmem])
        if frames is None:
            raise SanError(WsaError.WSAENOBUFS, f"{call}: no free page frames on {self.node_name}")
        return frames

    def pin(self, buffer: Buffer) -> EmulatedPin:
        mine, pages = self._pages("pin", buffer)
        frames = self._frames("pin", pages)
        self.paging.pin(pages)
        pin = EmulatedPin(self, mine, pages, runs(frames, mine.address, mine.length))
        self._pins.add(pin)
        return pin

    def physical_runs(self, buffer: Buffer) -> tuple[tuple[int, int], ...]:
        _, pages = self._pages("physical_runs", buffer)
        return runs(self._frames("physical_runs", pages), buffer.address, buffer.length)

    def compact_memory(self) -> None:
        self.paging.compact(_FLOOR[self._nolowmem])

    def _ended_pins(self) -> None:
        """A pin whose process ended is gone: its exit released it."""
        for pin in [p for p in self._pins if not p.process.alive]:
            pin._release()

    # -- P2: pinned pages (the hot path of every registration) -------------------------------

    def allocate(self, nbytes: int) -> EmulatedAllocation:
        if not _is_int(nbytes) or nbytes <= 0:
            raise _einval(f"proxy of {self.node_name}: cannot allocate {nbytes!r:.80} bytes")
        if self._fail_next > 0:
            if self._fail_after > 0:
                self._fail_after -= 1
            else:
                self._fail_next -= 1
                raise SanError(WsaError.WSAENOBUFS, f"proxy of {self.node_name}: injected allocation failure")
        first = self.memory.take(_frames(nbytes), _FLOOR[self._nolowmem])
        if first is None:
            raise SanError(WsaError.WSAENOBUFS, f"proxy of {self.node_name}: no {nbytes} bytes of physical memory "
                                                "free in one run")
        # Built field by field: a Python __init__ call would cost as much again.
        allocation = _new(EmulatedAllocation)
        allocation._owner = self
        allocation._first = first
        allocation.length = nbytes
        self._allocations.add(allocation)
        return allocation

    def free(self, allocation: Allocation) -> None:
        if type(allocation) is EmulatedPin:
            self._ended_pins()
            if allocation in self._pins:
                allocation._release()
                return
        # Membership in our own books refuses double frees and foreign objects alike.
        if type(allocation) is not EmulatedAllocation or allocation not in self._allocations:
            raise _einval(f"free: {allocation!r:.120} is not a live allocation of the proxy of {self.node_name} "
                          "(a double free, released by reset, or another proxy's)")
        allocation._release()

    def fail_next(self, count: int, after: int = 0) -> None:
        """Fault injection: the next ``count`` calls to ``allocate`` raise WSAENOBUFS, once ``after`` more have
        succeeded."""
        if not _is_int(count):
            raise TypeError(f"fail_next needs an integer count, got {count!r:.80}")
        if count < 0:
            raise ValueError(f"fail_next needs a count >= 0, got {count}")
        if not _is_int(after):
            raise TypeError(f"fail_next needs an integer after, got {after!r:.80}")
        if after < 0:
            raise ValueError(f"fail_next needs an after >= 0, got {after}")
        self._fail_next, self._fail_after = count, after

    # -- P4: contiguous memory ---------------------------------------------------------------

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        _integers(nbytes=nbytes, lowest=lowest, highest=highest, boundary=boundary)
        cache = self._cache_type(cache_type)
        if nbytes <= 0 or lowest < 0 or highest < 0 or boundary < 0:
            raise _einval(f"allocate_contiguous({nbytes}, {lowest}, {highest}, {boundary}): "
                          "the size must be positive, addresses and boundary not negative")
        # The caller named its range, so low memory is fine even under NOLOWMEM (P3). Frames wholly inside it:
        # lowest rounds up to a frame, highest (the last acceptable byte) down.
        first = self.memory.take_contiguous(_frames(nbytes), _frames(lowest), (highest + 1) >> PAGE_SHIFT, boundary)
        if first is None:
            return None
        block = _Block(self, first << PAGE_SHIFT, nbytes, cache)
        self._blocks[block.base] = block
        return block.base

    def free_contiguous(self, base: int, nbytes: int, cache_type: CacheType) -> None:
        _integers(base=base, nbytes=nbytes)
        block = self._blocks.get(base)
        if block is None or nbytes != block.nbytes or not _is_int(cache_type) or cache_type != block.cache:
            raise _einval(f"free_contiguous({base:#x}, {nbytes}, {cache_type!r:.40}): no such contiguous block "
                          "(the base, size and cache type must be the allocation's); "
                          f"live: {list(self._blocks.values())}")
        block._release()

    def cache_type_of(self, base: int) -> CacheType:
        """The cache type of the live block at ``base`` (CacheTypeProxy): the model maps it as asked."""
        block = self._blocks.get(base) if _is_int(base) else None
        if block is None:
            raise _einval(f"cache_type_of({base!r:.40}): no live contiguous block of {self.node_name} starts there")
        return block.cache

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
        values = check_description(description)
        # A bus master that does not claim 64-bit addressing is limited to 32 bits.
        adapter = EmulatedDmaAdapter(self, not values["dma64"])
        self._adapters.add(adapter)
        return adapter

    def put_dma_adapter(self, adapter: DmaAdapter) -> None:
        checked_put(self._adapters, adapter, EmulatedDmaAdapter, self.node_name)._release()

    # -- books -------------------------------------------------------------------------------

    def live(self) -> list[object]:
        """Everything handed out and not yet freed or put: allocations, contiguous blocks, then each adapter's
        common buffers and the adapter."""
        self._ended_pins()
        things: list[object] = [*self._allocations, *self._pins, *self._blocks.values()]
        for adapter in self._adapters:
            things += [*adapter.buffers.values(), adapter]
        return things

    def live_allocations(self) -> int:
        """Allocations, contiguous blocks, common buffers and adapters not yet freed or put."""
        return len(self.live())

    def pinned_bytes(self) -> int:
        """Bytes of the allocations and direct-I/O pins not yet freed (PinnedBytesProxy): the pins of registrations
        and of the switch's memory; contiguous blocks and common buffers are the device's own."""
        self._ended_pins()
        return sum(a.length for a in self._allocations) + sum(p.length for p in self._pins)

    def reset(self) -> None:
        """Give back everything still alive (after a leak was reported) and clear fault injection."""
        alive: list[_Live] = [*self._allocations, *self._pins, *self._blocks.values(), *self._adapters]
        for thing in alive:  # an adapter gives back its common buffers with itself
            thing._release()
        self.paging.forget_ended()
        self._fail_next = self._fail_after = 0

    def __repr__(self) -> str:
        return f"<EmulatedProxy {self.node_name} nolowmem={self._nolowmem} live={self.live_allocations()}>"


def _einval(message: str) -> SanError:
    return SanError(WsaError.WSAEINVAL, message)


def _integers(**values: object) -> None:
    """WSAEINVAL, before anything changes, for a size or address that is not an integer (True, 1.0)."""
    bad = {name: value for name, value in values.items() if not _is_int(value)}
    if bad:
        raise _einval(f"not integers: {bad!r:.200}")

