"""A register_memory handle asked READ is READWRITE (a receive or an RdmaRead lands in it).

Breaks R6. Realistic: verbs MRs for local use are registered with LOCAL_WRITE whatever the caller asked,
and the provider forgot to keep the READ limit in its own table.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access
from ..wrapping import DelegatingProvider, is_access, provider_hook

BREAKS = ("R6",)


class ReadHandleWritable(DelegatingProvider):
    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        if is_access(access, Access.READ):
            access = Access.READWRITE
        return super().register_memory(socket, buffer, access)


pytest_san_make_provider = provider_hook(ReadHandleWritable)
