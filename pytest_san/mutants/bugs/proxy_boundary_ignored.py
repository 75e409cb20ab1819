"""``allocate_contiguous`` ignores ``boundary``: a block may cross a boundary multiple.

Breaks P4. Realistic: a contiguous allocator that honours the address range but treats the boundary (a DMA
engine's segment limit) as advice.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P4",)


class ProxyBoundaryIgnored(DelegatingProxy):
    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int, cache_type: Any) -> Any:
        return super().allocate_contiguous(nbytes, lowest, highest, 0, cache_type)


pytest_san_make_proxy = proxy_hook(ProxyBoundaryIgnored)
