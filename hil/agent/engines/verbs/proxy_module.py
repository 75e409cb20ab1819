"""The low-level binding of the proxy driver module, ``/dev/san_proxy`` (hil/kmod/san_proxy.c).

One :class:`ProxyDevice` is one open file of the device: the objects it creates (pins, allocations,
contiguous blocks, DMA adapters, common buffers) and the NOLOWMEM mode it takes belong to that file, and
the module releases all of them when the file is closed, or its process dies. The layouts and ioctl
numbers below mirror ``hil/kmod/san_proxy.h``, the contract (a test compiles the header and compares).

Every failing call raises ``OSError(errno, "<ioctl>(<arguments>): <strerror>")``. Standard library only,
Python 3.9+.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import mmap as _mmap
import os
import struct
from dataclasses import dataclass

from hil.agent.engines.verbs.libc import MAP_FAILED, PROT_RW, libc

DEVICE = "/dev/san_proxy"
LIVE = "/sys/class/misc/san_proxy/live"
ABI = 1
MAGIC = 0xD5

KIND_PIN, KIND_ALLOCATION, KIND_CONTIGUOUS, KIND_ADAPTER, KIND_COMMON = 1, 2, 3, 4, 5
NON_CACHED, CACHED, WRITE_COMBINED, CACHE_OTHER = 0, 1, 2, 3
DO_DIRECT_IO = 0x10

PTE_PRESENT = 1 << 63
PTE_CACHE_SHIFT = 56
PTE_PFN_MASK = (1 << 52) - 1

PAGE_SIZE = _mmap.PAGESIZE
MAP_SHARED = getattr(_mmap, "MAP_SHARED", 1)


class Layout:
    """A structure of san_proxy.h: its fields in order, as (name, struct format) pairs."""

    def __init__(self, fields: tuple[tuple[str, str], ...]) -> None:
        self.fields = fields
        self.struct = struct.Struct("=" + "".join(code for _, code in fields))
        self.offsets = {name: struct.calcsize("=" + "".join(code for _, code in fields[:i]))
                        for i, (name, _) in enumerate(fields)}

    @property
    def size(self) -> int:
        return self.struct.size


LAYOUTS: dict[str, Layout] = {
    "san_proxy_info": Layout((("abi", "I"), ("device_flags", "I"), ("max_contiguous", "Q"), ("nolowmem", "I"),
                              ("pat", "I"), ("page_size", "Q"), ("reserved", "4Q"))),
    "san_proxy_pin": Layout((("address", "Q"), ("length", "Q"), ("flags", "I"), ("id", "I"), ("pages", "Q"))),
    "san_proxy_allocate": Layout((("length", "Q"), ("flags", "I"), ("id", "I"), ("pages", "Q"))),
    "san_proxy_contiguous": Layout((("length", "Q"), ("lowest", "Q"), ("highest", "Q"), ("boundary", "Q"),
                                    ("cache_type", "I"), ("id", "I"), ("base", "Q"))),
    "san_proxy_description": Layout((("version", "I"), ("master", "I"), ("scatter_gather", "I"), ("dma32", "I"),
                                     ("dma64", "I"), ("interface_type", "I"), ("maximum_length", "Q"),
                                     ("reserved", "4Q"), ("id", "I"), ("map_registers", "I"), ("dma_mask", "Q"))),
    "san_proxy_common": Layout((("adapter", "I"), ("cache_enabled", "I"), ("length", "Q"), ("id", "I"),
                                ("reserved", "I"), ("logical", "Q"))),
    "san_proxy_free": Layout((("id", "I"), ("kind", "I"), ("base", "Q"), ("length", "Q"), ("cache", "I"),
                              ("reserved", "I"))),
    "san_proxy_run": Layout((("address", "Q"), ("length", "Q"))),
    "san_proxy_query": Layout((("id", "I"), ("capacity", "I"), ("runs", "Q"), ("kind", "I"), ("count", "I"),
                               ("length", "Q"), ("cache_type", "I"), ("kernel_cache", "I"))),
    "san_proxy_ptes": Layout((("address", "Q"), ("pages", "Q"), ("entries", "Q"))),
}


def _ioc(direction: int, number: int, size: int) -> int:
    """Linux's _IOC: direction 1 write (user to kernel), 2 read, 3 both."""
    return (direction << 30) | (size << 16) | (MAGIC << 8) | number


