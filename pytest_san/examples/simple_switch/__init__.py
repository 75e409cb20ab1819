"""A second Windows Sockets switch, written over the ``Provider`` protocol alone, plugged in as the switch under
test (``pytest_san_make_switch``)::

    pytest --pyargs pytest_san.scenarios -p pytest_san.examples.simple_switch

It shares no code with ``pytest_san.switch`` and is built differently: each direction is one byte stream of
records cut into messages anywhere (``records``), flow control returns a running count of messages taken in
every header instead of credit deltas, and its defaults are another ring (16 messages of 1 KiB). It keeps R9,
R10 and R11 as the contract states them, so the switch scenarios pass it unchanged.
"""

from __future__ import annotations

import pytest

from pytest_san import Backend

from .endpoint import Release, SimpleEndpoint, Transfer
from .switch import SimpleConnection, SimpleSwitch


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return SimpleSwitch(backend)


__all__ = ["Release", "SimpleConnection", "SimpleEndpoint", "SimpleSwitch", "Transfer", "pytest_san_make_switch"]
