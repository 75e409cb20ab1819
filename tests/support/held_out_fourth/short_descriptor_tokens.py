"""Legal: RDMA descriptors are 8-byte tokens, which the provider maps to its window at every use.

The provider hands out an 8-byte token per distinct RDMA registration (the same token for a repeated
registration the wrapped provider counts; a token is never handed out again), and answers the descriptor-size
probe with 8: a ``descriptor_size`` below 8 is WSAEFAULT with ``required_size=8``. A token it does not know is
a descriptor naming no window; bytes of any other length are a malformed descriptor.

Why the contract allows it: CONTRACT.md section 2, "an RDMA descriptor is opaque bytes of a length the provider
chooses: a caller learns it through the `descriptor_size` probe [...], and a descriptor of any other length is
WSAEINVAL. 20 bytes is only what pytest-san's own providers chose". Shorter than 20 is as legal as longer (the
corpus's legal variant is longer).
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

from pytest_san import Access, SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Buffer, Descriptor, LocalBuffers, PendingOperation, Socket

SIZE = 8
TABLES = "short_descriptor_tokens"
_tokens = (struct.pack("<Q", 0x5A4E000000000000 + n) for n in itertools.count(1))
UNKNOWN = bytes(20)  # for the wrapped provider: of its length, naming no window


class ShortTokens(DelegatingProvider):
    def _tables(self) -> tuple[dict[bytes, bytes], dict[tuple[int, bytes], tuple[bytes, int]]]:
        """(token -> the wrapped provider's descriptor, ever; (socket, its descriptor) -> (token, count))."""
        found: tuple[dict[bytes, bytes], dict[tuple[int, bytes], tuple[bytes, int]]] = \
            self.shared.extra.setdefault(TABLES, ({}, {}))
        return found

    def _inner(self, descriptor: object) -> Any:
        if not isinstance(descriptor, bytes | bytearray):
            return descriptor  # not bytes: the wrapped provider refuses it
        if len(descriptor) != SIZE:
            return b""  # malformed: of no length the wrapped provider takes
        return self._tables()[0].get(bytes(descriptor), UNKNOWN)

    def register_rdma_memory(self, socket: Socket, buffer: Buffer, access: Access,
                             descriptor_size: int | None = None) -> Descriptor:
        if type(descriptor_size) is int:
            if descriptor_size < SIZE:
                raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {SIZE} bytes", required_size=SIZE)
            descriptor_size = None  # room enough
        try:
            inner = bytes(self.inner.register_rdma_memory(socket, buffer, access, descriptor_size))
        except SanError as exc:
            if exc.required_size is not None:
                raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {SIZE} bytes", required_size=SIZE) from None
            raise
        outward, live = self._tables()
        token, count = live.get((id(socket), inner), (b"", 0))
        if not token:
            token = next(_tokens)
            outward[token] = inner
        live[id(socket), inner] = (token, count + 1)
        self.shared.note(socket, buffer, access, "rdma", token)
        return token

    def deregister_rdma_memory(self, socket: Socket, descriptor: Descriptor) -> None:
        inner = self._inner(descriptor)
        self.inner.deregister_rdma_memory(socket, inner)
        _, live = self._tables()
        token, count = live.pop((id(socket), inner), (b"", 0))
        if count > 1:
            live[id(socket), inner] = (token, count - 1)
        self.shared.forget(socket, bytes(descriptor))

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        return super().rdma_write(socket, local_buffers, self._inner(target_descriptor), offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        return super().rdma_read(socket, local_buffers, self._inner(source_descriptor), offset)

    def close_socket(self, socket: Socket) -> None:
        super().close_socket(socket)
        _, live = self._tables()
        for key in [key for key in live if key[0] == id(socket)]:
            del live[key]


pytest_san_make_provider = provider_hook(ShortTokens)
