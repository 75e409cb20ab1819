"""The proxy's device object says DO_BUFFERED_IO instead of DO_DIRECT_IO.

Breaks P1. Realistic: the flag copied from a sample driver's DriverEntry; buffered I/O makes the I/O manager copy
every buffer, which a SAN proxy must not.
"""

from __future__ import annotations

from ...spi.contract import DO_DIRECT_IO
from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P1",)
DO_BUFFERED_IO = 0x4


class ProxyBufferedIo(DelegatingProxy):
    @property
    def device_flags(self) -> int:
        return (self.inner.device_flags & ~DO_DIRECT_IO) | DO_BUFFERED_IO


pytest_san_make_proxy = proxy_hook(ProxyBufferedIo)
