"""An RDMA window covers the whole pages its buffer touches; offsets are taken from the buffer's start.

Breaks R8: a peer reaches bytes before the registered range or past its end, within its first or last page.
Realistic: the window is bound to the page-aligned MR that was pinned, with the bounds of the MR, while the
descriptor still says the buffer's address and length.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, page_rounded, provider_hook

BREAKS = ("R8",)


class PageRoundedWindow(DelegatingProvider):
    """The initiator's side (another node's wrapper) shifts the offset by where the buffer starts in its page."""

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        rounded, shift = page_rounded(buffer)
        descriptor = super().register_rdma_memory(socket, rounded, access, descriptor_size)
        self.shared.extra.setdefault("shift", {})[bytes(descriptor)] = shift
        return descriptor

    def _offset(self, descriptor: Any, offset: Any) -> Any:
        shift = self.shared.extra.get("shift", {}).get(bytes(descriptor) if isinstance(descriptor, bytes) else None)
        return offset + shift if shift is not None and type(offset) is int else offset

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return super().rdma_write(socket, local_buffers, target_descriptor, self._offset(target_descriptor, offset))

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return super().rdma_read(socket, local_buffers, source_descriptor, self._offset(source_descriptor, offset))


pytest_san_make_provider = provider_hook(PageRoundedWindow)
