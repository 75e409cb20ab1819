"""An RDMA registration asked READ is READWRITE (a peer writes it).

Breaks R6. Realistic: the access mask is built from the *remote* flags the NIC needs, and READ was mapped to both bits.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access
from ..wrapping import DelegatingProvider, is_access, provider_hook

BREAKS = ("R6",)


class ReadDescriptorWritable(DelegatingProvider):
    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        if is_access(access, Access.READ):
            access = Access.READWRITE
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)


pytest_san_make_provider = provider_hook(ReadDescriptorWritable)
