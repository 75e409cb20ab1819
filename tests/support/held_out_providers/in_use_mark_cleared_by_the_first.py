"""A handle's in-use mark is a flag, not a count: the first of two pending operations that use it to complete
clears it, and the handle can then be deregistered under the other.

Breaks R13: deregistering a handle a pending operation uses is WSAEINVAL until the last such operation
completes. Realistic: ``reg->busy = true`` on post and ``= false`` on completion.
"""

from __future__ import annotations

from typing import Any

from pytest_san import Completion, SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, entries, provider_hook

BREAKS = ("R13",)


class Watched:
    """An operation that clears its handles' marks when it is seen complete."""

    def __init__(self, inner: Any, marks: set[tuple[int, Any]], keys: set[tuple[int, Any]]) -> None:
        self.inner = inner
        self.marks = marks
        self.keys = keys

    def _cleared(self) -> None:
        self.marks.difference_update(self.keys)
        self.keys = set()

    def done(self) -> bool:
        done = bool(self.inner.done())
        if done:
            self._cleared()
        return done

    def wait(self, timeout: float | None = 10.0) -> Completion:
        completion: Completion = self.inner.wait(timeout)
        self._cleared()
        return completion


class InUseMarkClearedByTheFirst(DelegatingProvider):
    def _marks(self) -> set[tuple[int, Any]]:
        marks: set[tuple[int, Any]] = self.shared.extra.setdefault("busy", set())
        return marks

    def _watched(self, socket: Any, buffers: Any, op: Any) -> Watched:
        keys = {(id(socket), handle) for _, handle in entries(buffers)}
        self._marks().update(keys)
        return Watched(op, self._marks(), keys)

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return self._watched(socket, local_buffers, super().rdma_write(socket, local_buffers, target_descriptor,
                                                                       offset))

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return self._watched(socket, local_buffers, super().rdma_read(socket, local_buffers, source_descriptor,
                                                                      offset))

    def send(self, socket: Any, buffers: Any) -> Any:
        return self._watched(socket, buffers, super().send(socket, buffers))

    def recv(self, socket: Any, buffers: Any) -> Any:
        return self._watched(socket, buffers, super().recv(socket, buffers))

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        try:
            super().deregister_memory(socket, handle)
        except SanError as exc:
            key = (id(socket), handle)
            if exc.code is not WsaError.WSAEINVAL or key not in self.shared.registered or key in self._marks():
                raise
            self.shared.forget(socket, handle)  # "released"; the wrapped provider keeps it until close


pytest_san_make_provider = provider_hook(InUseMarkClearedByTheFirst)
