"""A legal provider setup with two kinds of node: the second node's provider lacks RdmaRead, the others keep it.

With the same provider on every node, ``"auto"`` cannot tell the receiving end's provider from the sending end's:
a switch that asks the wrong end passes. Over this plugin a connection from the first node to the second has a
sender with RdmaRead and a receiver without, so it must move by RdmaWrite (R10, ``test_switch.py``'s
``test_auto_mode_follows_the_peer_capability``). Scenarios that call RdmaRead on the second node are skipped, with
the reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import Descriptor, Node, PendingOperation, Provider, SanError, Socket, WsaError
from pytest_san.spi.protocols import LocalBuffers


class WithoutRdmaRead:
    """``inner`` without RdmaRead: the contract's WSAEOPNOTSUPP, everything else as ``inner`` answers."""

    supports_rdma_read = False

    def __init__(self, inner: Provider) -> None:
        self.inner = inner

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        raise SanError(WsaError.WSAEOPNOTSUPP, "this provider has no RDMA read")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


SECOND = "node1"
"""The emulator's second node (its nodes are node0, node1, node2): the peer of every default connect."""


def pytest_san_make_provider(config: pytest.Config, node: Node, provider: Provider) -> object | None:
    return WithoutRdmaRead(provider) if node.name == SECOND else None
