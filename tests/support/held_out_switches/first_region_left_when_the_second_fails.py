"""A connect that fails halfway leaves its first region registered.

The author keeps the two handles in locals and records them on the endpoint only once both registrations
succeeded; when the receive region's registration is refused (WSAENOBUFS: the proxy could not pin), the send
region's registration is never deregistered: R11 ("a connect that fails leaves nothing behind").
"""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R11",)


class HalfwayEndpoint(SimpleEndpoint):
    def build(self) -> None:
        ring = self.conn.message_count * self.conn.message_size
        self.send_region = self.process.alloc(ring)
        self.recv_region = self.process.alloc(ring)
        send = self.call(self.provider.register_memory, self.send_region, Access.READ)
        # the bug: a refusal of the second loses `send`
        receive = self.call(self.provider.register_memory, self.recv_region, Access.WRITE)
        self.handles += [send, receive]
        for slot in range(self.conn.message_count):
            self.post_receive(slot)


class HalfwayConnection(SimpleConnection):
    endpoint = HalfwayEndpoint


class HalfwaySwitch(SimpleSwitch):
    connection = HalfwayConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return HalfwaySwitch(backend)
