"""Registering a range outside the caller's address space (or an empty one) succeeds; it fails only when used.

Breaks R14 (WSAEFAULT at the registration) and R1 (registering another process's buffer is not refused).
Realistic: a provider that defers pinning -- and so the address check -- to the first transfer, handing out a
handle for memory it never looked at.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import DESCRIPTOR_SIZE, SanError, WsaError
from ..wrapping import DelegatingProvider, fake_handle, provider_hook

BREAKS = ("R1", "R14")


class RangeCheckedAtFirstUse(DelegatingProvider):
    def _fakes(self) -> set[Any]:
        fakes: set[Any] = self.shared.extra.setdefault("fakes", set())
        return fakes

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        try:
            return super().register_memory(socket, buffer, access)
        except SanError as exc:
            if exc.code is not WsaError.WSAEFAULT:
                raise
            handle = fake_handle()
            self._fakes().add(handle)
            return handle

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        try:
            return super().register_rdma_memory(socket, buffer, access, descriptor_size)
        except SanError as exc:
            if exc.code is not WsaError.WSAEFAULT or exc.required_size is not None:
                raise
            descriptor = fake_handle().to_bytes(DESCRIPTOR_SIZE, "little")
            self._fakes().add(descriptor)
            return descriptor

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        if handle in self._fakes():
            self._fakes().discard(handle)
            return
        super().deregister_memory(socket, handle)

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        key = bytes(descriptor) if isinstance(descriptor, bytes | bytearray) else None
        if key in self._fakes():
            self._fakes().discard(key)
            return
        super().deregister_rdma_memory(socket, descriptor)


pytest_san_make_provider = provider_hook(RangeCheckedAtFirstUse)
