"""``getsockopt`` answers its two options whatever the socket: closed, another host's, or none at all.

Breaks R14: every call of a socket that is not an open socket of the provider is WSAENOTSOCK (CONTRACT.md
section 4). Realistic: the options are the provider's constants, so an implementation returns them without
looking the socket up. Found by an outside set of planted bugs (issue 37).
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import MAX_RDMA_SIZE, RDMA_THRESHOLD, SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE, SanError, WsaError
from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R14",)


class GetsockoptOfAnySocket(DelegatingProvider):
    def getsockopt(self, socket: Any, option: int) -> int:
        try:
            return super().getsockopt(socket, option)
        except SanError as exc:
            constants = {SO_MAX_RDMA_SIZE: MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE: RDMA_THRESHOLD}
            if exc.code is WsaError.WSAENOTSOCK and type(option) is int and option in constants:
                return constants[option]
            raise


pytest_san_make_provider = provider_hook(GetsockoptOfAnySocket)
