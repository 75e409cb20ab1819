"""The first deregistration of a buffer registered twice releases it for both.

Breaks R13: only the last deregister may release; the second handle or descriptor stops working at the first.
Realistic: a reference count kept per registration *request* but released per buffer (the count is checked,
then the release loops over every request of that buffer).
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R13",)


class RefcountReleasesEarly(DelegatingProvider):
    def deregister_memory(self, socket: Any, handle: Any) -> None:
        reg = self.shared.registered.get((id(socket), handle))
        for _ in range(reg.count - 1 if reg is not None else 0):
            super().deregister_memory(socket, handle)
        super().deregister_memory(socket, handle)

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        key = bytes(descriptor) if isinstance(descriptor, bytes | bytearray) else None
        reg = self.shared.registered.get((id(socket), key))
        for _ in range(reg.count - 1 if reg is not None else 0):
            super().deregister_rdma_memory(socket, descriptor)
        super().deregister_rdma_memory(socket, descriptor)


pytest_san_make_provider = provider_hook(RefcountReleasesEarly)
