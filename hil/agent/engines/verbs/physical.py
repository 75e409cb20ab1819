"""Physical addresses of this process's memory, from /proc/self/pagemap (readable only by root).

``physical_frames`` gives the page-frame numbers of a range (0 where unknown), ``physical_runs``
the (physical address, bytes) runs backing it; ``_touch`` faults pages in first. Used by the
pinned-memory proxy (proxy.py). Standard library only; Python 3.9+.
"""

from __future__ import annotations

import ctypes

from pytest_san.spi.contract import PAGE_SIZE

_PFN_MASK = (1 << 55) - 1
_PRESENT = 1 << 63


def _touch(address: int, size: int, step: int = PAGE_SIZE) -> None:
    """Fault every page in (writing zeros), so the pagemap names real frames."""
    for offset in range(0, size, step):
        ctypes.memset(address + offset, 0, 1)


def physical_frames(address: int, size: int) -> list[int]:
    """Physical page-frame numbers of the pages of [address, address+size); 0 where not known.

    /proc/self/pagemap gives PFNs (bits 0-54, with bit 63 = present) only to root (CAP_SYS_ADMIN);
    others read zeros.
    """
    first = address // PAGE_SIZE
    count = -(-(address + size) // PAGE_SIZE) - first
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            raw = f.read(count * 8)
    except OSError:
        return [0] * count
    frames = []
    for i in range(count):
        entry = int.from_bytes(raw[i * 8:i * 8 + 8], "little") if len(raw) >= i * 8 + 8 else 0
        frames.append(entry & _PFN_MASK if entry & _PRESENT else 0)
    return frames


def physical_runs(address: int, size: int) -> tuple[tuple[int, int], ...]:
    """(physical address, bytes) runs backing [address, address+size), or () when unknown."""
    frames = physical_frames(address, size)
    if not frames or not all(frames):
        return ()
    runs: list[list[int]] = []
    offset = address % PAGE_SIZE
    remaining = size
    for i, pfn in enumerate(frames):
        start = pfn * PAGE_SIZE + (offset if i == 0 else 0)
        nbytes = min(remaining, PAGE_SIZE - (offset if i == 0 else 0))
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1][1] += nbytes
        else:
            runs.append([start, nbytes])
        remaining -= nbytes
    return tuple((a, n) for a, n in runs)
