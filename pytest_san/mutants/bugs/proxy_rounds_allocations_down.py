"""The proxy rounds every allocation down to whole pages: it pins fewer bytes than it was asked for.

Breaks P2 (an allocation holds the bytes asked) and R12 (a registration's pin covers less than the registration:
its last, partial page is not pinned). Realistic: ``nbytes >> PAGE_SHIFT`` where ``(nbytes + PAGE_SIZE - 1) >>
PAGE_SHIFT`` was meant. Found by an outside set of planted bugs (issue 37), caught then under P2 only: the
scenarios counted pins, not their bytes.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import PAGE_SIZE
from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P2", "R12")


class ProxyRoundsAllocationsDown(DelegatingProxy):
    def allocate(self, nbytes: int) -> Any:
        if type(nbytes) is int and nbytes > PAGE_SIZE:
            nbytes -= nbytes % PAGE_SIZE
        return super().allocate(nbytes)


pytest_san_make_proxy = proxy_hook(ProxyRoundsAllocationsDown)
