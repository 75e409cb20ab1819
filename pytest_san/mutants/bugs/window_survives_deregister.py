"""Deregistering an RDMA registration leaves its window valid until the socket closes.

Breaks R3 (the old descriptor still reaches the memory), R12 (its pinned pages stay allocated) and R13 (a second
deregistration of it is accepted). Realistic: a registration cache ("pin-down cache") that keeps windows bound
to save the next registration of the same buffer, and never invalidates them on deregister.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R3", "R12", "R13")


class WindowSurvivesDeregister(DelegatingProvider):
    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        key = bytes(descriptor) if isinstance(descriptor, bytes | bytearray) else None
        reg = self.shared.registered.get((id(socket), key))
        if reg is None or reg.count > 1:
            super().deregister_rdma_memory(socket, descriptor)
            return
        self.shared.forget(socket, key)  # forgotten here; the wrapped provider keeps it until close


pytest_san_make_provider = provider_hook(WindowSurvivesDeregister)
