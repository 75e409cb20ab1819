"""An RDMA registration keeps its window's length in 16 bits: a window of 64 KiB or more wraps.

Breaks R8: a window of exactly 64 KiB has length 0 (nothing in it is reachable), and one of 1 MiB + 1 bytes has
length 1, so the peer's transfers inside the registered range are rejected while the provider reports it
registered. Realistic: a descriptor or table laid out with a ``u16`` length beside a 32-bit key, sized for message
buffers and never for RDMA windows. Found by an outside set of planted bugs (issue 37), caught then under R10 only
(by the switch's large transfers): no R8 scenario registered a window that large.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook, widened

BREAKS = ("R8",)


class WindowLength16Bits(DelegatingProvider):
    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        length = getattr(buffer, "length", None)
        if type(length) is int and length >= 1 << 16:
            buffer = widened(buffer, 0, (length & 0xFFFF) - length)
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)


pytest_san_make_provider = provider_hook(WindowLength16Bits)
