"""Emulated SAN sockets, their registrations and their overlapped operations."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..contract import Access, Completion, Status

if TYPE_CHECKING:
    from .process import EmulatedProcess
    from .provider import EmulatedProvider
    from .proxy import EmulatedAllocation


class SocketState(enum.Enum):
    CONNECTED = "connected"
    ERROR = "error"  # the QP went to error (access violation, length error): flushed, unusable
    DISCONNECTED = "disconnected"  # the peer closed, died, or the link dropped
    CLOSED = "closed"  # closed by its owner: no longer a socket


class EmulatedRegistration:
    """One registration: a handle (register_memory) or a memory window (register_rdma_memory)."""

    __slots__ = ("address", "allocation", "flags", "handle", "in_use", "key", "kind", "length", "mem", "offset",
                 "refs")

    def __init__(self, kind: str, handle: int, address: int, length: int, access: Access,
                 mem: bytearray, offset: int, allocation: EmulatedAllocation) -> None:
        self.kind = kind
        self.handle = handle  # the handle, or the window's rkey
        self.address = address
        self.length = length
        self.flags = int(access)  # a plain int: IntFlag arithmetic is slow on the RDMA hot path
        self.key = (kind, address, length, self.flags)  # its entry in the socket's by_range table
        self.mem = mem
        self.offset = offset
        self.allocation = allocation
        self.refs = 1
        self.in_use = 0  # pending operations using it

    @property
    def access(self) -> Access:
        return Access(self.flags)

    def __repr__(self) -> str:
        return (f"{self.kind} {self.handle:#x} {self.address:#x}+{self.length} {self.access.name} "
                f"refs={self.refs}")


class Successes(dict[int, Completion]):
    """Completion(SUCCESS, n) by n, each made at its first use: making one costs more than the rest of an RDMA
    transfer's completion, and one (frozen) serves every operation of its size. A socket keeps its own, so
    none outlives the socket."""

    def __missing__(self, nbytes: int) -> Completion:
        completion = self[nbytes] = Completion(Status.SUCCESS, nbytes)
        return completion


_TIMEOUTS = (float, int, type(None))  # a number of seconds, or None: for ever


class EmulatedOperation:
    """A pending operation; completes once, possibly later (a receive waiting for a send).

    ``regs``, ``segments`` and ``nbytes`` are what the provider gathered at the post (the registrations the
    operation holds in use, their (mem, offset, length) segments, the bytes they add up to); ``run`` is what a
    held operation does when released. ``nbytes`` and ``run`` exist once the provider set them.

    An operation completes inside a call of the provider (its post, the peer's matching post, a close, a
    release of held operations, a dropped link), and the emulator's callers serialise (memory, sockets and
    operations are not thread-safe): while a thread waits, nothing can complete what it waits for. So ``wait``
    never blocks: it gives the completion, or raises TimeoutError at once for an operation still pending.
    """

    __slots__ = ("_completion", "kind", "nbytes", "regs", "run", "segments", "socket")

    nbytes: int
    run: Callable[[EmulatedOperation], None]

    def __init__(self, socket: EmulatedSocket, kind: str) -> None:
        self.socket = socket
        self.kind = kind
        self._completion: Completion | None = None
        self.regs: list[EmulatedRegistration] = []
        self.segments: list[tuple[bytearray, int, int]] = []

    def complete(self, status: Status, nbytes: int = 0) -> None:
        if self._completion is None:
            self._finish(Completion(status, nbytes))

    def succeed(self, nbytes: int) -> None:
        """``complete(Status.SUCCESS, nbytes)`` for the RDMA hot path: the socket's one completion of the size."""
        if self._completion is None:
            self._finish(self.socket.successes[nbytes])

    def _finish(self, completion: Completion) -> None:
        self._completion = completion
        for reg in self.regs:  # completes once: no registration is released twice
            reg.in_use -= 1

    @property
    def completion(self) -> Completion | None:
        return self._completion

    def done(self) -> bool:
        return self._completion is not None

    def wait(self, timeout: float | None = 10.0) -> Completion:
        completion = self._completion
        if completion is None:
            if type(timeout) not in _TIMEOUTS:
                raise TypeError(f"timeout is a number of seconds or None, got {timeout!r:.80}")
            if timeout != timeout:
                raise ValueError("timeout is NaN")
            raise TimeoutError(f"{self.kind} on {self.socket} is pending, and nothing completes it while this "
                               "thread waits")
        return completion

    def __repr__(self) -> str:
        return f"<{self.kind} {self._completion or 'pending'}>"


class EmulatedSocket:
    """A SAN socket: the emulated counterpart of an RC QP plus the provider's tables for it. Its ``peer`` is set
    when the fabric connects it, right after it is made (every emulated socket is made connected)."""

    peer: EmulatedSocket | None

    def __init__(self, provider: EmulatedProvider, process: EmulatedProcess, sid: int) -> None:
        self.provider = provider
        self._process = process
        self.sid = sid
        self.successes = Successes()
        self.state = SocketState.CONNECTED
        self.handles: dict[int, EmulatedRegistration] = {}  # register_memory handles
        self.windows: dict[int, EmulatedRegistration] = {}  # rkey -> window (register_rdma_memory)
        self.by_range: dict[tuple[str, int, int, int], EmulatedRegistration] = {}  # for reference counting
        self.recv_queue: deque[EmulatedOperation] = deque()  # posted receives
        self.inbound: deque[EmulatedOperation] = deque()  # peer sends waiting for a receive
        self.held: list[EmulatedOperation] | None = None  # fault injection: operations kept pending

    @property
    def process(self) -> EmulatedProcess:
        return self._process

    @property
    def connected(self) -> bool:
        return self.state is SocketState.CONNECTED

    @property
    def closed(self) -> bool:
        return self.state is SocketState.CLOSED

    def pending(self) -> list[EmulatedOperation]:
        """Operations of this socket not yet complete."""
        ops = list(self.recv_queue)
        if self.peer is not None:
            ops += [op for op in self.peer.inbound if op.socket is self]
        ops += self.held or []
        return [op for op in ops if not op.done()]  # a close completes what it ends, and leaves the lists

    def __repr__(self) -> str:
        return f"<socket {self.sid} pid={self._process.pid} on {self.provider.node_name} {self.state.value}>"
