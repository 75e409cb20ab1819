"""Legal: every message taken is reported back at once, with the threshold a quarter of the provider's.

Flow control is the switch's own business as long as no end sends more messages than the other posted receives
for (R9): this one returns its count after every message that carried data, not after half a ring, and, when no
threshold is asked, declares and uses a quarter of the provider's ``SO_RDMA_THRESHOLD_SIZE``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import Backend, Process
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch
from pytest_san.examples.simple_switch.records import COUNT_MODULO, HEADER


class EagerEndpoint(SimpleEndpoint):
    def flush(self) -> bool:
        moved = False
        count, room = self.conn.message_count, self.conn.message_size - HEADER.size
        for _ in range(count):
            unreported = (self.taken - self.reported) % COUNT_MODULO
            due = self.unreported_data >= 1 or unreported >= count - 1  # at once, not after half a ring
            if not (self.outgoing or due) or not self.free:
                break
            credits = count - (self.sent - self.peer_taken) % COUNT_MODULO
            if credits < 1 or (credits == 1 and not unreported):
                break
            chunk = bytes(self.outgoing[:room])
            del self.outgoing[:room]
            index = self.free.popleft()
            self.reported, self.unreported_data = self.taken, 0
            self.sent += 1
            self.sends[index] = self.send_message(index, HEADER.pack(self.taken % COUNT_MODULO) + chunk)
            moved = True
        return moved


class EagerConnection(SimpleConnection):
    endpoint = EagerEndpoint

    def __init__(self, switch: SimpleSwitch, a: Process, b: Process, *, rdma_threshold: int | None,
                 **options: Any) -> None:
        super().__init__(switch, a, b, rdma_threshold=rdma_threshold, **options)
        if rdma_threshold is None:
            self.rdma_threshold //= 4


class EagerSwitch(SimpleSwitch):
    connection = EagerConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return EagerSwitch(backend)
