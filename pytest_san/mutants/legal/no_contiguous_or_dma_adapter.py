"""A proxy on a platform with neither contiguous allocation nor DMA adapters.

The contract calls both optional where a platform has none: the proxy says so (``san_capabilities``) and refuses
the calls with WSAEOPNOTSUPP; their scenarios are skipped, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProxy, proxy_hook


class NoContiguousOrDmaAdapter(DelegatingProxy):
    @property
    def san_capabilities(self) -> Mapping[str, bool]:
        return {"contiguous": False, "dma_adapter": False}

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int, cache_type: Any) -> Any:
        raise SanError(WsaError.WSAEOPNOTSUPP, "no contiguous allocation on this platform")

    def free_contiguous(self, base: int, nbytes: int, cache_type: Any) -> None:
        raise SanError(WsaError.WSAEOPNOTSUPP, "no contiguous allocation on this platform")

    def get_dma_adapter(self, description: Any) -> Any:
        raise SanError(WsaError.WSAEOPNOTSUPP, "no DMA adapter on this platform")

    def put_dma_adapter(self, adapter: Any) -> None:
        raise SanError(WsaError.WSAEOPNOTSUPP, "no DMA adapter on this platform")


pytest_san_make_proxy = proxy_hook(NoContiguousOrDmaAdapter)
