"""Deregistering memory a pending operation uses "succeeds": the release is deferred until the operation ends.

The bug: instead of refusing a deregistration whose registration is in use (WSAEINVAL), the provider returns
success and queues the release, which it performs on a later call once the operations using it have completed.
Until then the handle or descriptor the caller deregistered keeps working: the peer can still RDMA through the
descriptor, the caller can still post with the handle, and the registration is still listed.

Realistic: the "lazy deregistration" of Windows' own memory-registration caches and of several MPI libraries,
which is convenient and silently breaks the SPI's in-use rule.

Breaks R13 (deregistering a handle or descriptor a pending operation uses must be WSAEINVAL) and R3 (once the
caller has deregistered, every use of the handle or descriptor must be rejected; here it works until the
deferred release runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_san import SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Buffer, Descriptor, Handle, LocalBuffers, PendingOperation, Socket

from ._common import live

BREAKS = ("R3", "R13")
DEFERRED = "busy_deregistration_deferred"


class DeferredRelease(DelegatingProvider):
    def _queue(self) -> list[tuple[Any, Socket, object, str]]:
        found: list[tuple[Any, Socket, object, str]] = self.shared.extra.setdefault(DEFERRED, [])
        return found

    def _retry(self) -> None:
        """The deferred releases whose registrations are no longer in use."""
        queue = self._queue()
        for item in list(queue):
            provider, socket, key, kind = item
            if getattr(socket, "closed", True):
                queue.remove(item)  # the close released it
                continue
            release = provider.deregister_memory if kind == "memory" else provider.deregister_rdma_memory
            try:
                release(socket, key)
            except SanError as exc:
                if exc.code == WsaError.WSAEINVAL:
                    continue  # still in use
            queue.remove(item)

    def _deregister(self, kind: str, socket: Socket, key: Any) -> None:
        self._retry()
        release = super().deregister_memory if kind == "memory" else super().deregister_rdma_memory
        try:
            release(socket, key)
        except SanError as exc:
            noted = bytes(key) if isinstance(key, bytes | bytearray) else key
            if exc.code != WsaError.WSAEINVAL or live(self.shared, socket, noted, kind) is None:
                raise
            # the bug: in use, so released later; the caller is told it is done
            self.shared.forget(socket, noted)
            self._queue().append((self.inner, socket, key, kind))

    def deregister_memory(self, socket: Socket, handle: Handle) -> None:
        self._deregister("memory", socket, handle)

    def deregister_rdma_memory(self, socket: Socket, descriptor: Descriptor) -> None:
        self._deregister("rdma", socket, descriptor)

    # every other call first performs the releases that have become possible
    def register_memory(self, socket: Socket, buffer: Buffer, access: Any) -> Handle:
        self._retry()
        return super().register_memory(socket, buffer, access)

    def register_rdma_memory(self, socket: Socket, buffer: Buffer, access: Any,
                             descriptor_size: int | None = None) -> Descriptor:
        self._retry()
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        self._retry()
        return super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        self._retry()
        return super().rdma_read(socket, local_buffers, source_descriptor, offset)

    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        self._retry()
        return super().send(socket, buffers)

    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        self._retry()
        return super().recv(socket, buffers)

    def getsockopt(self, socket: Socket, option: int) -> int:
        self._retry()
        return super().getsockopt(socket, option)

    def registrations(self, socket: Socket) -> Sequence[Any]:
        self._retry()
        return super().registrations(socket)

    def close_socket(self, socket: Socket) -> None:
        self._retry()
        super().close_socket(socket)


pytest_san_make_provider = provider_hook(DeferredRelease)
