"""Deregistration finds the registration by its start address, not by the handle or descriptor given: of two
registrations that start at one address, it may end the other one.

Breaks R3 (the deregistered key still reaches its memory) and R13 (the other registration's references go
wrong). Realistic: a provider that keeps its registrations in a table keyed by address (the last one made there
wins), and a deregistration that resolves the key to an address first. Found by an outside set of planted bugs
(issue 37), caught then under R13 only.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R3", "R13")


class DeregisterByStartAddress(DelegatingProvider):
    def _first_at(self, socket: Any, key: Any, kind: str) -> Any:
        reg = self.shared.registered.get((id(socket), key))
        if reg is None:
            return key
        at = [other for (sid, other), found in self.shared.registered.items()
              if sid == id(socket) and found.kind == kind and found.buffer.address == reg.buffer.address]
        return at[-1]  # its table holds the last registration made at that address, maybe not the one named

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        super().deregister_memory(socket, self._first_at(socket, handle, "memory"))

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        super().deregister_rdma_memory(socket, self._first_at(socket, descriptor, "rdma"))


pytest_san_make_provider = provider_hook(DeregisterByStartAddress)
