"""A switch whose RDMA threshold is the one asked for rounded up to a whole 64 KiB, and says so.

Legal: the contract fixes what happens above and below the threshold (R10), not which threshold a switch uses;
the connection declares the one it uses (``SwitchConnection.rdma_threshold``) and the scenarios judge it by that.
Over pytest-san's own switch, through its ``rdma_threshold`` option.
"""

from __future__ import annotations

from typing import Any

from ..switching import SwitchWrapper, own_switch, switch_hook, usable

STEP = 64 << 10


class RoundedThreshold(SwitchWrapper):
    def adjust(self, options: dict[str, Any]) -> dict[str, Any]:
        asked = options.get("rdma_threshold")
        if asked is not None and usable(options, "rdma_threshold", 0, 1 << 62, none=True):
            options["rdma_threshold"] = -(-max(asked, 1) // STEP) * STEP
        return options


pytest_san_make_switch = switch_hook(lambda backend: RoundedThreshold(own_switch(backend)))
