"""RDMA write toward a peer that can read, RdmaRead toward one that cannot: ``"auto"`` decided by the wrong end.

The contract's ``"auto"`` is RdmaRead unless the *receiving* end's provider lacks it; the author asks the
sending end's provider instead. Between ends whose providers differ, a large transfer toward a receiver without
RdmaRead is offered for reading (it cannot), and one toward a receiver that has it goes by RdmaWrite: R10.
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R10",)


class SenderModeConnection(SimpleConnection):
    def reads(self, receiver: SimpleEndpoint) -> bool:
        if self.rdma_mode == "auto":
            return receiver.peer.provider.supports_rdma_read  # the bug: the sender's provider, not the receiver's
        return self.rdma_mode == "read"



class SenderModeSwitch(SimpleSwitch):
    connection = SenderModeConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return SenderModeSwitch(backend)
