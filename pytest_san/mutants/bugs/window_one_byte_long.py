"""An RDMA registration covers one byte more than the buffer: the window's length is off by one.

Breaks R8: a peer writes (or reads) the byte just past the registered range. Realistic: ``end = address + length``
used as an inclusive bound when the window's length is computed (``end - address + 1``).
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook, widened

BREAKS = ("R8",)


class WindowOneByteLong(DelegatingProvider):
    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        return super().register_rdma_memory(socket, widened(buffer, 0, 1), access, descriptor_size)


pytest_san_make_provider = provider_hook(WindowOneByteLong)
