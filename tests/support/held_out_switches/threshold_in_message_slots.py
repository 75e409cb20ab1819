"""A threshold compared in the wrong unit: message slots, not bytes.

The author decides "by RDMA" by how many message slots a send would fill against how many the threshold fills
(``ceil(n / message_size) > threshold // message_size``). At a threshold that is a multiple of the message size
that is the same as ``n > threshold``; at any other it is not (a threshold of 1000 with 1 KiB slots sends even
1 byte by RDMA): R10 (exactly the sends above the threshold move by RDMA).
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R10",)


class SlotsEndpoint(SimpleEndpoint):
    def by_rdma(self, nbytes: int) -> bool:
        size = self.conn.message_size
        return -(-nbytes // size) > self.conn.rdma_threshold // size  # the bug


class SlotsConnection(SimpleConnection):
    endpoint = SlotsEndpoint


class SlotsSwitch(SimpleSwitch):
    connection = SlotsConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return SlotsSwitch(backend)
