"""A closed socket's RDMA windows stay usable by its peer until the peer's socket closes too.

The bug: closing a socket releases its registrations in the provider's books at once, but the NIC's windows are
torn down by a reaper that runs when the *connection* is gone from both ends. Meanwhile the peer, whose socket is
still open (no longer connected), can RDMA-write into and RDMA-read from the memory the closed socket had
exposed: the descriptor it was given keeps working.

Realistic: deferred QP/window destruction (a work queue that reaps a connection once both ends have gone), where
the close path only drops the provider's own table entries.

Breaks R4 (after either end closes, RDMA on that connection must be rejected) and R3 (the memory is no longer
registered, the close released it, yet it is reachable through the old descriptor).
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import DelegatingProvider, Registered, provider_hook
from pytest_san.spi.protocols import Descriptor, LocalBuffers, PendingOperation, Socket

from ._common import allows, by_hand, locals_ok, pairs_of, peer_of, rdma_needs

BREAKS = ("R3", "R4")
LINGERING = "windows_linger_after_their_socket_closes"


class LingeringWindows(DelegatingProvider):
    def _lingering(self) -> dict[bytes, Registered]:
        found: dict[bytes, Registered] = self.shared.extra.setdefault(LINGERING, {})
        return found

    def close_socket(self, socket: Socket) -> None:
        keep = {reg.key: reg for reg in self.shared.of_socket(socket)
                if reg.kind == "rdma" and isinstance(reg.key, bytes)}
        super().close_socket(socket)
        lingering = self._lingering()
        for key, reg in list(lingering.items()):
            if peer_of(reg.socket) is socket:  # the connection is gone from both ends: the reaper runs
                del lingering[key]
        if peer_of(socket) is not None and not getattr(peer_of(socket), "closed", True):
            lingering.update(keep)

    def _after_close(self, kind: str, socket: Socket, local_buffers: Any, descriptor: Any,
                     offset: Any) -> PendingOperation | None:
        if not isinstance(descriptor, bytes | bytearray) or type(offset) is not int or offset < 0:
            return None
        target = self._lingering().get(bytes(descriptor))
        pairs = pairs_of(local_buffers)
        if target is None or pairs is None or len(pairs) > 4 or getattr(socket, "closed", True):
            return None
        local_need, remote_need = rdma_needs(kind)
        nbytes = sum(buffer.length for buffer, _ in pairs)
        if (peer_of(target.socket) is socket and allows(target.access, remote_need)
                and offset + nbytes <= target.buffer.length and locals_ok(self.shared, socket, pairs, local_need)):
            return by_hand(kind, pairs, target, offset)  # the bug: the window outlived its socket
        return None

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        done = self._after_close("write", socket, local_buffers, target_descriptor, offset)
        return done or super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        done = self._after_close("read", socket, local_buffers, source_descriptor, offset)
        return done or super().rdma_read(socket, local_buffers, source_descriptor, offset)


pytest_san_make_provider = provider_hook(LingeringWindows)
