"""Deregistering a register_memory handle leaves it valid until the socket closes.

Breaks R3 (the old handle still works as a source or sink), R12 (its pages stay pinned) and R13 (a second
deregistration is accepted). Realistic: lazy deregistration, batched "later" to save a kernel call, and that
later never comes before close.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R3", "R12", "R13")


class HandleSurvivesDeregister(DelegatingProvider):
    def deregister_memory(self, socket: Any, handle: Any) -> None:
        reg = self.shared.registered.get((id(socket), handle))
        if reg is None or reg.count > 1:
            super().deregister_memory(socket, handle)
            return
        self.shared.forget(socket, handle)  # forgotten here; the wrapped provider keeps it until close


pytest_san_make_provider = provider_hook(HandleSurvivesDeregister)
