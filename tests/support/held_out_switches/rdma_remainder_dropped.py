"""A large transfer's tail lost: RDMA in whole pieces of ``SO_MAX_RDMA_SIZE``, the remainder forgotten.

The author splits a transfer longer than the provider's largest RDMA into ``length // max`` pieces of ``max``
bytes and forgets the last, shorter one. A transfer of a length past the largest RDMA and not a multiple of it
arrives with its tail never written: R9/R10 (every length around the provider's largest RDMA arrives whole).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_san import SO_MAX_RDMA_SIZE, Backend, PendingOperation
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch, Transfer

BREAKS = ("R9", "R10")


class PiecesEndpoint(SimpleEndpoint):
    def rdma(self, transfer: Callable[..., PendingOperation], item: Transfer,
             descriptor: bytes) -> list[PendingOperation]:
        step = self.provider.getsockopt(self.socket, SO_MAX_RDMA_SIZE)
        whole = item.length - item.length % step if item.length > step else item.length  # the bug
        return [self.call(transfer, [(item.buffer.view(at, min(step, item.length - at)), item.handle)], descriptor, at)
                for at in range(0, whole, step)]


class PiecesConnection(SimpleConnection):
    endpoint = PiecesEndpoint


class PiecesSwitch(SimpleSwitch):
    connection = PiecesConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return PiecesSwitch(backend)
