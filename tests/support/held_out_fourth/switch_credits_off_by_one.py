"""The switch's sender counts one credit too many: it may send one message more than the peer has receives for.

The bug: in flow control the sender computes the peer's free receives as ``message_count + 1 - outstanding``,
counting the receive the peer will post again once it takes the message in flight (which it has not posted
yet). When the peer is slow to take its messages the sender posts a send with no receive behind it: the
provider holds it (RNR retry) where it can, and on iWARP it breaks the connection.

Realistic: an off-by-one in credit accounting, "the slot being consumed will come back", the classic way
message-based protocols overrun a receive ring.

Breaks R9 (a message goes only into a receive the peer posted for it: no end sends more messages than the other
has posted receives for).
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch
from pytest_san.examples.simple_switch.records import COUNT_MODULO, HEADER

BREAKS = ("R9",)


class GenerousEndpoint(SimpleEndpoint):
    def flush(self) -> None:
        """The example switch's flow control, with the bug in ``credits``."""
        room = self.conn.message_size - HEADER.size
        while self.free and (self.outgoing or self.report_due()):
            credits = self.conn.message_count + 1 - (self.sent - self.peer_taken) % COUNT_MODULO  # the bug
            if credits < 1 or (credits == 1 and self.taken == self.reported):
                return
            chunk = bytes(self.outgoing[:room])
            del self.outgoing[:room]
            index = self.free.popleft()
            self.reported = self.taken
            self.sent += 1
            self.sends[index] = self.send_message(index, HEADER.pack(self.taken % COUNT_MODULO) + chunk)


class GenerousConnection(SimpleConnection):
    endpoint = GenerousEndpoint


class GenerousSwitch(SimpleSwitch):
    connection = GenerousConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return GenerousSwitch(backend)
