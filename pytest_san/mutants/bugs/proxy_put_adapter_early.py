"""``put_dma_adapter`` with common buffers still allocated frees them and puts the adapter.

Breaks P5: put_dma_adapter is only allowed after every common buffer was freed. Realistic: a "helpful" cleanup in
PutDmaAdapter that hides the caller's leak instead of refusing.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import proxy_hook
from ._adapters import Adapter, WrappingAdapters

BREAKS = ("P5",)


class ProxyPutAdapterEarly(WrappingAdapters):
    def put_dma_adapter(self, adapter: Any) -> None:
        if isinstance(adapter, Adapter):
            for logical, (length, virtual, cache_enabled) in list(adapter.buffers.items()):
                adapter.free_common_buffer(length, logical, virtual, cache_enabled)
        super().put_dma_adapter(adapter)


pytest_san_make_proxy = proxy_hook(ProxyPutAdapterEarly)
