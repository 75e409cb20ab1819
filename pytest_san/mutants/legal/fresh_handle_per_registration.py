"""A new handle for every register_memory call, even of a buffer already registered on the socket.

R13 says a provider *may* return the same handle for the same buffer (and then must count references); one that
hands out a new handle each time, each released by its own deregistration, conforms too. Each handle here holds
one reference of the wrapped provider's registration and is in use only while an operation that names *it* is
pending: deregistering another handle of the same range then succeeds, and its reference is dropped as soon as
the wrapped provider lets go of it (it counts the pending use against the range).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook

_handles = itertools.count(1 << 40)  # far from any handle the wrapped providers hand out


@dataclasses.dataclass(frozen=True)
class Reported:
    """A registration as this provider reports it: the wrapped one's, less the references it still holds for
    handles already deregistered."""

    kind: str
    address: int
    length: int
    access: Any
    refs: int


class Tracked:
    """A pending operation that names some of our handles: they are in use until it completes."""

    def __init__(self, inner: Any, owner: FreshHandlePerRegistration, keys: list[tuple[int, int]]) -> None:
        self.inner = inner
        self.owner = owner
        self.keys = keys
        for key in keys:
            owner.users[key] = owner.users.get(key, 0) + 1

    def _finished(self) -> None:
        for key in self.keys:
            self.owner.users[key] -= 1
        self.keys = []
        self.owner.settle()

    def done(self) -> bool:
        finished = bool(self.inner.done())
        if finished and self.keys:
            self._finished()
        return finished

    def wait(self, timeout: float | None = 10.0) -> Any:
        done = self.inner.wait(timeout)
        if self.keys:
            self._finished()
        return done


class FreshHandlePerRegistration(DelegatingProvider):
    def __init__(self, inner: Any, node: Any, shared: Any) -> None:
        super().__init__(inner, node, shared)
        self.handles: dict[tuple[int, int], tuple[Any, Any, Any]] = {}  # (socket, ours) -> (inner, buffer, access)
        self.users: dict[tuple[int, int], int] = {}  # (socket, ours) -> pending operations naming it
        self.dropped: list[tuple[Any, Any, Any, Any]] = []  # (socket, inner, buffer, access) still to release

    def _inner(self, socket: Any, handle: Any) -> Any:
        found = self.handles.get((id(socket), handle)) if type(handle) is int else None
        return handle if found is None else found[0]

    def _local(self, socket: Any, buffers: Any) -> tuple[Any, list[tuple[int, int]]]:
        if not isinstance(buffers, list | tuple):
            return buffers, []
        out, keys = [], []
        for pair in buffers:
            if isinstance(pair, tuple | list) and len(pair) == 2:
                if type(pair[1]) is int and (id(socket), pair[1]) in self.handles:
                    keys.append((id(socket), pair[1]))
                pair = (pair[0], self._inner(socket, pair[1]))
            out.append(pair)
        return out, keys

    def _post(self, call: Any, socket: Any, buffers: Any, *rest: Any) -> Any:
        local, keys = self._local(socket, buffers)
        return Tracked(call(socket, local, *rest), self, keys) if keys else call(socket, local, *rest)

    def settle(self) -> None:
        """Release the references of deregistered handles that the wrapped provider no longer holds busy."""
        for item in list(self.dropped):
            socket, inner = item[0], item[1]
            try:
                self.inner.deregister_memory(socket, inner)
            except SanError:
                if socket.closed:  # closing released it
                    self.dropped.remove(item)
                continue
            self.dropped.remove(item)

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        inner = self.inner.register_memory(socket, buffer, access)
        fresh = next(_handles)
        self.handles[id(socket), fresh] = (inner, buffer, access)
        return fresh

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        key = (id(socket), handle)
        if type(handle) is not int or key not in self.handles:
            self.inner.deregister_memory(socket, handle)  # not ours: the wrapped provider says what it is
            return
        if self.users.get(key):
            raise SanError(WsaError.WSAEINVAL, f"handle {handle:#x} is in use by a pending operation")
        inner, buffer, access = self.handles[key]
        try:
            self.inner.deregister_memory(socket, inner)
        except SanError as exc:
            if exc.code is not WsaError.WSAEINVAL:
                raise
            self.dropped.append((socket, inner, buffer, access))  # busy for another handle of the range
        del self.handles[key]

    def registrations(self, socket: Any) -> Any:
        self.settle()
        held: dict[tuple[str, int, int, int], int] = {}
        for sock, _, buffer, access in self.dropped:
            if sock is socket:
                range_ = ("memory", buffer.address, buffer.length, int(access))
                held[range_] = held.get(range_, 0) + 1
        out = []
        for reg in self.inner.registrations(socket):
            refs = reg.refs - held.get((reg.kind, reg.address, reg.length, int(reg.access)), 0)
            out.append(Reported(reg.kind, reg.address, reg.length, reg.access, refs))
        return [reg for reg in out if reg.refs > 0]

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return self._post(self.inner.rdma_write, socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return self._post(self.inner.rdma_read, socket, local_buffers, source_descriptor, offset)

    def send(self, socket: Any, buffers: Any) -> Any:
        return self._post(self.inner.send, socket, buffers)

    def recv(self, socket: Any, buffers: Any) -> Any:
        return self._post(self.inner.recv, socket, buffers)

    def close_socket(self, socket: Any) -> None:
        self.inner.close_socket(socket)
        for key in [k for k in self.handles if k[0] == id(socket)]:
            del self.handles[key]
        self.dropped = [item for item in self.dropped if item[0] is not socket]


pytest_san_make_provider = provider_hook(FreshHandlePerRegistration)
