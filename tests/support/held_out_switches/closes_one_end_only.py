"""Closing a connection closes one end only.

``SwitchConnection.close`` is "close both ends"; the author closes the local end and leaves the remote one to the
peer application, which in the suite never comes. The remote socket keeps its two regions registered after the
connection was closed (until the switch's ``close_all`` at the end of the test): R11 (closing releases
everything).
"""

from __future__ import annotations

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleSwitch

BREAKS = ("R11",)


class OneEndConnection(SimpleConnection):
    def close(self) -> None:
        self.local.close()  # the bug: the remote end stays open


class OneEndSwitch(SimpleSwitch):
    connection = OneEndConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return OneEndSwitch(backend)
