"""``supports_rdma_read`` is true, but ``rdma_read`` answers WSAEOPNOTSUPP.

Breaks R10 (the switch picks RdmaRead for large transfers on the provider's word, and they fail) and R14
(a provider with RdmaRead serves it). Realistic: the capability flag set from the device's attributes while the
read path was never finished.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R10", "R14")


class RdmaReadClaimedNotServed(DelegatingProvider):
    @property
    def supports_rdma_read(self) -> bool:
        return True

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        raise SanError(WsaError.WSAEOPNOTSUPP, "RdmaRead is not implemented")


pytest_san_make_provider = provider_hook(RdmaReadClaimedNotServed)