_W, _R, _RW = 1, 2, 3
IOCTLS: dict[str, int] = {
    "SAN_PROXY_INFO": _ioc(_R, 0, LAYOUTS["san_proxy_info"].size),
    "SAN_PROXY_PIN": _ioc(_RW, 1, LAYOUTS["san_proxy_pin"].size),
    "SAN_PROXY_ALLOCATE": _ioc(_RW, 2, LAYOUTS["san_proxy_allocate"].size),
    "SAN_PROXY_ALLOCATE_CONTIGUOUS": _ioc(_RW, 3, LAYOUTS["san_proxy_contiguous"].size),
    "SAN_PROXY_GET_ADAPTER": _ioc(_RW, 4, LAYOUTS["san_proxy_description"].size),
    "SAN_PROXY_ALLOCATE_COMMON": _ioc(_RW, 5, LAYOUTS["san_proxy_common"].size),
    "SAN_PROXY_FREE": _ioc(_W, 6, LAYOUTS["san_proxy_free"].size),
    "SAN_PROXY_QUERY": _ioc(_RW, 7, LAYOUTS["san_proxy_query"].size),
    "SAN_PROXY_PTES": _ioc(_W, 8, LAYOUTS["san_proxy_ptes"].size),
    "SAN_PROXY_NOLOWMEM": _ioc(_W, 9, 4),
}


@dataclass(frozen=True)
class Info:
    abi: int
    device_flags: int
    max_contiguous: int
    nolowmem: bool
    pat: bool
    page_size: int


@dataclass(frozen=True)
class Adapter:
    id: int
    map_registers: int
    dma_mask: int


@dataclass(frozen=True)
class Query:
    kind: int
    length: int
    cache_type: int
    kernel_cache: int
    runs: tuple[tuple[int, int], ...]  # (physical address, bytes), in order


@dataclass(frozen=True)
class Pte:
    present: bool
    cache_type: int
    pfn: int


