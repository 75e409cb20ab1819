"""A proxy that cannot pin (WSAENOBUFS) is reported to the caller as WSAEINVAL.

Breaks R14: out of resources is WSAENOBUFS. Realistic: the proxy's NTSTATUS (STATUS_INSUFFICIENT_RESOURCES) falls
through a translation table to the default case. It shows only where allocations can be made to fail
(``faults``).
"""

from __future__ import annotations

from ...spi.contract import WsaError
from ..wrapping import provider_hook
from ._recode import recoding

BREAKS = ("R14",)
NEEDS = ("faults",)

OutOfMemoryRecoded = recoding({WsaError.WSAENOBUFS: WsaError.WSAEINVAL})

pytest_san_make_provider = provider_hook(OutOfMemoryRecoded)
