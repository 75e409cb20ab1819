"""Closing a socket only marks it closed: its connection, registrations and windows stay up.

Breaks R4 (the peer's RDMA still lands after the close) and R11 (the registrations outlive the socket).
Realistic: WSPCloseSocket that refuses further calls on the socket but leaves destroying the QP and deregistering
to process exit.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R4", "R11")


class CloseKeepsTheConnection(DelegatingProvider):
    def _open(self, socket: Any) -> None:
        if id(socket) in self.shared.extra.setdefault("closed", {}):
            raise SanError(WsaError.WSAENOTSOCK, f"{socket!r} is closed")

    def close_socket(self, socket: Any) -> None:
        self._open(socket)
        self.shared.extra["closed"][id(socket)] = socket

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        self._open(socket)
        return super().register_memory(socket, buffer, access)

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        self._open(socket)
        super().deregister_memory(socket, handle)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        self._open(socket)
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        self._open(socket)
        super().deregister_rdma_memory(socket, descriptor)

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        self._open(socket)
        return super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        self._open(socket)
        return super().rdma_read(socket, local_buffers, source_descriptor, offset)

    def send(self, socket: Any, buffers: Any) -> Any:
        self._open(socket)
        return super().send(socket, buffers)

    def recv(self, socket: Any, buffers: Any) -> Any:
        self._open(socket)
        return super().recv(socket, buffers)

    def registrations(self, socket: Any) -> Any:
        return [] if id(socket) in self.shared.extra.get("closed", {}) else super().registrations(socket)


pytest_san_make_provider = provider_hook(CloseKeepsTheConnection)
