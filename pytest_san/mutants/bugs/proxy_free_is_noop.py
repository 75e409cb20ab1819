"""The proxy's ``free`` does nothing: pinned memory is never given back.

Breaks P2 (the proxy frees whenever asked), R12 (deregistrations do not unpin) and R11 (what a closed socket had
pinned stays pinned). Realistic: an unpin path that drops its MDL reference but never calls MmUnlockPages.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P2", "R11", "R12")


class ProxyFreeIsNoop(DelegatingProxy):
    def free(self, allocation: Any) -> None:
        pass


pytest_san_make_proxy = proxy_hook(ProxyFreeIsNoop)
