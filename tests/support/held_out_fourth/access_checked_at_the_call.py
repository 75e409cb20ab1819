"""Legal: a scatter entry whose handle lacks the access its use needs is refused at the call (WSAEFAULT).

The provider keeps its own table of what each handle allows (as the verbs provider must, for R7) and consults it
before posting: a send or RdmaWrite source whose handle was registered WRITE only, or a receive or RdmaRead sink
whose handle was registered READ only, is refused with WSAEFAULT at the call, before anything is posted or
marked in use; the connection stays up. Calls with any other fault (a bad socket, too many entries, malformed
entries, unknown handles, zero-length entries) are left to the wrapped provider, so the refusal only replaces
the error completion the wrapped provider would give for the same call.

Why the contract allows it: "Rejected [...] means a `SanError` at the call or an error completion, and in either
case not one byte moves" (CONTRACT.md section 3), and the documented alternative ``refused-at-the-call``
(docs/deviations.md: "a provider that keeps its own table of what each handle allows may check it before it
posts", answering WSAEFAULT or WSAEINVAL at the call, changing nothing).
"""

from __future__ import annotations

from typing import Any

from pytest_san import Access, SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, inside, provider_hook
from pytest_san.spi.protocols import Descriptor, LocalBuffers, PendingOperation, Socket

from ._common import allows, live, pairs_of


class ChecksAccessFirst(DelegatingProvider):
    def _refuse(self, socket: Socket, local_buffers: Any, need: Access, name: str) -> None:
        pairs = pairs_of(local_buffers)
        if not pairs or len(pairs) > 4 or getattr(socket, "closed", True) or not getattr(socket, "connected", False):
            return
        found = [live(self.shared, socket, handle, "memory") for _, handle in pairs]
        if any(reg is None or not inside(buffer, reg) for reg, (buffer, _) in zip(found, pairs, strict=True)):
            return  # another fault: the wrapped provider judges it
        for index, (reg, (buffer, _)) in enumerate(zip(found, pairs, strict=True)):
            assert reg is not None
            if buffer.length > 0 and not allows(reg.access, need):
                raise SanError(WsaError.WSAEFAULT, f"{name}[{index}]: its handle does not allow {need.name}")

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        self._refuse(socket, local_buffers, Access.READ, "local_buffers")
        return super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        self._refuse(socket, local_buffers, Access.WRITE, "local_buffers")
        return super().rdma_read(socket, local_buffers, source_descriptor, offset)

    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        self._refuse(socket, buffers, Access.READ, "buffers")
        return super().send(socket, buffers)

    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        self._refuse(socket, buffers, Access.WRITE, "buffers")
        return super().recv(socket, buffers)


pytest_san_make_provider = provider_hook(ChecksAccessFirst)
