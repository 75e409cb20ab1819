"""The receive region of an RdmaWrite registered READ-only when the peer writes into it.

When the receiver lacks RdmaRead (or ``rdma_mode="write"``), it offers the sender a descriptor to write the large
transfer into; the author registers it with ``Access.READ`` ("the application will read it"). The provider refuses
the peer's RdmaWrite into a READ descriptor (R6), so the transfer never arrives: R10 (the sender writes into a
WRITE descriptor the receiver sent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from pytest_san import Access, Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

R = TypeVar("R")

BREAKS = ("R6", "R10")


class ReadOnlySinkEndpoint(SimpleEndpoint):
    def call(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        if fn == self.provider.register_rdma_memory and args[1] is Access.WRITE:
            args = (args[0], Access.READ, *args[2:])  # the bug
        return super().call(fn, *args, **kwargs)


class ReadOnlySinkConnection(SimpleConnection):
    endpoint = ReadOnlySinkEndpoint


class ReadOnlySinkSwitch(SimpleSwitch):
    connection = ReadOnlySinkConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return ReadOnlySinkSwitch(backend)
