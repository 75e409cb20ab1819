"""Legal: the proxy places a contiguous block as low in the range asked as it can, not from the top.

allocate_contiguous searches windows of the range growing from ``lowest`` (nbytes, then twice that, ...), asking
the wrapped proxy for the block in each until one has room; each attempt that finds none changes nothing. The
block keeps every constraint asked (alignment, [lowest, highest], the boundary, the cache type); only where in
the range it lies differs. Frees, adapters and pins are the wrapped proxy's.

Why the contract allows it: P4 says the block lies inside [lowest, highest], page aligned and within a boundary
multiple, or none when impossible; where inside the range is the proxy's choice (the seed's
MmAllocateContiguousMemorySpecifyCache says nothing of placement, and docs/mutation.md calls where pinned pages
lie "the proxy's choice").
"""

from __future__ import annotations

from pytest_san import CacheType
from pytest_san.mutants.wrapping import DelegatingProxy, proxy_hook


class LowestFirst(DelegatingProxy):
    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        if not all(type(value) is int for value in (nbytes, lowest, highest)) or nbytes <= 0 or lowest < 0 \
                or highest <= lowest:
            return self.inner.allocate_contiguous(nbytes, lowest, highest, boundary, cache_type)
        span = nbytes
        while True:
            top = min(highest, lowest + span - 1)
            base = self.inner.allocate_contiguous(nbytes, lowest, top, boundary, cache_type)
            if base is not None or top >= highest:
                return base
            span *= 2


pytest_san_make_proxy = proxy_hook(LowestFirst)
