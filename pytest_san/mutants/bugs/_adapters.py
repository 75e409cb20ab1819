"""A proxy whose DMA adapters are wrapped, for the bugs in common buffers and adapters."""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProxy


class Adapter:
    """Forwards the DmaAdapter protocol to ``inner`` and remembers the common buffers it handed out."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.buffers: dict[int, tuple[int, int, bool]] = {}  # logical -> (length, virtual, cache_enabled)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def dma32(self) -> bool:
        return bool(self.inner.dma32)

    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> Any:
        got = self.inner.allocate_common_buffer(length, cache_enabled)
        if got is not None:
            self.buffers[got[1]] = (length, got[0], cache_enabled)
        return got

    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        self.inner.free_common_buffer(length, logical, virtual, cache_enabled)
        self.buffers.pop(logical, None)


class WrappingAdapters(DelegatingProxy):
    adapter = Adapter

    def get_dma_adapter(self, description: Any) -> Any:
        return self.adapter(super().get_dma_adapter(description))

    def put_dma_adapter(self, adapter: Any) -> None:
        super().put_dma_adapter(adapter.inner if isinstance(adapter, Adapter) else adapter)
