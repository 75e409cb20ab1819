"""Access flags are masked to their two low bits instead of being checked: 7 or -1 register READWRITE.

Breaks R14: flags not in {1, 2, 3} are WSAEINVAL. Realistic: ``flags & (MEM_READ | MEM_WRITE)`` used to build the
verbs access mask, without first refusing the bits that mean nothing.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access
from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R14",)


def _masked(access: Any) -> Any:
    if type(access) in (int, Access) and access & 3:
        return Access(access & 3)
    return access


class AccessFlagsMasked(DelegatingProvider):
    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        return super().register_memory(socket, buffer, _masked(access))

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        return super().register_rdma_memory(socket, buffer, _masked(access), descriptor_size)


pytest_san_make_provider = provider_hook(AccessFlagsMasked)
