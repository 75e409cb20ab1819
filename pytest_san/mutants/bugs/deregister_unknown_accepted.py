"""Deregistering a handle or descriptor that is not registered on the socket returns success.

Breaks R13 and R14: deregistering an unknown handle is WSAEINVAL. Realistic: a lookup miss treated as "already
released", which also hides double deregistrations and handles passed to the wrong socket.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R13", "R14")


class DeregisterUnknownAccepted(DelegatingProvider):
    def deregister_memory(self, socket: Any, handle: Any) -> None:
        try:
            super().deregister_memory(socket, handle)
        except SanError as exc:
            if exc.code is not WsaError.WSAEINVAL or (id(socket), handle) in self.shared.registered:
                raise

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        key = bytes(descriptor) if isinstance(descriptor, bytes | bytearray) else None
        try:
            super().deregister_rdma_memory(socket, descriptor)
        except SanError as exc:
            if exc.code is not WsaError.WSAEINVAL or (id(socket), key) in self.shared.registered:
                raise


pytest_san_make_provider = provider_hook(DeregisterUnknownAccepted)