def _pages(length: int) -> int:
    """``length`` rounded up to whole pages, in bytes."""
    return -(-length // PAGE_SIZE) * PAGE_SIZE


class ProxyDevice:
    """An open file of /dev/san_proxy."""

    def __init__(self, path: str = DEVICE) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot open the proxy module's device {path}: {exc.strerror}", path) from None

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> ProxyDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        if self._fd < 0:
            raise OSError(_errno.EBADF, f"{self.path} is closed")
        return self._fd

    def _ioctl(self, name: str, arguments: str, data: bytearray) -> None:
        """The ioctl ``SAN_PROXY_<name>`` on ``data`` (updated in place)."""
        try:
            fcntl.ioctl(self.fileno(), IOCTLS[f"SAN_PROXY_{name}"], data, True)
        except OSError as exc:
            code = exc.errno or _errno.EIO
            raise OSError(code, f"SAN_PROXY_{name}({arguments}): {os.strerror(code)}") from None

    def _call(self, name: str, arguments: str, layout: str, *values: int) -> tuple[int, ...]:
        packer = LAYOUTS[layout].struct
        data = bytearray(packer.pack(*values))
        self._ioctl(name, arguments, data)
        return packer.unpack(bytes(data))

    def info(self) -> Info:
        abi, flags, largest, nolowmem, pat, page_size, *_ = self._call("INFO", "", "san_proxy_info", *([0] * 10))
        return Info(abi, flags, largest, bool(nolowmem), bool(pat), page_size)

    def pin(self, address: int, length: int) -> tuple[int, int]:
        """Pin [address, address + length) of this process: (id, pages)."""
        out = self._call("PIN", f"address={address:#x}, length={length}", "san_proxy_pin", address, length, 0, 0, 0)
        return out[3], out[4]

    def allocate(self, length: int) -> tuple[int, int]:
        """Whole zeroed pages, not necessarily contiguous: (id, pages)."""
        out = self._call("ALLOCATE", f"length={length}", "san_proxy_allocate", length, 0, 0, 0)
        return out[2], out[3]

    def allocate_contiguous(self, length: int, lowest: int, highest: int, boundary: int,
                            cache_type: int) -> tuple[int, int] | None:
        """A physically contiguous block: (id, physical base), or None when it cannot be had."""
        arguments = (f"length={length}, lowest={lowest:#x}, highest={highest:#x}, boundary={boundary:#x}, "
                     f"cache_type={cache_type}")
        out = self._call("ALLOCATE_CONTIGUOUS", arguments, "san_proxy_contiguous",
                         length, lowest, highest, boundary, cache_type, 0, 0)
        return (out[5], out[6]) if out[5] else None

    def get_adapter(self, *, version: int, master: bool, scatter_gather: bool, dma32: bool, dma64: bool,
                    interface_type: int, maximum_length: int) -> Adapter:
        """IoGetDmaAdapter from a zero-initialised DEVICE_DESCRIPTION with these fields filled."""
        arguments = (f"version={version}, master={int(master)}, scatter_gather={int(scatter_gather)}, "
                     f"dma32={int(dma32)}, dma64={int(dma64)}, interface_type={interface_type}, "
                     f"maximum_length={maximum_length}")
        out = self._call("GET_ADAPTER", arguments, "san_proxy_description", version, int(master),
                         int(scatter_gather), int(dma32), int(dma64), interface_type, maximum_length,
                         0, 0, 0, 0, 0, 0, 0)
        return Adapter(out[11], out[12], out[13])

    def allocate_common(self, adapter: int, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        """AllocateCommonBuffer: (id, logical address), or None when it cannot be had."""
        arguments = f"adapter={adapter}, length={length}, cache_enabled={int(cache_enabled)}"
        out = self._call("ALLOCATE_COMMON", arguments, "san_proxy_common", adapter, int(cache_enabled), length,
                         0, 0, 0)
        return (out[3], out[5]) if out[3] else None

    def free(self, id: int, kind: int, base: int = 0, length: int = 0, cache: int = 0) -> None:
        arguments = f"id={id}, kind={kind}, base={base:#x}, length={length}, cache={cache}"
        self._call("FREE", arguments, "san_proxy_free", id, kind, base, length, cache, 0)

    def query(self, id: int) -> Query:
        """What the object really is: its physical runs and cache types."""
        capacity = 0
        for _ in range(2):  # learn the count, then read the runs (an object's runs do not change)
            runs = (ctypes.c_uint64 * (2 * capacity or 1))()
            out = self._call("QUERY", f"id={id}", "san_proxy_query",
                             id, capacity, ctypes.addressof(runs) if capacity else 0, 0, 0, 0, 0, 0)
            kind, count, length, cache_type, kernel_cache = out[3:]
            if count <= capacity:
                pairs = tuple((int(runs[2 * i]), int(runs[2 * i + 1])) for i in range(count))
                return Query(kind, length, cache_type, kernel_cache, pairs)
            capacity = count
        raise OSError(_errno.EAGAIN, f"SAN_PROXY_QUERY(id={id}): the object's runs changed")

    def ptes(self, address: int, pages: int) -> list[Pte]:
        """This process's page-table entries over ``pages`` pages of a mapping of this file."""
        entries = (ctypes.c_uint64 * max(pages, 1))()
        arguments = f"address={address:#x}, pages={pages}"
        self._call("PTES", arguments, "san_proxy_ptes", address, pages, ctypes.addressof(entries))
        return [Pte(bool(e & PTE_PRESENT), (e >> PTE_CACHE_SHIFT) & 7, e & PTE_PFN_MASK)
                for e in (int(entries[i]) for i in range(pages))]

    def set_nolowmem(self, on: bool) -> None:
        self._ioctl("NOLOWMEM", f"on={int(on)}", bytearray(struct.pack("=I", int(on))))

    def map(self, id: int, length: int) -> int:
        """Map the object (its whole pages) read-write and shared: the mapping's address."""
        size = _pages(length)
        address = libc.mmap(None, size, PROT_RW, MAP_SHARED, self.fileno(), id * PAGE_SIZE)
        if address is None or address == MAP_FAILED:
            code = ctypes.get_errno() or _errno.EIO
            raise OSError(code, f"mmap(id={id}, length={size}): {os.strerror(code)}")
        return int(address)

    def unmap(self, address: int, length: int) -> None:
        size = _pages(length)
        if libc.munmap(address, size) != 0:
            code = ctypes.get_errno() or _errno.EIO
            raise OSError(code, f"munmap(address={address:#x}, length={size}): {os.strerror(code)}")


def live_counts(path: str = LIVE) -> dict[str, int]:
    """What every open file of the device holds now (all 0 once every file is closed)."""
    counts: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            name, _, value = line.partition(" ")
            if name:
                counts[name] = int(value)
    return counts


__all__ = [
    "ABI", "CACHED", "CACHE_OTHER", "DEVICE", "IOCTLS", "KIND_ADAPTER", "KIND_ALLOCATION", "KIND_COMMON",
    "KIND_CONTIGUOUS", "KIND_PIN", "LAYOUTS", "LIVE", "NON_CACHED", "PAGE_SIZE", "WRITE_COMBINED", "Adapter",
    "Info", "Layout", "ProxyDevice", "Pte", "Query", "live_counts",
]
