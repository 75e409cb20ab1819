"""A range the caller has not mapped is looked up in another process of the host that registered it.

Breaks R5: registering an address that is not the caller's exposes another process's bytes at that address.
Realistic: a kernel-side provider that resolves user addresses through the wrong process's page tables (the
one whose registration it cached for the same address) instead of failing with WSAEFAULT.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, Registered, provider_hook

BREAKS = ("R5",)


class AddressResolvedInAnotherProcess(DelegatingProvider):
    def _elsewhere(self, socket: Any, buffer: Any) -> Registered | None:
        try:
            address, length, process = buffer.address, buffer.length, buffer.process
        except AttributeError:
            return None
        if type(address) is not int or type(length) is not int or length <= 0:
            return None
        for reg in self.shared.registered.values():
            owner = reg.buffer.process
            if (owner is not process and owner.node.name == process.node.name
                    and reg.buffer.address <= address and address + length <= reg.buffer.address + reg.buffer.length):
                return reg
        return None

    def _copy_of(self, socket: Any, buffer: Any, exc: SanError) -> Any:
        """A buffer of the caller holding the other process's bytes at ``buffer``'s range, or ``exc`` raised."""
        unmapped = exc.code is WsaError.WSAEFAULT and exc.required_size is None
        found = self._elsewhere(socket, buffer) if unmapped else None
        if found is None:
            raise exc
        copy = socket.process.alloc(buffer.length)
        copy.write(found.buffer.read(buffer.length, buffer.address - found.buffer.address))
        return copy

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        try:
            return super().register_memory(socket, buffer, access)
        except SanError as exc:
            return super().register_memory(socket, self._copy_of(socket, buffer, exc), access)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        try:
            return super().register_rdma_memory(socket, buffer, access, descriptor_size)
        except SanError as exc:
            return super().register_rdma_memory(socket, self._copy_of(socket, buffer, exc), access, descriptor_size)


pytest_san_make_provider = provider_hook(AddressResolvedInAnotherProcess)
