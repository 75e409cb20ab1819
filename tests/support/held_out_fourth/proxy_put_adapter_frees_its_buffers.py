"""put_dma_adapter with common buffers still allocated frees them and puts the adapter.

The bug: instead of refusing to put an adapter whose common buffers are not all freed, the proxy "cleans up":
it frees every common buffer the adapter still has and then puts it. The caller's buffers vanish under it (their
virtual and logical addresses may be handed out again), and the leak that the rule makes visible is hidden.

Realistic: a teardown helper reused for the normal put path; Windows' PutDmaAdapter documents that the driver
must free its common buffers first, and drivers that do it for the caller hide use-after-free bugs.

Breaks P5 (put_dma_adapter is allowed only once every common buffer is freed).
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P5",)


class TrackedAdapter:
    """The adapter the proxy hands out, with the common buffers it has allocated and not freed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.live: list[tuple[int, int, int, bool]] = []  # (length, logical, virtual, cache_enabled)

    @property
    def dma32(self) -> bool:
        return bool(self.inner.dma32)

    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        got: tuple[int, int] | None = self.inner.allocate_common_buffer(length, cache_enabled)
        if got is not None:
            virtual, logical = got
            self.live.append((length, logical, virtual, cache_enabled))
        return got

    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        self.inner.free_common_buffer(length, logical, virtual, cache_enabled)
        for entry in self.live:
            if entry == (length, logical, virtual, cache_enabled):
                self.live.remove(entry)
                break

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CleansUpOnPut(DelegatingProxy):
    def get_dma_adapter(self, description: Any) -> Any:
        return TrackedAdapter(self.inner.get_dma_adapter(description))

    def put_dma_adapter(self, adapter: Any) -> None:
        if isinstance(adapter, TrackedAdapter):
            for length, logical, virtual, cache_enabled in list(adapter.live):  # the bug: freed for the caller
                adapter.free_common_buffer(length, logical, virtual, cache_enabled)
            adapter = adapter.inner
        self.inner.put_dma_adapter(adapter)


pytest_san_make_proxy = proxy_hook(CleansUpOnPut)
