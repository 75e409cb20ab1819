"""register_rdma_memory ignores ``descriptor_size``: too small a buffer gets a registration, not the probe.

Breaks R14: the descriptor-too-small probe is WSAEFAULT carrying the size needed, and registers nothing.
Realistic: providers with a fixed descriptor size that never look at the caller's buffer length.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R14",)


class DescriptorSizeIgnored(DelegatingProvider):
    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        return super().register_rdma_memory(socket, buffer, access, None)


pytest_san_make_provider = provider_hook(DescriptorSizeIgnored)
