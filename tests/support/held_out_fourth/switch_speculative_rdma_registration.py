"""The switch registers a send for RDMA before it decides how to send it, and deregisters it when it goes inline.

The bug: any application send that does not fit in one message is first registered with register_rdma_memory
(READ), "so that it is ready if it goes by RDMA"; then the threshold is checked, and a send at or below the
threshold is deregistered at once and sent inline in messages as before. Large sends go by RDMA exactly as
before. No byte moves wrongly, but RDMA registrations are made (and a descriptor exists for a moment) for
transfers that never use RDMA.

Realistic: registration hoisted above the decision it depends on, to overlap it with other work.

Breaks R10 (the switch registers RDMA memory only to move application data by RDMA, above the threshold).
"""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch
from pytest_san.examples.simple_switch.records import HEADER

BREAKS = ("R10",)


class SpeculativeEndpoint(SimpleEndpoint):
    def send(self, data: bytes | bytearray | memoryview) -> None:
        if isinstance(data, bytes | bytearray | memoryview) and not self.closed and not self.error:
            payload = bytes(data)
            if len(payload) > self.conn.message_size - HEADER.size and not self.by_rdma(len(payload)):
                staging = self.process.alloc(len(payload))  # the bug: registered before the threshold is asked
                staging.write(payload)
                descriptor = self.call(self.provider.register_rdma_memory, staging, Access.READ)
                self.call(self.provider.deregister_rdma_memory, descriptor)
        super().send(data)


class SpeculativeConnection(SimpleConnection):
    endpoint = SpeculativeEndpoint


class SpeculativeSwitch(SimpleSwitch):
    connection = SpeculativeConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return SpeculativeSwitch(backend)
