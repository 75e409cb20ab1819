"""A provider without RdmaRead: ``supports_rdma_read`` is false and ``rdma_read`` answers WSAEOPNOTSUPP.

The contract makes RdmaRead optional (CONTRACT.md section 2); the switch then moves large transfers by RdmaWrite
into a descriptor the receiver offers (R10). Scenarios that need RdmaRead are skipped on its nodes, with the
reason; the rest must pass.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook


class NoRdmaRead(DelegatingProvider):
    @property
    def supports_rdma_read(self) -> bool:
        return False

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        raise SanError(WsaError.WSAEOPNOTSUPP, "this provider has no RdmaRead")


pytest_san_make_provider = provider_hook(NoRdmaRead)
