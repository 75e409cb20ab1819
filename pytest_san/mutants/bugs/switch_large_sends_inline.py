"""The switch never uses RDMA: a transfer of any size travels in messages.

Breaks R10 (transfers above the threshold move by RdmaRead, or RdmaWrite when the peer lacks RdmaRead). Every
byte still arrives, only slower and through the rings. Realistic: a switch whose RDMA path was switched off
while it was debugged and never switched on again. Over ``pytest_san.examples.simple_switch``.
"""

from __future__ import annotations

from ...examples.simple_switch import SimpleEndpoint
from ..switching import simple_switch_hook

BREAKS = ("R10",)


class Inline(SimpleEndpoint):
    def by_rdma(self, nbytes: int) -> bool:
        return False  # the bug


pytest_san_make_switch = simple_switch_hook(Inline)
