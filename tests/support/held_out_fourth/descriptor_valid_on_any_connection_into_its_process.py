"""An RDMA descriptor is honoured on every connection into the registering process, not just its own.

The bug: the provider registers RDMA memory as an MR with remote rights in the process's protection domain (a
type-1 window, or no window at all) instead of a type-2 window bound to the socket's QP. The rkey is then valid
on every QP of that process: whoever holds the descriptor and has *any* connection into the owning process (a
second socket between the same two processes, a third host, another process of either host) can RDMA-read and
RDMA-write the memory, within its range and access. Connections into other processes are still refused.

Realistic: the Soft-iWARP path of the verbs provider (no memory windows: "an MR with the remote rights, in the
socket's own PD") done without a PD per socket; the NVMe-oF host's declared R2 deviation is the same mechanism.

Breaks R2 (a descriptor serves only the connected peer on that connection) and R5 (another process on the
owner's host, connected to the owner, reaches the registered memory through the registration).
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Descriptor, LocalBuffers, PendingOperation, Socket

from ._common import allows, by_hand, locals_ok, pairs_of, peer_of, rdma_needs, windows

BREAKS = ("R2", "R5")


class ProcessWideWindows(DelegatingProvider):
    def _other_connection(self, kind: str, socket: Socket, local_buffers: Any, descriptor: Any,
                          offset: Any) -> PendingOperation | None:
        pairs = pairs_of(local_buffers)
        if pairs is None or len(pairs) > 4 or type(offset) is not int or offset < 0:
            return None
        if getattr(socket, "closed", True) or not getattr(socket, "connected", False):
            return None
        responder = peer_of(socket)
        if responder is None:
            return None
        local_need, remote_need = rdma_needs(kind)
        nbytes = sum(buffer.length for buffer, _ in pairs)
        for target in windows(self.shared, descriptor):
            if target.socket is responder or target.socket is socket:
                continue  # its own connection (the wrapped provider serves it), or the owner's own loopback
            if (responder.process is target.socket.process and allows(target.access, remote_need)
                    and offset + nbytes <= target.buffer.length
                    and locals_ok(self.shared, socket, pairs, local_need)):
                return by_hand(kind, pairs, target, offset)  # the bug: the rkey is valid on any QP of the PD
        return None

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        done = self._other_connection("write", socket, local_buffers, target_descriptor, offset)
        return done or super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        done = self._other_connection("read", socket, local_buffers, source_descriptor, offset)
        return done or super().rdma_read(socket, local_buffers, source_descriptor, offset)


pytest_san_make_provider = provider_hook(ProcessWideWindows)
