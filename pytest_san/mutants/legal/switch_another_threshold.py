"""A switch whose own RDMA threshold is 64 KiB, not the provider's SO_RDMA_THRESHOLD_SIZE, and says so.

Legal: the contract fixes what happens above and below the threshold (R10); a threshold asked for on connect is
the one used, but without one the switch may use its own, and the connection declares it
(``SwitchConnection.rdma_threshold``): the scenarios judge it by that. Over pytest-san's own switch, through its
``rdma_threshold`` option.
"""

from __future__ import annotations

from typing import Any

from ..switching import SwitchWrapper, own_switch, switch_hook

OWN = 64 << 10


class OwnThreshold(SwitchWrapper):
    def adjust(self, options: dict[str, Any]) -> dict[str, Any]:
        if options.get("rdma_threshold") is None:
            options["rdma_threshold"] = OWN
        return options


pytest_san_make_switch = switch_hook(lambda backend: OwnThreshold(own_switch(backend)))
