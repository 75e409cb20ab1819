"""Legal: a switch that builds each end receive side first and posts its ring in reverse slot order.

Over the example switch: each end registers its receive region (WRITE) and posts a receive in every slot,
last slot first, before it registers its send region (READ); at close it deregisters the receive region before
the send region. Messages land in the receives in the order they were posted, which the switch follows, so
the byte streams are the same.

Why the contract allows it: R9 asks for exactly two regions per connected socket, one per direction, and
messages only into posted receives; R11 asks that idle regions are deregistered before the close. Neither
orders the two registrations, the slots, or the deregistrations (docs/switches.md: "the rest a switch may
choose").
"""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend, Handle
from pytest_san.examples.simple_switch import Release, SimpleConnection, SimpleEndpoint, SimpleSwitch


class ReceiveFirstEndpoint(SimpleEndpoint):
    recv_handle: Handle | None = None

    def build(self) -> None:
        ring = self.conn.message_count * self.conn.message_size
        self.recv_region = self.process.alloc(ring)
        self.send_region = self.process.alloc(ring)
        self.recv_handle = self.call(self.provider.register_memory, self.recv_region, Access.WRITE)
        for slot in reversed(range(self.conn.message_count)):
            self.post_receive(slot)
        send_handle = self.call(self.provider.register_memory, self.send_region, Access.READ)
        self.handles[:] = [send_handle, self.recv_handle]

    def post_receive(self, index: int) -> None:
        slot = self.slot(self.recv_region, index)
        self.receives.append((index, self.call(self.provider.recv, [(slot, self.recv_handle)])))

    def releases(self) -> list[Release]:
        found = super().releases()
        regions = [item for item in found if item[1] in self.handles]
        rest = [item for item in found if item[1] not in self.handles]
        if not self.handles and self.recv_handle is not None \
                and all(op.done() for _, op in self.receives):
            regions = [(self.provider.deregister_memory, self.recv_handle)]  # the send region was never made
        return regions[::-1] + rest  # the receive region first


class ReceiveFirstConnection(SimpleConnection):
    endpoint = ReceiveFirstEndpoint


class ReceiveFirstSwitch(SimpleSwitch):
    connection = ReceiveFirstConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return ReceiveFirstSwitch(backend)
