"""The libc calls the verbs engine makes through ctypes (mmap and friends), declared once.

Standard library only; Python 3.9 compatible. Used by the child (buffers with guard pages) and by
the host side (the proxy's pinned and hugetlb memory).
"""

from __future__ import annotations

import ctypes
import mmap as _mmap

PROT_NONE = 0
PROT_RW = getattr(_mmap, "PROT_READ", 1) | getattr(_mmap, "PROT_WRITE", 2)
MAP_PRIVATE = getattr(_mmap, "MAP_PRIVATE", 2)
MAP_ANONYMOUS = getattr(_mmap, "MAP_ANONYMOUS", 0x20)
MAP_HUGETLB = getattr(_mmap, "MAP_HUGETLB", 0x40000)
MAP_FAILED = ctypes.c_void_p(-1).value

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for _call in (libc.munmap, libc.mlock, libc.munlock):
    _call.restype = ctypes.c_int
    _call.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.restype = ctypes.c_int
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def map_anonymous(size: int, flags: int = 0) -> int | None:
    """A private anonymous read-write mapping of ``size`` bytes, or None (errno says why)."""
    address = libc.mmap(None, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0)
    if address is None or address == MAP_FAILED:
        return None
    return int(address)


__all__ = ["MAP_HUGETLB", "PROT_NONE", "libc", "map_anonymous"]
