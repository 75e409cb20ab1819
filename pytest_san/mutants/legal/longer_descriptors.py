"""Descriptors 16 bytes longer than pytest-san's, a different one for each registration of the same buffer.

Descriptors are opaque bytes of the provider's own size (the descriptor-too-small probe tells a caller how many
it needs), and R13 lets a provider answer the same registration with the same descriptor or not.
"""

from __future__ import annotations

import itertools
from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook

PAD = 16
_tags = itertools.count(1)


class LongerDescriptors(DelegatingProvider):
    pad = PAD  # bytes added to each of the wrapped provider's descriptors

    def _table(self) -> dict[bytes, bytes]:
        table: dict[bytes, bytes] = self.shared.extra.setdefault("inner", {})
        return table

    def _gone(self) -> set[bytes]:
        gone: set[bytes] = self.shared.extra.setdefault("gone", set())
        return gone

    def _inner(self, descriptor: Any) -> Any:
        """The wrapped provider's descriptor for one of ours (for a deregistered one, bytes it never handed out:
        another of ours may still hold the same registration, R3); anything else as given (it judges that)."""
        if isinstance(descriptor, bytes | bytearray):
            inner = self._table().get(bytes(descriptor), descriptor)
            return bytes(len(inner)) if bytes(descriptor) in self._gone() else inner
        return descriptor

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        size = descriptor_size
        if type(size) is int:  # probe with the room the wrapped descriptor has inside ours
            size = max(size - self.pad, 0)
        try:
            inner = self.inner.register_rdma_memory(socket, buffer, access, size)
        except SanError as exc:
            if exc.required_size is None:
                raise
            raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {exc.required_size + self.pad} bytes",
                           required_size=exc.required_size + self.pad) from exc
        ours = bytes(inner) + next(_tags).to_bytes(self.pad, "little")
        self._table()[ours] = bytes(inner)
        return ours

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        # The entry stays: a stale descriptor is still one of ours, refused as the wrapped provider refuses its own.
        self.inner.deregister_rdma_memory(socket, self._inner(descriptor))
        if isinstance(descriptor, bytes | bytearray) and bytes(descriptor) in self._table():
            self._gone().add(bytes(descriptor))

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_write(socket, local_buffers, self._inner(target_descriptor), offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_read(socket, local_buffers, self._inner(source_descriptor), offset)


pytest_san_make_provider = provider_hook(LongerDescriptors)
