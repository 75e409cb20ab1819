"""Legal: each large transfer moved in RDMA operations of 4 KiB over its one descriptor.

The contract asks one descriptor per large transfer (R10), not one operation: a switch may split the transfer
into as many RdmaRead or RdmaWrite operations as it likes, each within the provider's ``SO_MAX_RDMA_SIZE``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_san import SO_MAX_RDMA_SIZE, Backend, PendingOperation
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch, Transfer

PIECE = 4096


class SmallPiecesEndpoint(SimpleEndpoint):
    def rdma(self, transfer: Callable[..., PendingOperation], item: Transfer,
             descriptor: bytes) -> list[PendingOperation]:
        step = min(PIECE, self.provider.getsockopt(self.socket, SO_MAX_RDMA_SIZE))
        return [self.call(transfer, [(item.buffer.view(at, min(step, item.length - at)), item.handle)], descriptor, at)
                for at in range(0, item.length, step)]


class SmallPiecesConnection(SimpleConnection):
    endpoint = SmallPiecesEndpoint


class SmallPiecesSwitch(SimpleSwitch):
    connection = SmallPiecesConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return SmallPiecesSwitch(backend)
