"""free_contiguous frees the block at ``base`` with the size and cache type it was allocated with, whatever the
caller says.

The bug: the proxy keeps a table of its contiguous blocks by base address and, on free, looks the block up by its
base and frees it as recorded, ignoring the size and cache type passed in. A free that names the right base with
another size, or another cache type, is accepted (and frees the whole block), where the seed's
MmFreeContiguousMemorySpecifyCache requires the same base, size and cache type as the allocation.

Realistic: "we know better than the caller" bookkeeping, which hides callers' mismatched frees, exactly what the
rule is there to catch (freeing with the wrong cache type leaves the mapping's attributes inconsistent).

Breaks P4 (freeing needs the same base, size and cache type).
"""

from __future__ import annotations

from pytest_san import CacheType
from pytest_san.mutants.wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P4",)
CACHE_TYPES = (0, 1, 2)


class TrustsItsBooks(DelegatingProxy):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.blocks: dict[int, tuple[int, CacheType]] = {}

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        base = self.inner.allocate_contiguous(nbytes, lowest, highest, boundary, cache_type)
        if type(base) is int:
            self.blocks[base] = (nbytes, cache_type)
        return base

    def free_contiguous(self, base: int, nbytes: int, cache_type: CacheType) -> None:
        recorded = self.blocks.get(base) if type(base) is int else None
        if recorded is not None and type(nbytes) is int and type(cache_type) in (int, CacheType) \
                and cache_type in CACHE_TYPES:
            nbytes, cache_type = recorded  # the bug: the caller's size and cache type are not compared
        self.inner.free_contiguous(base, nbytes, cache_type)
        if recorded is not None:
            del self.blocks[base]


pytest_san_make_proxy = proxy_hook(TrustsItsBooks)
