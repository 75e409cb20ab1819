"""register_memory handles are valid on every socket of the host, not only on the one that registered them.

Breaks R1 (another process, or another socket of the same process, uses a handle it does not own) and R13
(deregistering a handle on a socket it was not registered on succeeds). Realistic: one lkey table per adapter
instead of per protection domain, as in providers that share one PD among all their sockets.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import Registered, SubstitutingHandles, provider_hook

BREAKS = ("R1", "R13")


class HandlesSharedByTheNode(SubstitutingHandles):
    def _elsewhere(self, socket: Any, handle: Any) -> Registered | None:
        """The registration of ``handle`` on another socket of this host, when it is not one of ``socket``'s."""
        if (id(socket), handle) in self.shared.registered:
            return None
        for reg in self.shared.registered.values():
            if (reg.kind == "memory" and reg.key == handle and reg.socket is not socket
                    and reg.socket.process.node.name == socket.process.node.name):
                return reg
        return None

    def substitute(self, socket: Any, buffer: Any, handle: Any) -> Any:
        owner = self._elsewhere(socket, handle)
        if owner is None:
            return handle
        # The node-wide key "works" here: the caller's buffer, under the owner's access.
        found = self.register_quietly(socket, buffer, owner.access)
        return handle if found is None else found

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        owner = self._elsewhere(socket, handle)
        super().deregister_memory(socket if owner is None else owner.socket, handle)


pytest_san_make_provider = provider_hook(HandlesSharedByTheNode)
