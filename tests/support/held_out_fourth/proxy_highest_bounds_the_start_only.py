"""allocate_contiguous checks ``highest`` against the block's first byte, not its last.

The bug: the search for a contiguous run accepts a candidate whose *start* is at or below ``highest``; the block
may then end up to ``nbytes - 1`` bytes above it. Asked for memory below 4 GiB (``highest = 4 GiB - 1``) for a
32-bit device, the proxy may hand out a block that crosses the 4 GiB line.

Realistic: the limit compared with the wrong end of the candidate, an off-by-a-block that a first-fit search from
the bottom rarely shows and a search from the top shows at once.

Breaks P4 (the block must lie inside [lowest, highest]) and P3 (under NOLOWMEM the proxy must still give memory
below 4 GiB when asked for a contiguous block whose highest address is under 4 GiB: this one may end above).
"""

from __future__ import annotations

from pytest_san import CacheType
from pytest_san.mutants.wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P3", "P4")


class StartBelowHighest(DelegatingProxy):
    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        if type(nbytes) is int and type(highest) is int and nbytes > 0:
            highest = highest + nbytes - 1  # the bug: only the start must be <= highest
        return self.inner.allocate_contiguous(nbytes, lowest, highest, boundary, cache_type)


pytest_san_make_proxy = proxy_hook(StartBelowHighest)
