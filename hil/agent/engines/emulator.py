"""The ``emulator`` engine: pytest_san's in-process emulator, run inside the agent.

It exercises the whole remote path (SSH, the agent, the protocol) on any machine. Its nodes are
the emulator's nodes; connections stay inside this one agent.
"""

from __future__ import annotations

import types
from typing import Any

from pytest_san.spi.burst import WindowedBurst
from pytest_san.spi.contract import is_int
from pytest_san.spi.emulator import (
    EmulatedNode,
    EmulatedOperation,
    EmulatedProcess,
    EmulatedProvider,
    EmulatedProxy,
    EmulatedSocket,
    EmulatorBackend,
)
from pytest_san.spi.emulator.proxy import EmulatedAllocation, EmulatedDmaAdapter, EmulatedPin


class EmulatorEngine:
    name = "emulator"

    def __init__(self, host: str, node_count: int = 3) -> None:
        self.host = host
        self.backend = EmulatorBackend(node_count)
        self.faults = self.backend.faults

    def hello(self) -> dict[str, Any]:
        return {"engine": self.name, "capabilities": sorted(self.backend.capabilities),
                "nodes": [{"name": f"{self.host}/{n.name}", "node": n, "provider": n.provider, "proxy": n.proxy}
                          for n in self.backend.nodes]}

    def connect_local(self, a: EmulatedProcess, b: EmulatedProcess) -> list[EmulatedSocket]:
        return list(self.backend.connect_sockets(a, b))

    def socket_listen(self, process: Any, *where: Any) -> Any:
        raise ValueError("the emulator engine connects only processes of one agent: use san_loopback")

    socket_connect = peer_closed = socket_listen

    @staticmethod
    def socket_state(sock: EmulatedSocket) -> list[bool]:
        return [sock.connected, sock.closed]

    def leaks(self) -> list[list[str]]:
        return [[leak.node, leak.kind, leak.detail] for leak in self.backend.leaks()]

    def reset(self) -> None:
        self.backend.reset()

    def close(self) -> None:
        self.backend.close()

    def pinned(self) -> list[Any]:
        return [self, *[x for n in self.backend.nodes for x in (n, n.provider, n.proxy)]]

    @staticmethod
    def resolve_buffer(process: EmulatedProcess, address: object, length: object) -> Any:
        if is_int(address) and is_int(length):
            return process.buffer_at(address, length)
        # A duck-typed buffer with odd fields: the provider judges it as in-process (whose process, then range).
        return types.SimpleNamespace(process=process, address=address, length=length)


def kind_of(obj: Any) -> str:
    for cls, kind in _KINDS:
        if isinstance(obj, cls):
            return kind
    if hasattr(obj, "register_memory"):
        return "provider"  # a wrapped provider
    return type(obj).__name__


_KINDS: list[tuple[type, str]] = [
    (EmulatorEngine, "engine"), (EmulatedNode, "node"), (EmulatedProcess, "process"),
    (EmulatedProvider, "provider"), (EmulatedProxy, "proxy"), (EmulatedSocket, "socket"),
    (EmulatedOperation, "operation"), (WindowedBurst, "operation"), (EmulatedAllocation, "allocation"),
    (EmulatedPin, "allocation"), (EmulatedDmaAdapter, "adapter"),
]
