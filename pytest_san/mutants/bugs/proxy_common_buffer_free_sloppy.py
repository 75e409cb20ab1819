"""``free_common_buffer`` frees the buffer at the logical address given, whatever length, virtual address and
caching the caller passed.

Breaks P5: freeing a common buffer needs exactly the values it was allocated with. Realistic: FreeCommonBuffer
implemented as a lookup by logical address alone, so a caller's wrong length frees someone else's pages.
"""

from __future__ import annotations

from ..wrapping import proxy_hook
from ._adapters import Adapter, WrappingAdapters

BREAKS = ("P5",)


class SloppyAdapter(Adapter):
    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        known = self.buffers.get(logical)
        if known is not None:
            length, virtual, cache_enabled = known
        super().free_common_buffer(length, logical, virtual, cache_enabled)


class ProxyCommonBufferFreeSloppy(WrappingAdapters):
    adapter = SloppyAdapter


pytest_san_make_proxy = proxy_hook(ProxyCommonBufferFreeSloppy)
