"""The switch's two regions overlap by one message slot: its last send slot is its first receive slot.

Breaks R9 (two virtually contiguous regions, one per direction: here they share memory). Realistic: an
off-by-one in carving one allocation into two rings. Over ``pytest_san.examples.simple_switch``.
"""

from __future__ import annotations

from ...examples.simple_switch import SimpleEndpoint
from ...spi.contract import Access
from ..switching import simple_switch_hook

BREAKS = ("R9",)


class OverlappingRings(SimpleEndpoint):
    def build(self) -> None:
        size, count = self.conn.message_size, self.conn.message_count
        both = self.process.alloc((2 * count - 1) * size)
        self.send_region = both.view(0, count * size)
        self.recv_region = both.view((count - 1) * size, count * size)  # the bug: one slot too early
        self.handles.append(self.call(self.provider.register_memory, self.send_region, Access.READ))
        self.handles.append(self.call(self.provider.register_memory, self.recv_region, Access.WRITE))
        for slot in range(count):
            self.post_receive(slot)


pytest_san_make_switch = simple_switch_hook(OverlappingRings)
