"""Emulated processes: each has its own virtual address space holding real bytes."""

from __future__ import annotations

import bisect
import itertools
from typing import TYPE_CHECKING

from ..contract import PAGE_SIZE, SanError, WsaError

if TYPE_CHECKING:
    from .node import EmulatedNode
    from .sockets import EmulatedSocket

_pids = itertools.count(1000)

# User-space mappings start here; a guard page separates neighbours so that no
# buffer range can run from one allocation into the next. A mapping is whole pages, as on a real host
# (mmap): the bytes between the end of an allocation and the end of its last page are in the process's
# address space too (CONTRACT.md section 4).
_USER_BASE = 0x7F00_0000_0000
MAX_ALLOC = 1 << 30
"""The largest single ``alloc`` (the bytes are real): more is refused with WSAENOBUFS, not a MemoryError."""


def _int(value: object, what: str) -> int:
    """``value`` if it is an integer (not a bool, not a float); a TypeError naming ``what`` otherwise."""
    if type(value) is int:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{what} must be an integer, got {value!r:.80}")


def _hex(value: object) -> str:
    return f"{value:#x}" if type(value) is int else f"{value!r:.20}"


class EmulatedBuffer:
    """A range of one process's virtual memory."""

    __slots__ = ("_process", "address", "length", "mem", "offset")

    def __init__(self, process: EmulatedProcess, address: int, length: int,
                 mem: bytearray | None, offset: int) -> None:
        if not isinstance(process, EmulatedProcess):
            raise TypeError(f"an EmulatedBuffer belongs to an EmulatedProcess, got {process!r:.80}")
        address, length, offset = _int(address, "address"), _int(length, "length"), _int(offset, "offset")
        if mem is not None and (type(mem) is not bytearray or offset < 0 or length < 0
                                or offset + length > len(mem) or process._maps.get(address - offset) is not mem):
            raise ValueError(f"[{offset}, {offset + length}) of the bytes given is not memory of pid {process.pid} "
                             f"at {address:#x}")
        self._process = process
        self.address = address
        self.length = length  # may be negative or reach outside the mapping: providers refuse such buffers
        self.mem = mem  # the mapping's bytes, or None when the range is not wholly mapped
        self.offset = offset  # where ``address`` falls inside ``mem``

    @property
    def process(self) -> EmulatedProcess:
        return self._process

    def _bytes(self) -> bytearray:
        mem, start, length = self.mem, self.offset, self.length
        # The attributes are plain slots: check them again, so that a buffer changed after it was
        # made can never reach outside its mapping (or resize it).
        if (mem is None or not self._process.alive or type(start) is not int or type(length) is not int
                or start < 0 or length < 0 or start + length > len(mem)):
            raise SanError(WsaError.WSAEFAULT, f"{self.length!r} bytes at {_hex(self.address)} are not mapped "
                                               f"in pid {self._process.pid}")
        return mem

    def read(self, n: int | None = None, offset: int = 0) -> bytes:
        offset = _int(offset, "offset")
        n = self.length - offset if n is None else _int(n, "n")
        if offset < 0 or n < 0 or offset + n > self.length:
            raise ValueError(f"read of {n} bytes at offset {offset} is outside a {self.length}-byte buffer")
        mem = self._bytes()
        start = self.offset + offset
        return bytes(mem[start:start + n])

    def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write takes bytes, got {data!r:.80}")
        offset = _int(offset, "offset")
        data = bytes(data) if type(data) is memoryview else data  # its len() counts bytes then
        if offset < 0 or offset + len(data) > self.length:
            raise ValueError(f"write of {len(data)} bytes at offset {offset} "
                             f"is outside a {self.length}-byte buffer")
        mem = self._bytes()
        start = self.offset + offset
        mem[start:start + len(data)] = data

    def view(self, offset: int, length: int) -> EmulatedBuffer:
        offset, length = _int(offset, "offset"), _int(length, "length")
        if offset < 0 or length < 0 or offset + length > self.length:
            raise ValueError(f"view [{offset}, {offset + length}) is outside a {self.length}-byte buffer")
        mem = self.mem
        if mem is not None and (not self._process.alive or type(self.offset) is not int or type(self.address) is not int
                                or self.offset < 0 or self.offset + offset + length > len(mem)
                                or self._process._maps.get(self.address - self.offset) is not mem):
            mem = None  # the process is gone, or this buffer's own fields were changed: a view of nothing mapped
        return EmulatedBuffer(self._process, self.address + offset, length, mem, self.offset + offset)

    def __repr__(self) -> str:
        return f"<buffer pid={self._process.pid} {_hex(self.address)}+{self.length!r:.20}>"


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
        nbytes = _int(nbytes, "nbytes")
        if nbytes <= 0:
            raise ValueError(f"alloc needs a positive size, got {nbytes}")
        if not self.alive:
            raise SanError(WsaError.WSAEFAULT, f"pid {self.pid} is gone")
        if nbytes > MAX_ALLOC:
            raise SanError(WsaError.WSAENOBUFS, f"pid {self.pid}: cannot map {nbytes} bytes "
                                                f"(an emulated process maps at most {MAX_ALLOC} at once)")
        address = self._next
        pages = -(-nbytes // PAGE_SIZE)
        mem = bytearray(pages * PAGE_SIZE)
        self._maps[address] = mem
        self._bases.append(address)  # addresses only grow, so the list stays sorted
        self._next += (pages + 1) * PAGE_SIZE
        return EmulatedBuffer(self, address, nbytes, mem, 0)

    def buffer_at(self, address: int, length: int) -> EmulatedBuffer:
        """A buffer naming any range, mapped or not, even of a negative length (providers refuse those)."""
        address, length = _int(address, "address"), _int(length, "length")
        mem, offset = self.resolve(address, length)
        return EmulatedBuffer(self, address, length, mem, offset)

    def read(self, address: int, n: int) -> bytes:
        return self.buffer_at(address, n).read()

    def write(self, address: int, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write takes bytes, got {data!r:.80}")
        self.buffer_at(address, memoryview(data).nbytes).write(data)

    def resolve(self, address: int, length: int) -> tuple[bytearray | None, int]:
        """The mapping wholly holding [address, address+length), or (None, 0) (also for non-integers)."""
        if type(address) is not int or type(length) is not int or length <= 0:
            return None, 0
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
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
