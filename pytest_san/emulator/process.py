"""Emulated processes: each has its own virtual address space holding real bytes."""

from __future__ import annotations

import bisect
import itertools
from typing import TYPE_CHECKING

from ..errors import SanError, WsaError
from ..types import PAGE_SIZE

if TYPE_CHECKING:
    from .node import EmulatedNode
    from .sockets import EmulatedSocket

_pids = itertools.count(1000)

# User-space mappings start here; a guard page separates neighbours so that no
# buffer range can run from one allocation into the next.
_USER_BASE = 0x7F00_0000_0000


class EmulatedBuffer:
    """A range of one process's virtual memory."""

    __slots__ = ("_process", "address", "length", "mem", "offset")

    def __init__(self, process: EmulatedProcess, address: int, length: int,
                 mem: bytearray | None, offset: int) -> None:
        self._process = process
        self.address = address
        self.length = length
        self.mem = mem  # the mapping's bytes, or None when the range is not wholly mapped
        self.offset = offset  # where ``address`` falls inside ``mem``

    @property
    def process(self) -> EmulatedProcess:
        return self._process

    def _bytes(self) -> bytearray:
        if self.mem is None or not self._process.alive:
            raise SanError(WsaError.WSAEFAULT,
                           f"{self.length} bytes at {self.address:#x} are not mapped in pid {self._process.pid}")
        return self.mem

    def read(self, n: int | None = None, offset: int = 0) -> bytes:
        n = self.length - offset if n is None else n
        if offset < 0 or n < 0 or offset + n > self.length:
            raise ValueError(f"read of {n} bytes at offset {offset} is outside a {self.length}-byte buffer")
        start = self.offset + offset
        return bytes(self._bytes()[start:start + n])

    def write(self, data: bytes, offset: int = 0) -> None:
        if offset < 0 or offset + len(data) > self.length:
            raise ValueError(f"write of {len(data)} bytes at offset {offset} "
                             f"is outside a {self.length}-byte buffer")
        start = self.offset + offset
        self._bytes()[start:start + len(data)] = data

    def view(self, offset: int, length: int) -> EmulatedBuffer:
        if offset < 0 or length < 0 or offset + length > self.length:
            raise ValueError(f"view [{offset}, {offset + length}) is outside a {self.length}-byte buffer")
        return EmulatedBuffer(self._process, self.address + offset, length, self.mem, self.offset + offset)

    def __repr__(self) -> str:
        return f"<buffer pid={self._process.pid} {self.address:#x}+{self.length}>"


class EmulatedProcess:
    """A process on an emulated node."""

    def __init__(self, node: EmulatedNode) -> None:
        self._node = node
        self.pid = next(_pids)
        self.alive = True
        self._bases: list[int] = []  # sorted mapping starts
        self._maps: dict[int, bytearray] = {}
        self._next = _USER_BASE
        self.sockets: list[EmulatedSocket] = []

    @property
    def node(self) -> EmulatedNode:
        return self._node

    def alloc(self, nbytes: int) -> EmulatedBuffer:
        if nbytes <= 0:
            raise ValueError(f"alloc needs a positive size, got {nbytes}")
        if not self.alive:
            raise SanError(WsaError.WSAEFAULT, f"pid {self.pid} is gone")
        address = self._next
        mem = bytearray(nbytes)
        self._maps[address] = mem
        self._bases.append(address)  # addresses only grow, so the list stays sorted
        pages = -(-nbytes // PAGE_SIZE) + 1
        self._next += pages * PAGE_SIZE
        return EmulatedBuffer(self, address, nbytes, mem, 0)

    def buffer_at(self, address: int, length: int) -> EmulatedBuffer:
        mem, offset = self.resolve(address, length)
        return EmulatedBuffer(self, address, length, mem, offset)

    def read(self, address: int, n: int) -> bytes:
        return self.buffer_at(address, n).read()

    def write(self, address: int, data: bytes) -> None:
        self.buffer_at(address, len(data)).write(data)

    def resolve(self, address: int, length: int) -> tuple[bytearray | None, int]:
        """The mapping wholly holding [address, address+length), or (None, 0)."""
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0 or length <= 0:
            return None, 0
        base = self._bases[i]
        mem = self._maps[base]
        offset = address - base
        if offset + length > len(mem):
            return None, 0
        return mem, offset

    def kill(self) -> None:
        """End the process: the OS closes its sockets, which releases their registrations."""
        if not self.alive:
            return
        for sock in list(self.sockets):
            if not sock.closed:
                sock.provider.close_socket(sock)
        self.alive = False
        self._maps.clear()
        self._bases.clear()

    def __repr__(self) -> str:
        return f"<process {self.pid} on {self._node.name}{'' if self.alive else ' (dead)'}>"
