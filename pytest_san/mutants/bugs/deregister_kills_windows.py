"""Deregistering a local handle also ends every RDMA window of the socket over the same memory.

Breaks R2: a descriptor works for the connected peer for as long as it is registered, and here the peer's
transfers through it are rejected once an unrelated handle over its memory goes. Realistic: one table keyed by
address range for both kinds of registration, and a deregistration that removes every entry overlapping the
range it frees. Found by an outside set of planted bugs (issue 37), caught then under R14 only.
"""

from __future__ import annotations

from typing import Any, cast

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R2",)


def _overlap(a: Any, b: Any) -> bool:
    return bool(a.address < b.address + b.length and b.address < a.address + a.length)


class DeregisterKillsWindows(DelegatingProvider):
    def deregister_memory(self, socket: Any, handle: Any) -> None:
        reg = self.shared.registered.get((id(socket), handle))
        super().deregister_memory(socket, handle)
        if reg is None:
            return
        for window in [w for w in self.shared.of_socket(socket) if w.kind == "rdma" and _overlap(w.buffer, reg.buffer)]:
            while self.shared.registered.get((id(socket), window.key)) is window:
                super().deregister_rdma_memory(socket, cast(bytes, window.key))


pytest_san_make_provider = provider_hook(DeregisterKillsWindows)
