"""A new registration is handed the very bytes of a descriptor deregistered on the same socket before.

Breaks R3: a stale copy of the old descriptor (the peer kept it) reaches the new registration's memory, and no
one can tell. Realistic: a provider keeps a free list of window slots and encodes a descriptor as the slot's
index and the range, without the generation bits that verbs puts in an rkey for exactly this reason.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R3",)


class DescriptorReusedAfterDeregister(DelegatingProvider):
    def _map(self) -> dict[bytes, bytes]:
        """Our descriptors -> the wrapped provider's (shared: the peer's provider translates what it is given)."""
        table: dict[bytes, bytes] = self.shared.extra.setdefault("reused_descriptors", {})
        return table

    def _freed(self, socket: Any) -> list[bytes]:
        freed: dict[int, list[bytes]] = self.shared.extra.setdefault("freed_descriptors", {})
        return freed.setdefault(id(socket), [])

    def _inner(self, descriptor: Any) -> Any:
        if isinstance(descriptor, bytes | bytearray):
            return self._map().get(bytes(descriptor), descriptor)
        return descriptor

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        inner = bytes(self.inner.register_rdma_memory(socket, buffer, access, descriptor_size))
        freed, table = self._freed(socket), self._map()
        # A registration the wrapped provider counts again keeps its descriptor; a new one takes a freed slot's.
        ours = next((mine for mine, theirs in table.items() if theirs == inner and mine not in freed), None)
        if ours is None:
            ours = freed.pop(0) if freed else inner
        table[ours] = inner
        self.shared.note(socket, buffer, access, "rdma", ours)
        return ours

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        self.inner.deregister_rdma_memory(socket, self._inner(descriptor))
        if isinstance(descriptor, bytes | bytearray) and self.shared.forget(socket, bytes(descriptor)) is not None:
            self._freed(socket).append(bytes(descriptor))

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_write(socket, local_buffers, self._inner(target_descriptor), offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_read(socket, local_buffers, self._inner(source_descriptor), offset)


pytest_san_make_provider = provider_hook(DescriptorReusedAfterDeregister)
