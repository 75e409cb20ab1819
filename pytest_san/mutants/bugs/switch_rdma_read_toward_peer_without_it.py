"""The switch always has the receiver RdmaRead a large transfer, even when the receiver's provider lacks RdmaRead.

Breaks R10 (when the peer lacks RdmaRead, large transfers use RdmaWrite into a descriptor the peer offers).
Realistic: a switch written against providers that all had RdmaRead, never reading ``supports_rdma_read``. To
show, the bug brings providers without RdmaRead (``pytest_san.mutants.legal.no_rdma_read``, a legal variant);
the switch is pytest-san's own, its ``rdma_mode="auto"`` made ``"read"``.
"""

from __future__ import annotations

from typing import Any

from ..legal.no_rdma_read import NoRdmaRead
from ..switching import SwitchWrapper, own_switch, switch_hook
from ..wrapping import provider_hook

BREAKS = ("R10",)


class ReadsAlways(SwitchWrapper):
    def adjust(self, options: dict[str, Any]) -> dict[str, Any]:
        if options.get("rdma_mode", "auto") == "auto":
            options["rdma_mode"] = "read"  # the bug
        return options


pytest_san_make_switch = switch_hook(lambda backend: ReadsAlways(own_switch(backend)))
pytest_san_make_provider = provider_hook(NoRdmaRead)
