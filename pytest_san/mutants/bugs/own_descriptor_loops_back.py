"""RDMA through a descriptor of the caller's own socket is served locally, as a memory copy.

Breaks R2: only the connected peer may use a descriptor, not the socket that registered it. Realistic: a
"loopback shortcut" that turns RDMA to one's own memory into memcpy without asking whether the caller may.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import Registered, provider_hook
from ._software import SoftwareRdma

BREAKS = ("R2",)


class OwnDescriptorLoopsBack(SoftwareRdma):
    def serves(self, socket: Any, target: Registered) -> bool:
        return target.socket is socket


pytest_san_make_provider = provider_hook(OwnDescriptorLoopsBack)
