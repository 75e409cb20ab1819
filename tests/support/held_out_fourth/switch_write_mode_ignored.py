"""The switch honours ``rdma_mode="read"`` but treats ``"write"`` as ``"auto"``.

The bug: the mode is checked as ``mode == "read" or (peer can read)``: asked for RdmaWrite between two providers
that both have RdmaRead, the switch still moves large transfers by RdmaRead (the receiver reads the sender's READ
descriptor) instead of having the receiver offer a WRITE descriptor for the sender to write into.

Realistic: a three-valued option tested as if it had two values.

Breaks R10 (a mode asked for is the mode used: RdmaWrite into the receiver's WRITE descriptor when "write" is
asked).
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R10",)


class AutoUnlessReadConnection(SimpleConnection):
    def reads(self, receiver: SimpleEndpoint) -> bool:
        return self.rdma_mode == "read" or receiver.provider.supports_rdma_read  # the bug: "write" is "auto"


class AutoUnlessReadSwitch(SimpleSwitch):
    connection = AutoUnlessReadConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return AutoUnlessReadSwitch(backend)
