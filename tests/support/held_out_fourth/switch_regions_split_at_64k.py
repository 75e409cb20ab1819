"""The switch registers each message ring in pieces of at most 64 KiB.

The bug: believing that a registration must not exceed 64 KiB (a limit of an old NIC it was first written for),
the switch registers each ring as several registrations of whole message slots, each at most 64 KiB (one slot
when a slot is bigger), and posts each slot with the handle of its piece. With the example switch's default ring
(16 messages of 1 KiB) nothing changes; a larger ring gets three, four or more regions per socket.

Realistic: a hardware limit hard-coded in portable code, a classic of drivers ported from one NIC to another.

Breaks R9 (exactly two virtually contiguous regions per connected socket, one per direction).
"""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend, Handle, PendingOperation
from pytest_san.examples.simple_switch import Release, SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R9",)
PIECE = 64 * 1024


class SplitEndpoint(SimpleEndpoint):
    def build(self) -> None:
        size, count = self.conn.message_size, self.conn.message_count
        self.per_piece = max(1, PIECE // size)
        self.pieces: tuple[list[Handle], list[Handle]] = ([], [])  # the send ring's, the receive ring's
        self.send_region = self.process.alloc(count * size)
        self.recv_region = self.process.alloc(count * size)
        for region, access, handles in ((self.send_region, Access.READ, self.pieces[0]),
                                        (self.recv_region, Access.WRITE, self.pieces[1])):
            for first in range(0, count, self.per_piece):  # the bug: one registration per 64 KiB
                slots = min(self.per_piece, count - first)
                piece = region.view(first * size, slots * size)
                handles.append(self.call(self.provider.register_memory, piece, access))
        for slot in range(count):
            self.post_receive(slot)

    def post_receive(self, index: int) -> None:
        slot = self.slot(self.recv_region, index)
        handle = self.pieces[1][index // self.per_piece]
        self.receives.append((index, self.call(self.provider.recv, [(slot, handle)])))

    def send_message(self, index: int, message: bytes) -> PendingOperation:
        buffer = self.slot(self.send_region, index).view(0, len(message))
        buffer.write(message)
        return self.call(self.provider.send, [(buffer, self.pieces[0][index // self.per_piece])])

    def releases(self) -> list[Release]:
        found: list[Release] = []
        pieces: tuple[list[Handle], list[Handle]] = getattr(self, "pieces", ([], []))
        if all(op.done() for op in self.sends.values()):
            found += [(self.provider.deregister_memory, handle) for handle in pieces[0]]
        if all(op.done() for _, op in self.receives):
            found += [(self.provider.deregister_memory, handle) for handle in pieces[1]]
        return found + super().releases()  # the transfers' (self.handles stays empty)


class SplitConnection(SimpleConnection):
    endpoint = SplitEndpoint


class SplitSwitch(SimpleSwitch):
    connection = SplitConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return SplitSwitch(backend)
