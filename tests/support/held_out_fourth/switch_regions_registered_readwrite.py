"""The switch registers both message regions READWRITE: legal (reclassified after the measurement, below).

Written as a bug: the example switch's two regions, registered READ (the send ring, which the provider only reads)
and WRITE (the receive ring, which it only writes), are both registered READWRITE "to keep it simple" (one access
for every region, as some switches do to reuse a region for either direction later). Messages move exactly as
before.

Why it is legal: R9 asks for two regions per connected socket, one for the messages sent and one for the receives
posted, and names no access (CONTRACT.md R9; the seed's "Usando memória registrada" neither). A region registered
with register_memory is reachable by the registering process alone (R1), which owns the memory anyway: READWRITE
exposes nothing to anyone else. docs/switches.md's "one the provider reads and one it writes" is what the
scenarios check, and READWRITE regions are both. The author's guess that it breaks R9 was the one the measurement
did not bear out; the suite passes it, as it must pass a legal switch.
"""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend
from pytest_san.examples.simple_switch import SimpleConnection, SimpleEndpoint, SimpleSwitch


class ReadWriteEndpoint(SimpleEndpoint):
    def build(self) -> None:
        ring = self.conn.message_count * self.conn.message_size
        self.send_region = self.process.alloc(ring)
        self.recv_region = self.process.alloc(ring)
        self.handles.append(self.call(self.provider.register_memory, self.send_region, Access.READWRITE))
        self.handles.append(self.call(self.provider.register_memory, self.recv_region, Access.READWRITE))
        for slot in range(self.conn.message_count):
            self.post_receive(slot)


class ReadWriteConnection(SimpleConnection):
    endpoint = ReadWriteEndpoint


class ReadWriteSwitch(SimpleSwitch):
    connection = ReadWriteConnection


def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> SimpleSwitch:
    return ReadWriteSwitch(backend)
