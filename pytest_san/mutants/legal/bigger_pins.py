"""A proxy that pins in 64 KiB units: every allocation is at least as long as asked, often longer.

P2 asks for memory of the size requested; nothing forbids more (a large-page or slab allocator rounds up).
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProxy, proxy_hook

UNIT = 64 * 1024


class BiggerPins(DelegatingProxy):
    def allocate(self, nbytes: int) -> Any:
        if type(nbytes) is int and nbytes > 0:
            nbytes = -(-nbytes // UNIT) * UNIT
        return super().allocate(nbytes)


pytest_san_make_proxy = proxy_hook(BiggerPins)
