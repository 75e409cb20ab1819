"""A register_memory handle is accepted on every socket of the process that registered it.

The bug: the provider hands out the MR's lkey as the handle and lets the NIC check it. With one protection domain
per process, an lkey is valid on every QP of that process, so a handle registered on one socket works in a
send, receive or RDMA scatter list of any other socket of the same process. The provider's own table, which
knows the handle's socket, is consulted only for deregistration.

Realistic: it is exactly what verbs does when the provider keeps no per-socket table (an lkey is PD-wide).

Breaks R1 (a handle is good only on the socket it was registered on: used on another socket of the same process
it must be rejected). Other processes' handles are still refused (their lkeys are in other PDs).
"""

from __future__ import annotations

from typing import Any

from pytest_san import SanError, WsaError
from pytest_san.mutants.wrapping import Registered, SubstitutingHandles, inside, provider_hook
from pytest_san.spi.protocols import Buffer, Descriptor, Handle, LocalBuffers, PendingOperation, Socket

from ._common import live

BREAKS = ("R1",)
BORROWED = "handle_valid_on_any_socket_of_its_process"


class ProcessWideHandles(SubstitutingHandles):
    """What the NIC would accept is emulated by a registration made quietly on the socket used, for as long as
    the operation needs it."""

    def _borrowed(self) -> list[tuple[Any, Socket, Handle]]:
        found: list[tuple[Any, Socket, Handle]] = self.shared.extra.setdefault(BORROWED, [])
        return found

    def substitute(self, socket: Socket, buffer: Buffer, handle: Handle) -> Handle:
        if live(self.shared, socket, handle, "memory") is not None:
            return handle
        owner = self._owner(socket, buffer, handle)
        if owner is None:
            return handle
        quiet = self.register_quietly(socket, owner.buffer, owner.access)
        if quiet is None:
            return handle
        self._borrowed().append((self.inner, socket, quiet))
        return quiet

    def _owner(self, socket: Socket, buffer: Buffer, handle: Handle) -> Registered | None:
        for reg in list(self.shared.registered.values()):
            try:
                same = reg.kind == "memory" and reg.key == handle
            except Exception:
                continue
            if (same and reg.socket is not socket and reg.socket.process is socket.process
                    and not getattr(reg.socket, "closed", True) and inside(buffer, reg)):
                return reg
        return None

    def _tidy(self) -> None:
        """Drop the quiet registrations no operation uses any more."""
        borrowed = self._borrowed()
        for item in list(borrowed):
            provider, socket, quiet = item
            try:
                provider.deregister_memory(socket, quiet)
            except SanError as exc:
                if getattr(socket, "closed", True) or exc.code != WsaError.WSAEINVAL:
                    borrowed.remove(item)
                continue  # in use: later
            borrowed.remove(item)

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        op = super().rdma_write(socket, local_buffers, target_descriptor, offset)
        self._tidy()
        return op

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        op = super().rdma_read(socket, local_buffers, source_descriptor, offset)
        self._tidy()
        return op

    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        op = super().send(socket, buffers)
        self._tidy()
        return op

    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        op = super().recv(socket, buffers)
        self._tidy()
        return op

    def registrations(self, socket: Socket) -> Any:
        self._tidy()
        return super().registrations(socket)

    def close_socket(self, socket: Socket) -> None:
        super().close_socket(socket)
        self._tidy()


pytest_san_make_provider = provider_hook(ProcessWideHandles)
