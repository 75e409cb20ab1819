"""A second close asks the provider again.

The author's ``close`` has no note that it already ran: a second call deregisters the same regions again and
closes the socket again (the provider refuses both, WSAENOTSOCK). R11: "a second close asks nothing".
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch

BREAKS = ("R11",)


class ForgetfulEndpoint(SimpleEndpoint):
    def close(self) -> None:
        self.closed = True  # set, but never looked at (the bug)
        if not self.process.alive:
            return
        for release, key in self.releases():
            self.call(release, key)
        self.call(self.provider.close_socket)


class ForgetfulConnection(SimpleConnection):
    endpoint = ForgetfulEndpoint


class ForgetfulSwitch(SimpleSwitch):
    connection = ForgetfulConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return ForgetfulSwitch(backend)
