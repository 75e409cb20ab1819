"""A deregistered handle used again: the RdmaWrite source's handle cached from the connection's first transfer.

The author caches "the" source handle of RdmaWrite on the endpoint at the first large send and uses it for every
later one, while each transfer still registers and deregisters its own source. From the second transfer on, the
write names a handle deregistered after the first (R3: "only while registered"); the provider refuses it, so the
large transfer never arrives: R10 (a large transfer is an RdmaWrite of the sender's data into the receiver's
descriptor).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_san import Backend, Handle, PendingOperation
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch, Transfer

BREAKS = ("R3", "R10")


class CachingEndpoint(SimpleEndpoint):
    cached: Handle | None = None

    def rdma(self, transfer: Callable[..., PendingOperation], item: Transfer,
             descriptor: bytes) -> list[PendingOperation]:
        if transfer != self.provider.rdma_write:
            return super().rdma(transfer, item, descriptor)
        if self.cached is None:
            self.cached = item.handle
        fresh, item.handle = item.handle, self.cached  # the bug: the first transfer's handle, deregistered since
        try:
            return super().rdma(transfer, item, descriptor)
        finally:
            item.handle = fresh


class CachingConnection(SimpleConnection):
    endpoint = CachingEndpoint


class CachingSwitch(SimpleSwitch):
    connection = CachingConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return CachingSwitch(backend)
