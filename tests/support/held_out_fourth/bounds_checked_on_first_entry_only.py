"""An RDMA transfer's bounds are checked with its first scatter entry only.

The bug: the provider checks ``offset + length`` against the remote window, but takes the length from the first
entry of the scatter list instead of their sum (the code was written for one SGE and grew a loop later). A
transfer of several entries whose first entry fits and whose others run past the end of the window is served:
an RDMA write lands past the window, an RDMA read returns bytes past it. One-entry transfers are checked right.

Realistic: multi-SGE support added to a single-buffer path, with the length of ``sge[0]`` left in the check.

Breaks R8 (bytes beyond the registered range are written or read; one entry outside rejects nothing).
"""

from __future__ import annotations

from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Descriptor, LocalBuffers, PendingOperation, Socket

from ._common import allows, by_hand, locals_ok, pairs_of, peer_of, rdma_needs, windows

BREAKS = ("R8",)


class FirstEntryBounds(DelegatingProvider):
    def _first_only(self, kind: str, socket: Socket, local_buffers: LocalBuffers, descriptor: Descriptor,
                    offset: int) -> PendingOperation | None:
        pairs = pairs_of(local_buffers)
        if not pairs or len(pairs) < 2 or len(pairs) > 4 or type(offset) is not int or offset < 0:
            return None
        if getattr(socket, "closed", True) or not getattr(socket, "connected", False):
            return None
        local_need, remote_need = rdma_needs(kind)
        total = sum(buffer.length for buffer, _ in pairs)
        for target in windows(self.shared, descriptor):
            length = target.buffer.length
            if peer_of(target.socket) is not socket or not allows(target.access, remote_need):
                continue
            if offset + pairs[0][0].length <= length < offset + total and locals_ok(self.shared, socket, pairs,
                                                                                      local_need):
                return by_hand(kind, pairs, target, offset)  # the bug: only the first entry was measured
        return None

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        done = self._first_only("write", socket, local_buffers, target_descriptor, offset)
        return done or super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        done = self._first_only("read", socket, local_buffers, source_descriptor, offset)
        return done or super().rdma_read(socket, local_buffers, source_descriptor, offset)


pytest_san_make_provider = provider_hook(FirstEntryBounds)
