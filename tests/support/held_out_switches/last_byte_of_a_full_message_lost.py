"""A byte lost at each message boundary.

The author copies a message into its send slot with room for a terminator it never writes: a message that fills
its slot loses its last byte. Records cut across messages then lose a byte at each cut, so a stream of more than a
message's worth does not arrive whole: R9 (every length arrives once and in order).
"""

from __future__ import annotations

import pytest

from pytest_san import Backend, PendingOperation
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R9",)


class LossyEndpoint(SimpleEndpoint):
    def send_message(self, index: int, message: bytes) -> PendingOperation:
        if len(message) == self.conn.message_size:
            message = message[:-1]  # the bug
        return super().send_message(index, message)


class LossyConnection(SimpleConnection):
    endpoint = LossyEndpoint


class LossySwitch(SimpleSwitch):
    connection = LossyConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return LossySwitch(backend)
