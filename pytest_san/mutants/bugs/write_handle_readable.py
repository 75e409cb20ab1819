"""A register_memory handle asked WRITE is READWRITE (a send or an RdmaWrite reads it).

Breaks R7. Realistic: verbs cannot forbid local reads of an MR, so the provider must refuse them in software:
this one forgot.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access
from ..wrapping import DelegatingProvider, is_access, provider_hook

BREAKS = ("R7",)


class WriteHandleReadable(DelegatingProvider):
    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        if is_access(access, Access.WRITE):
            access = Access.READWRITE
        return super().register_memory(socket, buffer, access)


pytest_san_make_provider = provider_hook(WriteHandleReadable)
