"""Emulated SAN sockets, their registrations and their overlapped operations."""

from __future__ import annotations

import enum
import threading
from collections import deque
from typing import TYPE_CHECKING

from ..types import Access, Completion, Status

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


_SUCCESS = Status.SUCCESS
_SUCCESSES: dict[int, Completion] = {}  # Completion(SUCCESS, n) by n: frozen, so one can serve every operation


def _succeeded(nbytes: int) -> Completion:
    """Completion(SUCCESS, nbytes), made once per size (making one costs more than the rest of a completion)."""
    completion = _SUCCESSES.get(nbytes)
    if completion is None:
        if len(_SUCCESSES) >= 1024:  # many different sizes: start over rather than grow
            _SUCCESSES.clear()
        completion = _SUCCESSES[nbytes] = Completion(_SUCCESS, nbytes)
    return completion


class EmulatedOperation:
    """A pending operation; completes once, possibly later (a receive waiting for a send)."""

    __slots__ = ("_completion", "_waitable", "kind", "nbytes", "regs", "run", "segments", "socket")

    def __init__(self, socket: EmulatedSocket, kind: str) -> None:
        self.socket = socket
        self.kind = kind
        self._completion: Completion | None = None
        self._waitable = socket.waitable
        self.regs: list[EmulatedRegistration] = []
        self.segments: list[tuple[bytearray, int, int]] = []  # (mem, offset, length), gathered at post
        self.nbytes = 0
        self.run: object = None  # what a held operation does when released

    def complete(self, status: Status, nbytes: int = 0) -> None:
        if self._completion is None:
            self._finish(_succeeded(nbytes) if status is _SUCCESS else Completion(status, nbytes))

    def succeed(self, nbytes: int) -> None:
        """``complete(Status.SUCCESS, nbytes)`` for the RDMA hot path: no status to look up and compare."""
        if self._completion is None:
            self._finish(_SUCCESSES.get(nbytes) or _succeeded(nbytes))

    def _finish(self, completion: Completion) -> None:
        self._completion = completion
        if self.regs:
            for reg in self.regs:
                reg.in_use -= 1
            self.regs = []
        if self._waitable._waiters:
            self._waitable.notify()

    @property
    def completion(self) -> Completion | None:
        return self._completion

    def done(self) -> bool:
        return self._completion is not None

    def wait(self, timeout: float | None = 10.0) -> Completion:
        if self._completion is None:
            timeout = _checked_timeout(timeout)
            self._waitable.wait_for(self.done, timeout)
        if self._completion is None:
            raise TimeoutError(f"{self.kind} on {self.socket} still pending after {timeout} s")
        return self._completion

    def __repr__(self) -> str:
        return f"<{self.kind} {self._completion or 'pending'}>"


def _checked_timeout(timeout: object) -> float | None:
    """None (wait for ever) or a number of seconds; more than threading can wait is for ever."""
    if timeout is None:
        return None
    if type(timeout) is not float and type(timeout) is not int:
        raise TypeError(f"timeout is a number of seconds or None, got {timeout!r:.80}")
    if timeout != timeout:
        raise ValueError("timeout is NaN")
    return None if timeout > threading.TIMEOUT_MAX else timeout


class Waitable:
    """Lets a thread wait for completions that another thread produces; free when nobody waits."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiters = 0

    def notify(self) -> None:
        if self._waiters:
            with self._cond:
                self._cond.notify_all()

    def wait_for(self, predicate: object, timeout: float | None) -> None:
        assert callable(predicate)
        with self._cond:
            self._waiters += 1
            try:
                self._cond.wait_for(predicate, timeout)
            finally:
                self._waiters -= 1


class EmulatedSocket:
    """A SAN socket: the emulated counterpart of an RC QP plus the provider's tables for it."""

    def __init__(self, provider: EmulatedProvider, process: EmulatedProcess, sid: int,
                 waitable: Waitable) -> None:
        self.provider = provider
        self._process = process
        self.sid = sid
        self.waitable = waitable
        self.state = SocketState.CONNECTED
        self.peer: EmulatedSocket | None = None
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
        return ops

    def __repr__(self) -> str:
        return f"<socket {self.sid} pid={self._process.pid} on {self.provider.node_name} {self.state.value}>"
