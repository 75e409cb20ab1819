"""Deregistering memory a pending operation uses is accepted (the release is left for later).

Breaks R13: WSAEINVAL is the answer while a pending operation uses the handle. Realistic: the provider "fixes"
the caller's mistake by deferring the deregistration, and reports success for a call that did nothing.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R13",)


class DeregisterInUseAccepted(DelegatingProvider):
    def deregister_memory(self, socket: Any, handle: Any) -> None:
        try:
            super().deregister_memory(socket, handle)
        except SanError as exc:
            if exc.code is not WsaError.WSAEINVAL or (id(socket), handle) not in self.shared.registered:
                raise
            self.shared.forget(socket, handle)  # "later": at close, by the wrapped provider

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        key = bytes(descriptor) if isinstance(descriptor, bytes | bytearray) else None
        try:
            super().deregister_rdma_memory(socket, descriptor)
        except SanError as exc:
            if exc.code is not WsaError.WSAEINVAL or (id(socket), key) not in self.shared.registered:
                raise
            self.shared.forget(socket, key)


pytest_san_make_provider = provider_hook(DeregisterInUseAccepted)
