"""``free_contiguous`` accepts any cache type: it frees with the one the block was allocated with.

Breaks P4: freeing needs the same base, size and cache type. Realistic: a free path that looks the block up by
base and never compares what the caller passed (MmFreeContiguousMemorySpecifyCache's contract).
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P4",)


class ProxyCacheTypeIgnored(DelegatingProxy):
    def _types(self) -> dict[int, Any]:
        types: dict[int, Any] = self.shared.extra.setdefault(("cache", self.node.name), {})
        return types

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int, cache_type: Any) -> Any:
        base = super().allocate_contiguous(nbytes, lowest, highest, boundary, cache_type)
        if base is not None:
            self._types()[base] = cache_type
        return base

    def free_contiguous(self, base: int, nbytes: int, cache_type: Any) -> None:
        super().free_contiguous(base, nbytes, self._types().get(base, cache_type))
        self._types().pop(base, None)


pytest_san_make_proxy = proxy_hook(ProxyCacheTypeIgnored)
