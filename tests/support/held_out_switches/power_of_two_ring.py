"""Legal: the ring rounded up to a power of two slots of a power of two bytes, and declared as such.

The contract lets a switch choose its ring (``message_size``, ``message_count``) as long as the connection
declares what it uses: this one rounds both up (3 slots of 100 bytes become 4 of 128), a common choice for
index arithmetic by masking.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import Backend
from pytest_san.examples.simple_switch import SimpleSwitch


def _up(value: int) -> int:
    return 1 << (value - 1).bit_length()


class PowerOfTwoSwitch(SimpleSwitch):
    def options(self, given: dict[str, Any]) -> dict[str, Any]:
        chosen = super().options(given)
        return {**chosen, "message_size": _up(chosen["message_size"]), "message_count": _up(chosen["message_count"])}


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return PowerOfTwoSwitch(backend, message_size=512, message_count=5)
