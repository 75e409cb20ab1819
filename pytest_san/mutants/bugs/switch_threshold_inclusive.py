"""The switch moves a transfer of exactly the threshold by RDMA (``>=`` where the contract says above).

Breaks R10 (RDMA only for transfers above the RDMA threshold). Realistic: the classic off-by-one at a boundary.
Over ``pytest_san.examples.simple_switch``.
"""

from __future__ import annotations

from ...examples.simple_switch import SimpleEndpoint
from ..switching import simple_switch_hook

BREAKS = ("R10",)


class Inclusive(SimpleEndpoint):
    def by_rdma(self, nbytes: int) -> bool:
        return nbytes >= self.conn.rdma_threshold  # the bug


pytest_san_make_switch = simple_switch_hook(Inclusive)
