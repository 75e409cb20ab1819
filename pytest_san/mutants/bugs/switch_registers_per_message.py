"""The switch registers each message's slot for its send and deregisters it once the send completed.

Breaks R9 (the send messages come from the one send region registered at connect; no registration per message).
Realistic: the simple way to send from a buffer, before anyone measured what a registration costs. Over
``pytest_san.examples.simple_switch``; between messages the socket holds its two regions only.
"""

from __future__ import annotations

from typing import Any

from ...examples.simple_switch import SimpleEndpoint
from ...spi.contract import Access
from ...spi.protocols import PendingOperation
from ..switching import simple_switch_hook

BREAKS = ("R9",)


class PerMessage(SimpleEndpoint):
    def send_message(self, index: int, message: bytes) -> PendingOperation:
        buffer = self.slot(self.send_region, index).view(0, len(message))
        buffer.write(message)
        handle = self.call(self.provider.register_memory, buffer, Access.READ)  # the bug
        op: PendingOperation = self.call(self.provider.send, [(buffer, handle)])
        self.__dict__.setdefault("per_message", []).append((op, handle))
        return op

    def step(self) -> None:
        """Each message's registration goes once its send is done and no other send in flight uses the same
        handle (a provider may hand out one handle, counted, for the same slot registered again)."""
        super().step()
        pending: list[tuple[PendingOperation, Any]] = self.__dict__.get("per_message", [])
        done = [(op, handle) for op, handle in pending if op.done()]
        busy = {handle for op, handle in pending if not op.done()}
        for op, handle in done:
            if handle not in busy and not self.closed and not self.socket.closed:
                pending.remove((op, handle))
                self.call(self.provider.deregister_memory, handle)


pytest_san_make_switch = simple_switch_hook(PerMessage)
