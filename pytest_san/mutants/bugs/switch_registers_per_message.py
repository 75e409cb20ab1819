"""The switch registers each message's slot for its send and deregisters it once the send completed.

Breaks R9 (the send messages come from the one send region registered at connect; no registration per message).
Realistic: the simple way to send from a buffer, before anyone measured what a registration costs. Over
``pytest_san.examples.simple_switch``; between messages the socket holds its two regions only.
"""

from __future__ import annotations

from typing import Any

from ...examples.simple_switch import SimpleEndpoint
from ...protocols import PendingOperation
from ...types import Access
from ..switching import simple_switch_hook

BREAKS = ("R9",)


class PerMessage(SimpleEndpoint):
    def send_message(self, index: int, message: bytes) -> PendingOperation:
        buffer = self.slot(self.send_region, index).view(0, len(message))
        buffer.write(message)
        handle = self.call("register_memory", buffer, Access.READ)  # the bug
        op = self.call("send", [(buffer, handle)])
        self.__dict__.setdefault("per_message", []).append((op, handle))
        return op  # type: ignore[no-any-return]

    def progress(self) -> bool:
        moved = super().progress()
        pending: list[tuple[Any, Any]] = self.__dict__.get("per_message", [])
        for op, handle in [p for p in pending if p[0].done()]:
            pending.remove((op, handle))
            if not self.closed and not self.socket.closed:
                self.call("deregister_memory", handle)
        return moved


pytest_san_make_switch = simple_switch_hook(PerMessage)
