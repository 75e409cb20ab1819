"""The RdmaRead source registered READWRITE: the sender's application memory exposed to the peer's writes.

The author registers the large send's source with ``Access.READWRITE`` ("the peer uses it"). The transfer still
moves by RdmaRead and arrives whole, but while it is offered the peer may also RdmaWrite into the sender's
memory. R10: a large transfer is an RdmaRead from the sender's *READ* descriptor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from pytest_san import Access, Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

R = TypeVar("R")

BREAKS = ("R10",)


class ExposingEndpoint(SimpleEndpoint):
    def call(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        if fn == self.provider.register_rdma_memory and args[1] is Access.READ:
            args = (args[0], Access.READWRITE, *args[2:])  # the bug
        return super().call(fn, *args, **kwargs)


class ExposingConnection(SimpleConnection):
    endpoint = ExposingEndpoint


class ExposingSwitch(SimpleSwitch):
    connection = ExposingConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return ExposingSwitch(backend)
