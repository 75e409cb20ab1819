"""The switch moves transfers by RDMA from half its declared threshold: it says one threshold and uses another.

Breaks R10 (RDMA memory only for transfers above the threshold; smaller ones travel in messages). Realistic: a
threshold converted twice (bytes and KiB, or a "half a ring" rule applied on top of SO_RDMA_THRESHOLD_SIZE).
Over pytest-san's own switch: the connection is made with half the threshold and declares the whole.
"""

from __future__ import annotations

from typing import Any

from ...spi.protocols import Node, Process, SwitchConnection
from ...switch import Connection
from ..switching import ConnectionView, SwitchWrapper, own_switch, switch_hook

BREAKS = ("R10",)


class RdmaBelowThreshold(SwitchWrapper):
    def connect(self, peer: Node | Process | None = None, process: Node | Process | None = None,
                **options: Any) -> SwitchConnection:
        conn = super().connect(peer, process, **options)
        assert isinstance(conn, Connection)  # pytest-san's own (own_switch below)
        declared = conn.rdma_threshold
        conn.rdma_threshold = declared // 2  # the bug: pytest-san's connection keeps it so
        view = ConnectionView(conn, {"rdma_threshold": declared})
        self.connections[-1] = view
        return view


pytest_san_make_switch = switch_hook(lambda backend: RdmaBelowThreshold(own_switch(backend)))
