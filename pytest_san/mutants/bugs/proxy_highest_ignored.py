"""``allocate_contiguous`` ignores ``highest``: a block may end above the address the caller allowed.

Breaks P4 (inside [lowest, highest]) and P3 (low memory for a 32-bit device under NOLOWMEM). Realistic: the
highest acceptable address passed to the allocator as a size, or dropped when the call was ported.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P3", "P4")


class ProxyHighestIgnored(DelegatingProxy):
    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int, cache_type: Any) -> Any:
        return super().allocate_contiguous(nbytes, lowest, (1 << 52) - 1, boundary, cache_type)


pytest_san_make_proxy = proxy_hook(ProxyHighestIgnored)
