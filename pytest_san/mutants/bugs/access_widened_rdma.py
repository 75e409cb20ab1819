"""Every RDMA registration is READWRITE, whatever access the caller asked for.

Breaks R6 and R7: a peer writes read-only memory and reads write-only memory. Realistic: a provider that binds
every memory window with REMOTE_READ | REMOTE_WRITE because one access mask is simpler to keep (the shipped
``pytest_san.examples.broken_provider`` is this bug).
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access
from ..wrapping import DelegatingProvider, is_access, provider_hook

BREAKS = ("R6", "R7")


class AccessWidened(DelegatingProvider):
    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        if is_access(access, Access.READ) or is_access(access, Access.WRITE):
            access = Access.READWRITE
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)


pytest_san_make_provider = provider_hook(AccessWidened)
