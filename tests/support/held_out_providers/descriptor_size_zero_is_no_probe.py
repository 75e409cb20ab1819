"""``descriptor_size=0`` is taken as "no size given": it registers, instead of answering the probe.

Breaks R14: every descriptor_size below the size needed, 0 included, is WSAEFAULT carrying that size. Realistic:
``if (lpdwDescriptorLength && *lpdwDescriptorLength < needed)`` written as ``if (*lpdwDescriptorLength && ...)``.
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook

BREAKS = ("R14",)


class DescriptorSizeZeroIsNoProbe(DelegatingProvider):
    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        if type(descriptor_size) is int and descriptor_size == 0:
            descriptor_size = None
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)


pytest_san_make_provider = provider_hook(DescriptorSizeZeroIsNoProbe)
