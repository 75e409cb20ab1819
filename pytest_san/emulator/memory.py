"""A model of a host's physical page frames, with the 4 GiB line that NOLOWMEM is about (P3, P4).

Free memory is kept as sorted, non-adjacent [start, end) extents in two parallel lists; nothing
is tracked per page. The common case -- one page taken from the front of the first extent, then
given back before the next is taken -- touches only the first list entry (``take`` and the fast
path of ``free_run``); other frees cost one bisect. Not thread-safe: callers serialise.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from ..types import FOUR_GIB, PAGE_SIZE

GIB = 1 << 30
DEFAULT_SIZE = 6 * GIB
RESERVED_BELOW = 0x100000  # the first MiB (real-mode area, BIOS) is never handed out

_MASK = PAGE_SIZE - 1

Run = tuple[int, int]
"""(physical address, bytes) of one physically contiguous piece."""


def page_up(value: int) -> int:
    """``value`` rounded up to whole pages."""
    return (value + _MASK) & ~_MASK


class PhysicalMemory:
    """Page frames [reserved_below, size) of one host.

    ``allocate_pages`` is first-fit from low addresses (as a free-list allocator would hand
    out pages); ``allocate_contiguous`` searches from the top down, like
    MmAllocateContiguousMemorySpecifyCache, so contiguous blocks do not eat low memory that
    32-bit devices need unless the caller asks for it.
    """

    __slots__ = ("_ends", "_starts", "end", "start")

    def __init__(self, size: int = DEFAULT_SIZE, reserved_below: int = RESERVED_BELOW) -> None:
        if size & _MASK or reserved_below & _MASK:
            raise ValueError("size and reserved_below must be page multiples")
        if not 0 <= reserved_below < size:
            raise ValueError(f"no usable memory between {reserved_below:#x} and {size:#x}")
        self.start = reserved_below
        self.end = size
        self._starts: list[int] = [reserved_below]
        self._ends: list[int] = [size]

    # -- inspection --------------------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        return self.end - self.start

    @property
    def free_bytes(self) -> int:
        return sum(self._ends) - sum(self._starts)

    def extents(self) -> list[Run]:
        """The free extents as (start, end) pairs, ascending."""
        return list(zip(self._starts, self._ends, strict=True))

    def is_free(self, address: int, nbytes: int) -> bool:
        """Whether every byte of [address, address + nbytes) is free."""
        i = bisect_right(self._starts, address) - 1
        return i >= 0 and address + nbytes <= self._ends[i]

    def __repr__(self) -> str:
        return (f"PhysicalMemory({self.start:#x}-{self.end:#x}, free {self.free_bytes:#x} bytes "
                f"in {len(self._starts)} extents)")

    # -- page allocation ---------------------------------------------------------------------

    def take(self, nbytes: int, min_address: int = 0) -> int:
        """Hot path: ``nbytes`` (a page multiple) as one run from the front of the first extent
        at or above ``min_address``; -1 (nothing changed) when that extent is too small.

        ``allocate_pages`` gives the same first-fit answer, but may spread over several extents.
        """
        if nbytes <= 0 or nbytes & _MASK:
            raise ValueError(f"take needs a positive page multiple, got {nbytes:#x}")
        starts = self._starts
        if starts and min_address <= starts[0]:
            start = starts[0]
            rest = self._ends[0] - start - nbytes
            if rest > 0:
                starts[0] = start + nbytes
                return start
            if rest == 0:
                del starts[0], self._ends[0]
                return start
            return -1
        i, start = self._first_at(min_address)
        if i < 0 or self._ends[i] - start < nbytes:
            return -1
        self._carve(i, start, start + nbytes)
        return start

    def allocate_pages(self, npages: int, min_address: int = 0) -> list[Run] | None:
        """``npages`` pages at or above ``min_address``, first fit, possibly in several runs.

        Returns the runs in ascending order, or None (and changes nothing) when not enough
        memory is free above ``min_address``.
        """
        nbytes = npages * PAGE_SIZE
        if nbytes <= 0:
            raise ValueError(f"allocate_pages needs a positive page count, got {npages}")
        base = self.take(nbytes, min_address)
        if base >= 0:
            return [(base, nbytes)]
        i, start = self._first_at(min_address)
        if i < 0:
            return None
        return self._allocate_scattered(i, start, nbytes)

    def _first_at(self, min_address: int) -> tuple[int, int]:
        """(index, first usable address) of the first extent with free pages at or above
        ``min_address``; (-1, 0) if there is none."""
        starts = self._starts
        if starts and min_address <= starts[0]:
            return 0, starts[0]
        min_address = page_up(min_address)
        i = bisect_right(self._ends, min_address)
        if i == len(starts):
            return -1, 0
        return i, max(starts[i], min_address)

    def _allocate_scattered(self, i: int, start: int, nbytes: int) -> list[Run] | None:
        """Gather ``nbytes`` from extent ``i`` (from ``start``) onwards; None if there is not enough."""
        starts = self._starts
        ends = self._ends
        pieces: list[tuple[int, int, int]] = []  # (extent index, start, end)
        need = nbytes
        j = i
        while need and j < len(starts):
            lo = start if j == i else starts[j]
            hi = min(ends[j], lo + need)
            pieces.append((j, lo, hi))
            need -= hi - lo
            j += 1
        if need:
            return None
        # Carve from the last extent back, so earlier indices stay valid.
        for j, lo, hi in reversed(pieces):
            self._carve(j, lo, hi)
        return [(lo, hi - lo) for _, lo, hi in pieces]

    # -- contiguous allocation ---------------------------------------------------------------

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int = 0) -> int | None:
        """Base of a page-aligned, physically contiguous block of ``nbytes`` (rounded up to pages).

        The block lies in [lowest, highest] (``highest`` is the highest acceptable address of
        the last byte) and crosses no multiple of ``boundary`` (0: no restriction). Searches
        from the top down. None when no such block is free.
        """
        if nbytes <= 0:
            raise ValueError(f"allocate_contiguous needs a positive size, got {nbytes}")
        if boundary < 0:
            raise ValueError(f"boundary must not be negative, got {boundary}")
        size = page_up(nbytes)
        if boundary and size > boundary:
            return None
        floor = max(page_up(lowest), self.start)
        ceiling = (min(highest + 1, self.end)) & ~_MASK  # exclusive, page aligned
        if ceiling - floor < size:
            return None
        starts = self._starts
        ends = self._ends
        i = bisect_right(starts, ceiling - 1) - 1  # last extent starting below the ceiling
        while i >= 0:
            lo = max(starts[i], floor)
            hi = min(ends[i], ceiling)
            while hi - lo >= size:
                base = hi - size
                if not boundary or base // boundary == (hi - 1) // boundary:
                    self._carve(i, base, hi)
                    return base
                # The block would straddle a boundary multiple: end it at that multiple.
                hi = ((hi - 1) // boundary * boundary) & ~_MASK
            if starts[i] <= floor:
                return None  # everything below is under ``lowest``
            i -= 1
        return None

    # -- freeing -----------------------------------------------------------------------------

    def free_run(self, address: int, nbytes: int) -> None:
        """Give back one run; merges with free neighbours. ValueError if any of it is not allocated."""
        end = address + nbytes
        starts = self._starts
        # Fast path: the run ends where the first free extent begins (low memory reused LIFO).
        if starts and end == starts[0] and self.start <= address < end and not (address | nbytes) & _MASK:
            starts[0] = address
            return
        ends = self._ends
        n = len(starts)
        i = bisect_right(starts, address)  # extents [0, i) start at or below address
        # The run must fit in the allocated gap between extents i-1 and i.
        lo = ends[i - 1] if i else self.start
        hi = starts[i] if i < n else self.end
        if not lo <= address < end <= hi or (address | nbytes) & _MASK:
            raise self._bad_free(address, nbytes)
        if address == lo and i:
            if end == hi and i < n:  # fills the gap: the two extents become one
                ends[i - 1] = ends[i]
                del starts[i], ends[i]
            else:
                ends[i - 1] = end
        elif end == hi and i < n:
            starts[i] = address
        else:
            starts.insert(i, address)
            ends.insert(i, end)

    def _bad_free(self, address: int, nbytes: int) -> ValueError:
        what = f"cannot free {nbytes:#x} bytes at {address:#x}"
        if nbytes <= 0 or (address | nbytes) & _MASK:
            return ValueError(f"{what}: not a positive, page-aligned run")
        if address < self.start or address + nbytes > self.end:
            return ValueError(f"{what}: outside this memory ({self.start:#x}-{self.end:#x})")
        return ValueError(f"{what}: part of it is not allocated (double free?)")

    def free(self, runs: Iterable[Run]) -> None:
        """Give back several runs; all or nothing (on ValueError nothing is freed)."""
        done: list[Run] = []
        try:
            for address, nbytes in runs:
                self.free_run(address, nbytes)
                done.append((address, nbytes))
        except ValueError:
            for address, nbytes in done:
                self._reserve(address, nbytes)
            raise

    # -- internals ---------------------------------------------------------------------------

    def _reserve(self, address: int, nbytes: int) -> None:
        """Take back a range known to be free (rollback of a partial ``free``)."""
        i = bisect_right(self._starts, address) - 1
        self._carve(i, address, address + nbytes)

    def _carve(self, i: int, lo: int, hi: int) -> None:
        """Remove [lo, hi) from free extent ``i``, which contains it."""
        starts = self._starts
        ends = self._ends
        s, e = starts[i], ends[i]
        if lo == s:
            if hi == e:
                del starts[i], ends[i]
            else:
                starts[i] = hi
        elif hi == e:
            ends[i] = lo
        else:
            ends[i] = lo
            starts.insert(i + 1, hi)
            ends.insert(i + 1, e)


__all__ = ["DEFAULT_SIZE", "FOUR_GIB", "GIB", "PAGE_SIZE", "RESERVED_BELOW", "PhysicalMemory", "Run"]
