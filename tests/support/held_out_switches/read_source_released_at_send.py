"""A transfer's registration released before its operation completes: the RdmaRead source deregistered as soon as
its descriptor is on its way.

The author treats the descriptor as "handed over" once it is queued for the peer and deregisters it at once,
before the peer's RdmaRead that it is for has run. The read then names a deregistered descriptor and is refused,
so the large transfer never arrives: R10 (a large transfer is an RdmaRead by the receiver from the sender's READ
descriptor).
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch
from pytest_san.examples.simple_switch.records import Kind

BREAKS = ("R10",)


class EarlyReleaseEndpoint(SimpleEndpoint):
    def send(self, data: bytes | bytearray | memoryview) -> None:
        offered = isinstance(data, (bytes, bytearray, memoryview)) and self.by_rdma(len(data)) \
            and self.conn.reads(self.peer)
        super().send(data)
        if offered:
            out = self.to_read[-1]
            assert out.descriptor is not None
            self.call(self.provider.deregister_rdma_memory, out.descriptor)  # the bug: the peer has not read it yet
            out.descriptor = None

    def handle(self, kind: Kind, body: bytes) -> None:
        if kind is Kind.READ_DONE and self.to_read and self.to_read[0].descriptor is None:
            self.to_read.popleft()  # released already
            return
        super().handle(kind, body)


class EarlyReleaseConnection(SimpleConnection):
    endpoint = EarlyReleaseEndpoint


class EarlyReleaseSwitch(SimpleSwitch):
    connection = EarlyReleaseConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return EarlyReleaseSwitch(backend)
