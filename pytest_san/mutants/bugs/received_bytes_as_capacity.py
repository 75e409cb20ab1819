"""A receive's completion reports the bytes its buffers could hold, not the bytes of the message received.

Breaks R9: a switch posts receives on equal slots of its one receive region and reads each message's length
from the completion; every message then looks a slot long. Realistic: the completion's length copied from the
posted work request (its scatter list's total) instead of from the completion queue entry. Found by an outside
set of planted bugs (issue 37), caught then under R14 only.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Completion, Status
from ..wrapping import DelegatingProvider, Recoded, entries, provider_hook

BREAKS = ("R9",)


class ReceivedBytesAsCapacity(DelegatingProvider):
    def recv(self, socket: Any, buffers: Any) -> Any:
        capacity = sum(int(getattr(buffer, "length", 0)) for buffer, _ in entries(buffers))

        def whole(done: Completion) -> Completion:
            return Completion(Status.SUCCESS, capacity) if done.status is Status.SUCCESS else done

        return Recoded(super().recv(socket, buffers), whole)


pytest_san_make_provider = provider_hook(ReceivedBytesAsCapacity)
