"""Windows of 64 KiB or more are bounds-checked in 64 KiB units.

The bug: for an RDMA window of at least 64 KiB the provider describes the memory with 64 KiB translation entries
(as NICs do for large registrations, to save MTT entries) and checks a remote access against the entries it
built, not against the range registered: an RDMA write or read from the connected peer that starts before the
window or runs past its end is served as long as it stays inside the 64 KiB-aligned blocks the window touches.
Small windows are checked to the byte, so every ordinary test of bounds passes.

Realistic: the page-rounded bounds bug of the shipped corpus, one level up: a driver that switches to large
pages for large regions and checks against the translation table's extent.

Breaks R8 (a transfer past either end of the registered range is served and bytes outside it change). The
access and the connection are still checked (R2, R6, R7 hold).
"""

from __future__ import annotations

from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Descriptor, LocalBuffers, PendingOperation, Socket

from ._common import allows, by_hand, locals_ok, pairs_of, peer_of, rdma_needs, windows

BREAKS = ("R8",)
UNIT = 64 * 1024


class CheckedInUnits(DelegatingProvider):
    def _by_units(self, kind: str, socket: Socket, local_buffers: LocalBuffers, descriptor: Descriptor,
                  offset: int) -> PendingOperation | None:
        pairs = pairs_of(local_buffers)
        if pairs is None or len(pairs) > 4 or type(offset) is not int:
            return None
        if getattr(socket, "closed", True) or not getattr(socket, "connected", False):
            return None
        local_need, remote_need = rdma_needs(kind)
        for target in windows(self.shared, descriptor):
            start, length = target.buffer.address, target.buffer.length
            if length < UNIT or peer_of(target.socket) is not socket or not allows(target.access, remote_need):
                continue
            nbytes = sum(buffer.length for buffer, _ in pairs)
            if offset >= 0 and offset + nbytes <= length:
                return None  # inside the window: the wrapped provider serves it
            low = start - start % UNIT
            high = start + length + (-(start + length) % UNIT)
            if low <= start + offset and start + offset + nbytes <= high and locals_ok(self.shared, socket, pairs,
                                                                                         local_need):
                return by_hand(kind, pairs, target, offset)  # the bug: inside the 64 KiB blocks is enough
        return None

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        done = self._by_units("write", socket, local_buffers, target_descriptor, offset)
        return done or super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        done = self._by_units("read", socket, local_buffers, source_descriptor, offset)
        return done or super().rdma_read(socket, local_buffers, source_descriptor, offset)


pytest_san_make_provider = provider_hook(CheckedInUnits)
