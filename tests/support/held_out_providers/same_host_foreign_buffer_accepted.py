"""register_memory and register_rdma_memory take a buffer of another process if it lives on the caller's host.

Breaks R1 (a process registers memory that is not its own) and R5 (another process's memory on the same host is
exposed through the registration). Realistic: a kernel-side provider that checks that the buffer's pages belong
to this host, and pins them through the other process's page tables.
"""

from __future__ import annotations

from typing import Any

from pytest_san import SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook

BREAKS = ("R1", "R5")


class SameHostForeignBufferAccepted(DelegatingProvider):
    def _neighbours(self, socket: Any, buffer: Any, exc: SanError) -> Any:
        """A buffer of the caller holding the neighbour's bytes (the pages "pinned"), or ``exc`` raised."""
        try:
            process, length = buffer.process, buffer.length
            neighbour = process is not socket.process and process.node.name == socket.process.node.name
        except AttributeError:
            raise exc from None
        if exc.code is not WsaError.WSAEFAULT or not neighbour or type(length) is not int or length <= 0:
            raise exc
        copy = socket.process.alloc(length)
        copy.write(buffer.read())
        return copy

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        try:
            return super().register_memory(socket, buffer, access)
        except SanError as exc:
            return super().register_memory(socket, self._neighbours(socket, buffer, exc), access)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        try:
            return super().register_rdma_memory(socket, buffer, access, descriptor_size)
        except SanError as exc:
            return super().register_rdma_memory(socket, self._neighbours(socket, buffer, exc), access,
                                                descriptor_size)


pytest_san_make_provider = provider_hook(SameHostForeignBufferAccepted)
