"""The switch registers one READWRITE region per socket and carves both message rings out of it.

Breaks R9 (two regions per connected socket: one for send message buffers, one for posted receive buffers).
Realistic: one registration is cheaper than two, and nothing the switch itself does goes wrong. Over
``pytest_san.examples.simple_switch``.
"""

from __future__ import annotations

from ...examples.simple_switch import Release, SimpleEndpoint
from ...spi.contract import Access
from ..switching import simple_switch_hook

BREAKS = ("R9",)


class OneRegion(SimpleEndpoint):
    def build(self) -> None:
        ring = self.conn.message_count * self.conn.message_size
        both = self.process.alloc(2 * ring)
        self.send_region, self.recv_region = both.view(0, ring), both.view(ring, ring)
        handle = self.call(self.provider.register_memory, both, Access.READWRITE)  # the bug
        self.handles += [handle, handle]
        for slot in range(self.conn.message_count):
            self.post_receive(slot)

    def releases(self) -> list[Release]:
        """The one region is deregistered once, when neither ring is busy."""
        found = super().releases()
        if not self.handles:
            return found
        mine: Release = (self.provider.deregister_memory, self.handles[0])
        return [r for r in found if r != mine] + ([mine] if found.count(mine) == 2 else [])


pytest_san_make_switch = simple_switch_hook(OneRegion)
