"""A buffer registered more than once is never released by its deregistrations, only by close.

Breaks R13 (after the last deregister the memory is still registered: the old handle works, a further deregister
is accepted) and R12 (its pages stay pinned). Realistic: an off-by-one in the reference count -- it starts at one
for the first registration and is incremented for it again.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R12", "R13")


class RefcountNeverReachesZero(DelegatingProvider):
    def _leave_one(self, socket: Any, key: Any) -> bool:
        """Whether this deregistration is the last of a key registered more than once (then skipped)."""
        twice: set[Any] = self.shared.extra.setdefault("twice", set())
        reg = self.shared.registered.get((id(socket), key))
        if reg is not None and reg.count > 1:
            twice.add((id(socket), key))
        last = reg is not None and reg.count == 1 and (id(socket), key) in twice
        if last:
            twice.discard((id(socket), key))
            self.shared.forget(socket, key)
        return last

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        if not self._leave_one(socket, handle):
            super().deregister_memory(socket, handle)

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        key = bytes(descriptor) if isinstance(descriptor, bytes | bytearray) else None
        if not self._leave_one(socket, key):
            super().deregister_rdma_memory(socket, descriptor)


pytest_san_make_provider = provider_hook(RefcountNeverReachesZero)
