"""A scatter entry's address is looked up in the calling process's address space, whichever process the buffer
belongs to: another process's range is taken for the caller's memory at the same address.

Breaks R1 (a transfer names memory that is not the caller's, and is not refused) and R5 (what moves is decided
by a range of another process). Realistic: a kernel-side provider that translates every user address through
the current process's page tables (``current->mm``) and never compares the buffer's owner with the caller.
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook

BREAKS = ("R1", "R5")


class EntryResolvedInTheCallersAddressSpace(DelegatingProvider):
    def _mine(self, socket: Any, buffers: Any) -> Any:
        if not isinstance(buffers, list | tuple):
            return buffers
        taken = []
        for pair in buffers:
            if isinstance(pair, tuple | list) and len(pair) == 2:
                buffer, handle = pair
                process = getattr(buffer, "process", None)
                if process is not None and process is not socket.process \
                        and process.node.name == socket.process.node.name:
                    pair = (socket.process.buffer_at(buffer.address, buffer.length), handle)
            taken.append(pair)
        return taken

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return super().rdma_write(socket, self._mine(socket, local_buffers), target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return super().rdma_read(socket, self._mine(socket, local_buffers), source_descriptor, offset)

    def send(self, socket: Any, buffers: Any) -> Any:
        return super().send(socket, self._mine(socket, buffers))

    def recv(self, socket: Any, buffers: Any) -> Any:
        return super().recv(socket, self._mine(socket, buffers))


pytest_san_make_provider = provider_hook(EntryResolvedInTheCallersAddressSpace)
