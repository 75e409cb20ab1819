"""A registration pins ``length`` bytes from the start of its first page, forgetting where in that page the buffer
starts: the last page of an unaligned registration is not pinned.

Breaks R8 (bytes inside the registered range may move while the NIC still moves data to where they were) and R12
(the registration's pin covers less than it needs). Realistic: ``pages = (length + PAGE_SIZE - 1) / PAGE_SIZE``
where the offset in the first page belongs in the sum. Found by an outside set of planted bugs (issue 37), caught
then under R14 only: the scenarios counted pins, not their bytes. The provider asks its node's proxy to pin (R12),
so the bug is both hooks: the provider says what it registers, the proxy pins short while it does.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import PAGE_SIZE
from ..wrapping import DelegatingProvider, DelegatingProxy, provider_hook, proxy_hook

BREAKS = ("R8", "R12")


class ForgetsTheOffset(DelegatingProvider):
    def _registering(self, buffer: Any, call: Any) -> Any:
        address = getattr(buffer, "address", None)
        self.shared.extra["offset"] = address % PAGE_SIZE if type(address) is int else 0
        try:
            return call()
        finally:
            self.shared.extra["offset"] = 0

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        return self._registering(buffer, lambda: super(ForgetsTheOffset, self).register_memory(socket, buffer, access))

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        return self._registering(buffer, lambda: super(ForgetsTheOffset, self).register_rdma_memory(
            socket, buffer, access, descriptor_size))


class PinsWhatItIsTold(DelegatingProxy):
    def allocate(self, nbytes: int) -> Any:
        offset = int(self.shared.extra.get("offset", 0))
        return super().allocate(nbytes - offset if type(nbytes) is int and nbytes > offset else nbytes)


pytest_san_make_provider = provider_hook(ForgetsTheOffset)
pytest_san_make_proxy = proxy_hook(PinsWhatItIsTold)
