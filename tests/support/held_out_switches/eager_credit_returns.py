"""Legal: every message taken is reported back at once, with the threshold a quarter of the provider's.

Flow control is the switch's own business as long as no end sends more messages than the other posted receives
for (R9): this one returns its count after every message that completed a record, not after most of a ring, and, when no
threshold is asked, declares and uses a quarter of the provider's ``SO_RDMA_THRESHOLD_SIZE``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import Backend, PendingOperation, Process
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch
from pytest_san.examples.simple_switch.records import Kind


class EagerEndpoint(SimpleEndpoint):
    """(Adapted when the example switch's flush was split into ``flush`` and ``report_due``: the same policy.)"""

    records_unreported = False  # a record was taken since the last message we sent

    def handle(self, kind: Kind, body: bytes) -> None:
        super().handle(kind, body)
        self.records_unreported = True

    def report_due(self) -> bool:
        return self.records_unreported or super().report_due()  # at once, not after most of a ring

    def send_message(self, index: int, message: bytes) -> PendingOperation:
        self.records_unreported = False
        return super().send_message(index, message)


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
