"""A threshold asked for is not the one used: the provider's always, and the connection says so.

The author reads ``SO_RDMA_THRESHOLD_SIZE`` on every connect and drops ``connect(rdma_threshold=...)``, declaring
the provider's threshold on the connection and keeping to it. The contract says a threshold asked for is the one
used (CONTRACT section 5, docs/switches.md): an application that asks for RDMA above 4 KiB gets it above the
provider's: R10.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import Backend, Process
from pytest_san.examples.simple_switch import SimpleConnection, SimpleSwitch

BREAKS = ("R10",)


class OwnThresholdConnection(SimpleConnection):
    def __init__(self, switch: SimpleSwitch, a: Process, b: Process, *, rdma_threshold: int | None,
                 **options: Any) -> None:
        super().__init__(switch, a, b, rdma_threshold=None, **options)  # the bug


class OwnThresholdSwitch(SimpleSwitch):
    connection = OwnThresholdConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return OwnThresholdSwitch(backend)
