"""Descriptors of 8 bytes, shorter than pytest-san's 20: a token the provider maps to its window, never reused.

Legal: a descriptor is opaque bytes of the length the provider chooses, which the ``descriptor_size`` probe
reveals (here: 8); a descriptor of any other length is WSAEINVAL; a deregistered one is never handed out again
on its connection (R3) -- every token is new.
"""

from __future__ import annotations

import itertools
from typing import Any

from pytest_san import SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook

SIZE = 8
_tokens = itertools.count(1)


class ShorterDescriptors(DelegatingProvider):
    def _table(self) -> dict[bytes, bytes]:
        table: dict[bytes, bytes] = self.shared.extra.setdefault("short", {})
        return table

    def _inner(self, descriptor: Any) -> Any:
        """The wrapped provider's descriptor for one of ours; anything else as given (it judges that)."""
        if isinstance(descriptor, bytes | bytearray):
            return self._table().get(bytes(descriptor), descriptor)
        return descriptor

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        size = descriptor_size
        if type(size) is int and size < SIZE:
            try:  # the wrapped provider judges everything else first, then answers the probe (with its size)
                self.inner.register_rdma_memory(socket, buffer, access, 0)
            except SanError as exc:
                if exc.required_size is None:
                    raise
            raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {SIZE} bytes", required_size=SIZE)
        inner = self.inner.register_rdma_memory(socket, buffer, access, None if type(size) is int else size)
        ours = next(_tokens).to_bytes(SIZE, "little")
        self._table()[ours] = bytes(inner)
        self.shared.note(socket, buffer, access, "rdma", ours)
        return ours

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        inner = self._inner(descriptor)
        self.inner.deregister_rdma_memory(socket, inner)
        if isinstance(descriptor, bytes | bytearray):
            # The entry stays, a stale token is still one of ours: it now names nothing the wrapped provider
            # registered (its descriptor may live on, for another token of the same range), so the wrapped
            # provider refuses it as it refuses a window of its own that is gone.
            self._table()[bytes(descriptor)] = bytes(len(inner))
            self.shared.forget(socket, bytes(descriptor))

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_write(socket, local_buffers, self._inner(target_descriptor), offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_read(socket, local_buffers, self._inner(source_descriptor), offset)


pytest_san_make_provider = provider_hook(ShorterDescriptors)
