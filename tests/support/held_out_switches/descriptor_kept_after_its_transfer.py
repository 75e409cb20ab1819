"""An RdmaRead source kept registered after its transfer, until the connection closes.

The author deregisters a large send's READ descriptor only at close ("the connection is the unit of cleanup"),
not when the peer says it has read it. Every large send stays readable by the peer for the rest of the
connection: RDMA memory registered with no transfer to move (R10: RDMA memory only to move application data
by RDMA). Close still releases it, so no leak shows.
"""

from __future__ import annotations

import pytest

from pytest_san import Backend, Process, Socket
from pytest_san.examples.simple_switch import Release, SimpleConnection, SimpleEndpoint, SimpleSwitch, Transfer
from pytest_san.examples.simple_switch.records import Kind

BREAKS = ("R10",)


class KeepingEndpoint(SimpleEndpoint):
    def __init__(self, conn: SimpleConnection, name: str, socket: Socket, process: Process) -> None:
        super().__init__(conn, name, socket, process)
        self.kept: list[Transfer] = []

    def handle(self, kind: Kind, body: bytes) -> None:
        if kind is Kind.READ_DONE:
            self.kept.append(self.to_read.popleft())  # the bug: not deregistered here
            return
        super().handle(kind, body)

    def releases(self) -> list[Release]:
        return super().releases() + [(self.provider.deregister_rdma_memory, out.descriptor) for out in self.kept]


class KeepingConnection(SimpleConnection):
    endpoint = KeepingEndpoint


class KeepingSwitch(SimpleSwitch):
    connection = KeepingConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return KeepingSwitch(backend)
