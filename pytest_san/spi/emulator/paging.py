"""Which page frame backs each page of a node's process memory, for DO_DIRECT_IO (P1).

A page gets its frame the first time anyone asks where it is (it is faulted in), from the node's
PhysicalMemory like any ordinary allocation. A pin holds frames in place; ``compact`` moves every frame
nobody pins, as a real host's compaction may, so a proxy whose "pin" holds nothing is seen to move. The
frames of a process that ended go back to the memory, pinned or not: its exit unpins them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .memory import PAGE_SHIFT, PhysicalMemory

if TYPE_CHECKING:
    from .process import EmulatedProcess

Page = tuple["EmulatedProcess", int]  # (process, virtual page number)


class PageFrames:
    """The frames behind the node's process pages, and how many pins hold each."""

    def __init__(self, memory: PhysicalMemory) -> None:
        self.memory = memory
        self._frames: dict[Page, int] = {}
        self._pins: dict[Page, int] = {}

    def pages(self, process: EmulatedProcess, address: int, length: int) -> list[Page]:
        first = address >> PAGE_SHIFT
        last = (address + length - 1) >> PAGE_SHIFT
        return [(process, page) for page in range(first, last + 1)]

    def frames(self, pages: Sequence[Page], floor: int) -> list[int] | None:
        """The frame behind each page, faulting in those that have none (from ``floor`` up); None, and nothing
        faulted in, when the memory is full."""
        self.forget_ended()
        missing = [page for page in pages if page not in self._frames]
        got: list[int] = []
        for _ in missing:
            frame = self.memory.take(1, floor)
            if frame is None:
                for taken in got:
                    self.memory.free(taken, 1)
                return None
            got.append(frame)
        self._frames.update(zip(missing, got))  # got: a frame for each missing page
        return [self._frames[page] for page in pages]

    def pin(self, pages: Iterable[Page]) -> None:
        for page in pages:
            self._pins[page] = self._pins.get(page, 0) + 1

    def unpin(self, pages: Iterable[Page]) -> None:
        for page in pages:
            left = self._pins.get(page, 0) - 1
            if left > 0:
                self._pins[page] = left
            else:
                self._pins.pop(page, None)

    def pinned(self, pages: Iterable[Page]) -> bool:
        return all(page in self._pins for page in pages)

    def compact(self, floor: int) -> int:
        """Move every faulted-in page no pin holds to another frame (from ``floor`` up); how many moved."""
        self.forget_ended()
        moved = 0
        for page, frame in list(self._frames.items()):
            if page in self._pins:
                continue
            new = self.memory.take(1, floor)
            if new is None:
                break  # nowhere to move to: compaction stops, as it would
            self.memory.free(frame, 1)
            self._frames[page] = new
            moved += 1
        return moved

    def forget_ended(self) -> None:
        """Give back the frames of processes that ended (their exit released their pins too)."""
        ended = [page for page in self._frames if not page[0].alive]
        for page in ended:
            self.memory.free(self._frames.pop(page), 1)
            self._pins.pop(page, None)

    def clear(self) -> None:
        """Every frame back to the memory (the node's processes are restarted)."""
        for frame in self._frames.values():
            self.memory.free(frame, 1)
        self._frames.clear()
        self._pins.clear()


def runs(frames: Sequence[int], address: int, length: int) -> tuple[tuple[int, int], ...]:
    """(physical address, bytes) runs covering exactly ``length`` bytes from virtual ``address``, whose pages are
    backed by ``frames`` in order; neighbouring frames make one run."""
    out: list[list[int]] = []
    offset = address & ((1 << PAGE_SHIFT) - 1)
    left = length
    for frame in frames:
        start = (frame << PAGE_SHIFT) + offset
        nbytes = min(left, (1 << PAGE_SHIFT) - offset)
        if out and out[-1][0] + out[-1][1] == start:
            out[-1][1] += nbytes
        else:
            out.append([start, nbytes])
        left -= nbytes
        offset = 0
    return tuple((a, n) for a, n in out)


__all__ = ["Page", "PageFrames", "runs"]
