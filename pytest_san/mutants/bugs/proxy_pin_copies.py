"""``pin`` copies the user's buffer into memory of the proxy's own and hands out that copy's pages.

Breaks P1: DO_DIRECT_IO means the switch and the NIC work on the requester's own pages, never on a copy; and P2:
the copy outlives the process whose buffer it copied.
Realistic: a driver ported from METHOD_BUFFERED that kept its bounce buffer behind a direct-I/O flag.
"""

from __future__ import annotations

from typing import Any

from ...spi.protocols import Buffer
from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P1", "P2")


class ProxyPinCopies(DelegatingProxy):
    def pin(self, buffer: Buffer) -> Any:
        return self.inner.allocate(buffer.length)


pytest_san_make_proxy = proxy_hook(ProxyPinCopies)
