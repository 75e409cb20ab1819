"""The Windows Sockets switch, backend-neutral: it only talks to the Provider protocol."""

from __future__ import annotations

from typing import Any

from ..errors import SanError, WsaError
from ..protocols import Backend, Node, Process
from ..types import SO_RDMA_THRESHOLD_SIZE
from .connection import Connection

RDMA_MODES = ("auto", "read", "write")


class Switch:
    """Opens connected SAN sockets, registers their message memory, moves data, tears down."""

    def __init__(self, backend: Backend, *, message_size: int = 4096, message_count: int = 8,
                 rdma_threshold: int | None = None, rdma_mode: str = "auto") -> None:
        if rdma_mode not in RDMA_MODES:
            raise ValueError(f"rdma_mode must be one of {RDMA_MODES}, got {rdma_mode!r}")
        self.backend = backend
        self.message_size = message_size
        self.message_count = message_count
        self.rdma_threshold = rdma_threshold
        self.rdma_mode = rdma_mode
        self.connections: list[Connection] = []

    def _process(self, where: Node | Process | None, default: int) -> Process:
        if where is None:
            nodes = self.backend.nodes
            return nodes[min(default, len(nodes) - 1)].default_process
        if isinstance(where, Node):
            return where.default_process
        return where

    def connect(self, peer: Node | Process | None = None, process: Node | Process | None = None,
                **options: Any) -> Connection:
        """A connected socket pair between ``process`` (default: first node) and ``peer`` (second)."""
        a = self._process(process, 0)
        b = self._process(peer, 1)
        sa, sb = self.backend.connect_sockets(a, b)
        threshold = options.pop("rdma_threshold", self.rdma_threshold)
        if threshold is None:
            threshold = a.node.provider.getsockopt(sa, SO_RDMA_THRESHOLD_SIZE)
        conn = Connection(
            self, (sa, a), (sb, b),
            rdma_threshold=threshold,
            rdma_mode=options.pop("rdma_mode", self.rdma_mode),
            message_size=options.pop("message_size", self.message_size),
            message_count=options.pop("message_count", self.message_count),
        )
        if options:
            raise TypeError(f"unknown connect() options: {', '.join(sorted(options))}")
        self.connections.append(conn)
        return conn

    def close_all(self) -> None:
        """Close every connection this switch made (both ends); safe to call twice."""
        errors: list[str] = []
        for conn in self.connections:
            for end in (conn.local, conn.remote):
                try:
                    end.close()
                except SanError as exc:
                    if exc.code is not WsaError.WSAENOTSOCK:
                        errors.append(f"{end.name} of {conn.local.socket!r}: {exc}")
        self.connections.clear()
        if errors:
            raise SanError(WsaError.WSAEINVAL, "closing left errors: " + "; ".join(errors))
