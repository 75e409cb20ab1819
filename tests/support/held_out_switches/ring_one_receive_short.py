"""A ring of the wrong length: one receive fewer posted than the ring the connection declares.

The author reserves the last receive slot "for later" but the flow control still counts ``message_count``
receives at the peer, so an end may send one message more than the other has posted receives for: R9 ("no end
sends more messages than the other has posted receives for"; on iWARP the extra one breaks the connection).
"""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R9",)


class ShortRingEndpoint(SimpleEndpoint):
    def build(self) -> None:
        ring = self.conn.message_count * self.conn.message_size
        self.send_region = self.process.alloc(ring)
        self.recv_region = self.process.alloc(ring)
        self.handles.append(self.call(self.provider.register_memory, self.send_region, Access.READ))
        self.handles.append(self.call(self.provider.register_memory, self.recv_region, Access.WRITE))
        for slot in range(self.conn.message_count - 1):  # the bug: the last slot never gets a receive
            self.post_receive(slot)


class ShortRingConnection(SimpleConnection):
    endpoint = ShortRingEndpoint


class ShortRingSwitch(SimpleSwitch):
    connection = ShortRingConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return ShortRingSwitch(backend)
