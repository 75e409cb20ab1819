"""The switch registers a third region per connected socket: a small control block beside its two message rings.

Breaks R9 (exactly two regions per connected socket). Realistic: a switch that keeps its flow-control counters
or connection state in registered memory of their own instead of in the message rings. Over pytest-san's own
switch; the provider releases the block when the socket closes.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access
from ...spi.protocols import Node, Process, SwitchConnection
from ..switching import SwitchWrapper, own_switch, switch_hook, traced

BREAKS = ("R9",)


class ThirdRegion(SwitchWrapper):
    def connect(self, peer: Node | Process | None = None, process: Node | Process | None = None,
                **options: Any) -> SwitchConnection:
        conn = super().connect(peer, process, **options)
        for end in (conn.local, conn.remote):
            block = end.process.alloc(64)
            traced(end, conn, "register_memory")
            end.provider.register_memory(end.socket, block, Access.READWRITE)  # the bug
        return conn


pytest_san_make_switch = switch_hook(lambda backend: ThirdRegion(own_switch(backend)))
