"""The guests' memory layout: how much RAM sits below 4 GiB (``--low-memory``), and what the guest's zones hold.

NOLOWMEM (LAB.md): with ``-machine max-ram-below-4g=SIZE`` qemu puts SIZE of the guest's RAM below 4 GiB and
the rest above it, so the guest has a small DMA32 zone and a Normal zone; ``swiotlb=noforce`` on the kernel
command line keeps the 64 MiB bounce buffer out of that small low memory. ``all`` is qemu's own layout (with
1 GiB, everything below 4 GiB: no Normal zone at all).
"""

from __future__ import annotations

import re

from hil.lab import LabError

__all__ = ["ALL", "DEFAULT_LOW_MEMORY", "KERNEL_ARGS", "MIN_LOW_MIB", "low_memory", "qemu_machine", "size_mib",
           "zone_summary", "zones"]

ALL = "all"
DEFAULT_LOW_MEMORY = "256M"
MIN_LOW_MIB = 64  # the DMA zone's 16 MiB, the kernel's own early allocations, and some DMA32 to spare
KERNEL_ARGS = ("swiotlb=noforce",)
_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_SIZE = re.compile(r"(\d+)([KMGT])(?:i?B)?", re.IGNORECASE)


def size_mib(text: str, bare: str | None = None) -> int | None:
    """``text`` (``256M``, ``1G``, ``1GiB``) in whole MiB, or None if it is not such a size. ``bare``: the unit
    of a number without one (qemu's ``-m`` counts MiB), else a unit is required."""
    text = text.strip()
    match = _SIZE.fullmatch(text) or (re.fullmatch(r"(\d+)()", text) if bare else None)
    if match is None:
        return None
    mib = int(match.group(1)) * _UNITS[(match.group(2) or bare or "M").upper()]
    return int(mib) if mib == int(mib) else None


def low_memory(value: str, memory: str) -> str | None:
    """``--low-memory`` checked against ``--memory``: the size below 4 GiB as qemu takes it (``256M``), or None
    for ``all``; a LabError naming the option and value otherwise."""
    if value.strip().lower() == ALL:
        return None
    low = size_mib(value)
    if low is None:
        raise LabError(f"--low-memory {value}: not a size like 256M or 1G, nor `all`")
    if low < MIN_LOW_MIB:
        raise LabError(f"--low-memory {value}: at least {MIN_LOW_MIB}M (the kernel's DMA zone and early "
                       "allocations live there)")
    total = size_mib(memory, bare="M")
    if total is None:
        raise LabError(f"--memory {memory}: not a size like 1G or 768M (--low-memory {value} is checked against it)")
    if low >= total or low >= 4096:
        raise LabError(f"--low-memory {value}: below --memory {memory} and 4G, so that the rest lies above 4 GiB "
                       "(`all` for everything below it)")
    return f"{low}M"


def qemu_machine(low: str) -> list[str]:
    """qemu merges ``-machine`` options, so this adds to vng's own (``q35``, ``accel=...``)."""
    return ["-machine", f"max-ram-below-4g={low}"]


def zones(zoneinfo: str) -> dict[str, int]:
    """Each zone's present pages in ``/proc/zoneinfo`` (summed over nodes), in its order."""
    found: dict[str, int] = {}
    zone = None
    for line in zoneinfo.splitlines():
        head = re.match(r"Node\s+\d+,\s+zone\s+(\S+)", line)
        if head:
            zone = head.group(1)
            found.setdefault(zone, 0)
            continue
        present = re.match(r"\s+present\s+(\d+)", line)
        if present and zone is not None:
            found[zone] += int(present.group(1))
    return found


def zone_summary(pages: dict[str, int], page_size: int = 4096) -> str:
    """``DMA 15 MiB, DMA32 240 MiB, Normal 768 MiB``: the zones that hold memory."""
    held = [f"{name} {round(count * page_size / (1 << 20))} MiB" for name, count in pages.items() if count]
    return ", ".join(held) or "none"
