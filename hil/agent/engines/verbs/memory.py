"""A process's memory: its buffers (anonymous mmap'd memory at real virtual addresses, each followed by a
guard page) and the null page that stands in for an empty scatter list.

Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

import bisect
import ctypes
import os
from collections.abc import Iterable
from typing import Any

from pyverbs.mr import MR
from pyverbs.wr import SGE

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.libc import PROT_NONE, libc, map_anonymous
from hil.agent.engines.verbs.records import Mapping, Registration, Socket
from hil.agent.engines.verbs.releases import Releases
from pytest_san.spi.contract import (
    PAGE_SIZE,
    SanError,
    WsaError,
    is_int,
)


class Buffers:
    """Owns the process's buffers: PROT_NONE guard pages keep any range from running from one into the next."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._bases: list[int] = []  # sorted buffer addresses
        self._maps: dict[int, Mapping] = {}

    def alloc(self, nbytes: int) -> dict[str, int]:
        if not is_int(nbytes) or nbytes <= 0:
            raise ValueError(f"alloc needs a positive size, got {nbytes!r}")
        usable = -(-nbytes // PAGE_SIZE) * PAGE_SIZE
        size = usable + PAGE_SIZE  # + a guard page
        address = map_anonymous(size)
        if address is None:
            raise SanError(WsaError.WSAENOBUFS, f"mmap of {size} bytes failed: {os.strerror(ctypes.get_errno())}")
        if libc.mprotect(address + usable, PAGE_SIZE, PROT_NONE) != 0:
            libc.munmap(address, size)
            raise SanError(WsaError.WSAENOBUFS, f"mprotect of the guard page failed: {os.strerror(ctypes.get_errno())}")
        self._maps[address] = Mapping(address, nbytes, size)
        bisect.insort(self._bases, address)
        return {"address": address, "length": nbytes}

    def free(self, address: int, registrations: Iterable[Registration]) -> None:
        """Unmap the buffer at ``address``, unless one of ``registrations`` (the process's) overlaps it."""
        mapping = self._maps.get(address) if is_int(address) else None
        if mapping is None:
            raise SanError(WsaError.WSAEINVAL, f"no buffer starts at {address:#x} in pid {self.pid}")
        end = address + mapping.size - PAGE_SIZE
        for reg in registrations:
            if reg.address < end and address < reg.address + reg.length:
                raise SanError(WsaError.WSAEINVAL, f"buffer {address:#x} is still registered ({reg!r})")
        del self._maps[address]
        self._bases.remove(address)
        libc.munmap(address, mapping.size)

    def mapping_of(self, address: int, length: int) -> Mapping | None:
        """The buffer whose pages wholly hold [address, address+length), or None. Pages, not the length asked
        for: the bytes after a buffer's end in its last page are mapped (CONTRACT.md section 4)."""
        if not is_int(address) or not is_int(length) or length <= 0 or address < 0:
            return None
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        mapping = self._maps[self._bases[i]]
        if address + length > mapping.address + mapping.size - PAGE_SIZE:  # up to the guard page
            return None
        return mapping

    def holding(self, address: int, length: int) -> tuple[Mapping | None, int]:
        """(the buffer wholly holding the range or None, the range's offset in it)."""
        mapping = self.mapping_of(address, length)
        return mapping, address - mapping.address if mapping is not None else 0

    def read(self, address: int, length: int) -> bytes:
        if length == 0 and is_int(length):
            return b""
        if self.mapping_of(address, length) is None:
            raise SanError(WsaError.WSAEFAULT,
                           f"{length} bytes at {address:#x} are not inside a buffer of pid {self.pid}")
        return ctypes.string_at(address, length)

    def write(self, address: int, data: bytes) -> None:
        data = bytes(data)
        if not data:
            return
        if self.mapping_of(address, len(data)) is None:
            raise SanError(WsaError.WSAEFAULT, f"{len(data)} bytes at {address:#x} are not inside "
                           f"a buffer of pid {self.pid}")
        ctypes.memmove(address, data, len(data))

    def close(self) -> None:
        """Unmap every buffer (the process shuts down)."""
        for address in list(self._maps):
            libc.munmap(address, self._maps.pop(address).size)
        self._bases = []


class NullPage:
    """Owns the engine's own MRs: one page of the process, registered in each socket's PD, for the zero-length
    SGE of an empty scatter list and of an iWARP fence read (a socket's QP takes no other PD's lkey)."""

    def __init__(self, buffers: Buffers) -> None:
        self._buffers = buffers
        self._address = 0
        self.mrs: dict[int, Any] = {}  # socket id -> the page's MR in that socket's PD

    def sge(self, sock: Socket) -> Any:
        """A zero-length SGE on the page, registered in the socket's PD."""
        if not self._address:
            self._address = self._buffers.alloc(PAGE_SIZE)["address"]
        mr = self.mrs.get(sock.id)
        if mr is None:
            mr = self.mrs[sock.id] = MR(sock.pd, PAGE_SIZE, e.IBV_ACCESS_LOCAL_WRITE, address=self._address)
        return SGE(self._address, 0, mr.lkey)

    def is_lkey(self, handle: int) -> bool:
        """``handle`` is the lkey of one of the page's MRs (no socket's handle)."""
        return any(handle == mr.lkey for mr in self.mrs.values())

    def release(self, sock: Socket, releases: Releases) -> None:
        """The socket's MR of the page goes (before its PD)."""
        mr = self.mrs.pop(sock.id, None)
        if mr is not None:
            releases.close(mr)
