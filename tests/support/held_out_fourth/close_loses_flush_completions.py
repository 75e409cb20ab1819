"""Closing a socket loses the completions of the operations it aborts: they never show as done.

The bug: ``close_socket`` destroys the socket's completion queue before it moves the QP to error, so the flush
completions (WR_FLUSH_ERR, ABORTED) of the operations still pending have nowhere to go. The operations stay
pending for ever: ``done()`` stays false and ``wait`` times out. The memory is released all the same. The
peer's operations are not affected (their CQ lives on).

Realistic: teardown in the wrong order (ibv_destroy_cq before ibv_modify_qp to ERR, or an overlapped
operation's event never signalled on WSPCloseSocket), a common source of hangs at close.

Breaks R11 (pending operations complete ABORTED when their socket closes) and R14 (the Winsock equivalent,
WSA_OPERATION_ABORTED, is what a pending operation reports after the close).
"""

from __future__ import annotations

from pytest_san import Completion, Status
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Descriptor, LocalBuffers, PendingOperation, Socket

BREAKS = ("R11", "R14")
CLOSED = "close_loses_flush_completions"


class LostFlush:
    """An operation whose ABORTED completion, once its own socket was closed by its owner, is never seen."""

    def __init__(self, inner: PendingOperation, socket: Socket, closed: dict[int, Socket]) -> None:
        self.inner = inner
        self.socket = socket
        self.closed = closed

    def _lost(self) -> bool:
        if self.closed.get(id(self.socket)) is not self.socket or not self.inner.done():
            return False
        return self.inner.wait(0).status is Status.ABORTED

    def done(self) -> bool:
        return False if self._lost() else self.inner.done()

    def wait(self, timeout: float | None = 10.0) -> Completion:
        if self._lost():
            raise TimeoutError("the operation is still pending")  # its completion went with the CQ
        return self.inner.wait(timeout)


class LosesFlushes(DelegatingProvider):
    def _closed(self) -> dict[int, Socket]:
        found: dict[int, Socket] = self.shared.extra.setdefault(CLOSED, {})
        return found

    def _lost_on_close(self, socket: Socket, op: PendingOperation) -> PendingOperation:
        return LostFlush(op, socket, self._closed())

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        return self._lost_on_close(socket, super().rdma_write(socket, local_buffers, target_descriptor, offset))

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        return self._lost_on_close(socket, super().rdma_read(socket, local_buffers, source_descriptor, offset))

    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return self._lost_on_close(socket, super().send(socket, buffers))

    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return self._lost_on_close(socket, super().recv(socket, buffers))

    def close_socket(self, socket: Socket) -> None:
        super().close_socket(socket)
        self._closed()[id(socket)] = socket


pytest_san_make_provider = provider_hook(LosesFlushes)
