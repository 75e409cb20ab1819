"""An RDMA registration asked WRITE is READWRITE (a peer reads it).

Breaks R7. Realistic: a window bound for RDMA write also gets REMOTE_READ, which verbs cannot do without.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access
from ..wrapping import DelegatingProvider, is_access, provider_hook

BREAKS = ("R7",)


class WriteDescriptorReadable(DelegatingProvider):
    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        if is_access(access, Access.WRITE):
            access = Access.READWRITE
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)


pytest_san_make_provider = provider_hook(WriteDescriptorReadable)
