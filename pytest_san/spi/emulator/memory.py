"""A model of a host's physical page frames, with the 4 GiB line that NOLOWMEM is about (P3, P4).

One byte per page frame, in a bytearray: free, taken or reserved. The searches are the bytearray's own
``index`` and ``rindex`` for a run of free bytes, in C. Everything here counts in frames (a physical
address is its frame shifted left by PAGE_SHIFT), so nothing can be unaligned. Not thread-safe: callers
serialise.
"""

from __future__ import annotations

from ..contract import FOUR_GIB, PAGE_SIZE

PAGE_SHIFT = PAGE_SIZE.bit_length() - 1
GIB = 1 << 30
DEFAULT_FRAMES = 6 * GIB >> PAGE_SHIFT
RESERVED_FRAMES = 0x100000 >> PAGE_SHIFT  # the first MiB (real-mode area, BIOS) is never handed out
FOUR_GIB_FRAME = FOUR_GIB >> PAGE_SHIFT

FREE = b"\x00"
TAKEN = b"\x01"
RESERVED = b"\x02"


class PhysicalMemory:
    """Page frames [0, frames) of one host, the first ``reserved`` of them never handed out.

    ``take`` is first fit from low frames (as a free-list allocator hands out pages); ``take_contiguous``
    searches from the top down, like MmAllocateContiguousMemorySpecifyCache, so contiguous blocks do not eat
    the low memory that 32-bit devices need unless the caller asks for it. Each hands out one run of frames.
    """

    __slots__ = ("_frames",)

    def __init__(self, frames: int = DEFAULT_FRAMES, reserved: int = RESERVED_FRAMES) -> None:
        self._frames = bytearray(frames)
        self._frames[:reserved] = RESERVED * reserved

    # -- inspection (properties: views for tests and messages) ------------------------------------

    @property
    def frames(self) -> int:
        """How many frames the host has: the first frame past its memory."""
        return len(self._frames)

    @property
    def free_frames(self) -> int:
        return self._frames.count(FREE)

    @property
    def frame_map(self) -> bytes:
        """A copy of the map: one byte per frame, FREE, TAKEN or RESERVED."""
        return bytes(self._frames)

    def __repr__(self) -> str:
        return f"PhysicalMemory({self.frames} frames, {self.free_frames} free)"

    # -- allocation and freeing ----------------------------------------------------------------------

    def take(self, count: int, low: int) -> int | None:
        """The first frame of the lowest run of ``count`` free frames at or above frame ``low``, now taken;
        None when there is none."""
        frames = self._frames
        try:
            # A run longer than the map is never found: no need to build one longer than it.
            first = frames.index(FREE * min(count, len(frames)), low)
        except ValueError:
            return None
        frames[first:first + count] = TAKEN * count
        return first

    def take_contiguous(self, count: int, low: int, high: int, boundary: int = 0) -> int | None:
        """The first frame of the highest run of ``count`` free frames in [low, high) whose bytes cross no
        multiple of ``boundary`` bytes (0: no restriction), now taken; None when there is none."""
        size = count << PAGE_SHIFT
        if boundary and size > boundary:
            return None  # every such run crosses one
        frames = self._frames
        run = FREE * min(count, len(frames))
        while True:
            try:
                first = frames.rindex(run, low, high)
            except ValueError:
                return None
            start = first << PAGE_SHIFT
            if not boundary or start % boundary + size <= boundary:
                break
            high = (start // boundary + 1) * boundary >> PAGE_SHIFT  # below the multiple the run crosses
        frames[first:first + count] = TAKEN * count
        return first

    def free(self, first: int, count: int) -> None:
        """Give back ``count`` frames from ``first``; ValueError, and nothing freed, unless all are taken."""
        if self._frames.count(TAKEN, first, first + count) != count:
            raise ValueError(f"cannot free frames {first:#x}-{first + count - 1:#x}: not all of them are taken "
                             "(a double free, or not this memory's)")
        self._frames[first:first + count] = FREE * count


__all__ = ["DEFAULT_FRAMES", "FOUR_GIB_FRAME", "FREE", "GIB", "PAGE_SHIFT", "RESERVED", "RESERVED_FRAMES", "TAKEN",
           "PhysicalMemory"]
