"""A process's buffers: anonymous mmap'd memory at real virtual addresses, each followed by a guard page.

``alloc``/``free``/``read``/``write`` of ``VerbsProcess``, the lookup of the buffer holding a range,
and the one page that stands in for an empty scatter list (registered in each socket's PD). Standard library + pyverbs,
Python 3.9 compatible.
"""

from __future__ import annotations

import bisect
import ctypes
import os
from typing import Any

from pyverbs.mr import MR  # type: ignore[import-not-found]
from pyverbs.wr import SGE  # type: ignore[import-not-found]

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.libc import PROT_NONE, libc, map_anonymous
from hil.agent.engines.verbs.state import Mapping, ProcessState, Socket
from pytest_san.contract import (
    PAGE_SIZE,
    SanError,
    WsaError,
    is_int,
)


class MemoryMixin(ProcessState):
    """Buffers: PROT_NONE guard pages keep any range from running from one buffer into the next."""

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

    def free(self, address: int) -> None:
        mapping = self._maps.get(address) if is_int(address) else None
        if mapping is None:
            raise SanError(WsaError.WSAEINVAL, f"no buffer starts at {address:#x} in pid {self.pid}")
        end = address + mapping.length
        for sock in self._sockets.values():
            for reg in list(sock.handles.values()) + list(sock.windows.values()):
                if reg.address < end and address < reg.address + reg.length:
                    raise SanError(WsaError.WSAEINVAL, f"buffer {address:#x} is still registered ({reg!r})")
        del self._maps[address]
        self._bases.remove(address)
        libc.munmap(address, mapping.size)

    def _mapping_of(self, address: int, length: int) -> Mapping | None:
        """The buffer wholly holding [address, address+length), or None."""
        if not is_int(address) or not is_int(length) or length <= 0 or address < 0:
            return None
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        mapping = self._maps[self._bases[i]]
        if address + length > mapping.address + mapping.length:
            return None
        return mapping

    def read(self, address: int, length: int) -> bytes:
        if length == 0 and is_int(length):
            return b""
        if self._mapping_of(address, length) is None:
            raise SanError(WsaError.WSAEFAULT,
                           f"{length} bytes at {address:#x} are not inside a buffer of pid {self.pid}")
        return ctypes.string_at(address, length)

    def write(self, address: int, data: bytes) -> None:
        data = bytes(data)
        if not data:
            return
        if self._mapping_of(address, len(data)) is None:
            raise SanError(WsaError.WSAEFAULT, f"{len(data)} bytes at {address:#x} are not inside "
                           f"a buffer of pid {self.pid}")
        ctypes.memmove(address, data, len(data))

    def _null_sge(self, sock: Socket) -> Any:
        """A zero-length SGE on the null page, registered in the socket's PD (its QP takes no other)."""
        if not self._null_buf:
            self._null_buf = self.alloc(PAGE_SIZE)["address"]
        if sock.null_mr is None:
            sock.null_mr = MR(sock.pd, PAGE_SIZE, e.IBV_ACCESS_LOCAL_WRITE, address=self._null_buf)
        return SGE(self._null_buf, 0, sock.null_mr.lkey)
