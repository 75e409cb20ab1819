"""Every WSAEINVAL is reported as WSAEFAULT.

Breaks R14 (the SPI's error codes) and R13 (an unknown or in-use handle is WSAEINVAL). Realistic: a provider that
maps its internal "bad argument" status to WSAEFAULT because most of its bad arguments are pointers.
"""

from __future__ import annotations

from ...spi.contract import WsaError
from ..wrapping import provider_hook
from ._recode import recoding

BREAKS = ("R13", "R14")

EinvalRecodedAsEfault = recoding({WsaError.WSAEINVAL: WsaError.WSAEFAULT})

pytest_san_make_provider = provider_hook(EinvalRecodedAsEfault)
