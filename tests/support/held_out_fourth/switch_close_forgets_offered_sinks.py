"""At close the switch forgets the WRITE descriptors its end has offered for RdmaWrite and not yet seen used.

The bug: close deregisters the two message regions and every transfer's registration it tracks as a sender or
as a reader, but the list of sinks (WRITE descriptors this end sent the peer for a large transfer by RdmaWrite,
waiting for the peer's WRITE_DONE) is not in what it walks. Closed in the middle of such a transfer, the socket
is closed with those descriptors still registered; the provider releases them at the close, so nothing leaks.

Realistic: a teardown list that missed one of several queues added later (the RdmaWrite path is the one taken
only when the peer lacks RdmaRead, and the least tested).

Breaks R11 (before closing a socket the switch deregisters every region no pending operation uses).
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import Release, SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R11",)


class ForgetfulEndpoint(SimpleEndpoint):
    def releases(self) -> list[Release]:
        offered = {bytes(item.descriptor) for item in self.sinks if item.descriptor is not None}
        return [(release, key) for release, key in super().releases()
                if not (isinstance(key, bytes | bytearray) and bytes(key) in offered)]  # the bug


class ForgetfulConnection(SimpleConnection):
    endpoint = ForgetfulEndpoint


class ForgetfulSwitch(SimpleSwitch):
    connection = ForgetfulConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return ForgetfulSwitch(backend)
