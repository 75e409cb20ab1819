"""``allocate_contiguous`` maps every block cached, whatever cache type it was asked for; it remembers the type
asked for, so that freeing with it still works.

Breaks P4: the block must be mapped with the cache type asked for (a NON_CACHED or WRITE_COMBINED buffer a device
writes to must not sit in the CPU's caches). Realistic: MmAllocateContiguousMemorySpecifyCache replaced by
MmAllocateContiguousMemory, whose blocks are always cached, with the cache type kept only for the free.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import CacheType
from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P4",)


class ProxyCacheTypeNotApplied(DelegatingProxy):
    def _asked(self) -> dict[int, Any]:
        asked: dict[int, Any] = self.shared.extra.setdefault(("cache asked", self.node.name), {})
        return asked

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int, cache_type: Any) -> Any:
        base = super().allocate_contiguous(nbytes, lowest, highest, boundary, CacheType.CACHED)
        if base is not None:
            self._asked()[base] = cache_type
        return base

    def free_contiguous(self, base: int, nbytes: int, cache_type: Any) -> None:
        asked = self._asked().get(base)
        super().free_contiguous(base, nbytes, CacheType.CACHED if asked is not None and cache_type == asked
                                else cache_type)
        if asked is not None and cache_type == asked:
            del self._asked()[base]


pytest_san_make_proxy = proxy_hook(ProxyCacheTypeNotApplied)
