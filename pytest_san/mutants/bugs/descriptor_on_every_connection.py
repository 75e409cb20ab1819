"""A descriptor works from every connection: the provider checks the key, not the connection it came on.

Breaks R2 (another connection, another process, a third host use the descriptor), R5 (a neighbour process of the
owner reaches its memory) and R4 (a dropped link does not stop it). Realistic: a type-1 memory window or a plain
MR rkey, which any QP of the protection domain -- or a provider-wide key table -- accepts.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import Registered, provider_hook
from ._software import SoftwareRdma

BREAKS = ("R2", "R4", "R5")


class DescriptorOnEveryConnection(SoftwareRdma):
    def serves(self, socket: Any, target: Registered) -> bool:
        return True


pytest_san_make_provider = provider_hook(DescriptorOnEveryConnection)
