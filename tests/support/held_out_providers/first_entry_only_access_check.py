"""The access of a scatter list is checked on its first entry only.

Breaks R6 (a READ handle later in a receive's or an RDMA read's list is written) and R7 (a WRITE handle later in
a send's or an RDMA write's list is read). Realistic: the check was written for one-entry lists, and looks at
``local_buffers[0]``.
"""

from __future__ import annotations

from typing import Any

from pytest_san import Access
from pytest_san.mutants.wrapping import SubstitutingHandles, provider_hook
from pytest_san.spi.protocols import Buffer

BREAKS = ("R6", "R7")


class FirstEntryOnlyAccessCheck(SubstitutingHandles):
    def _after_the_first(self, socket: Any, buffers: Any, need: Access) -> Any:
        if not isinstance(buffers, list | tuple):
            return buffers
        taken = list(buffers)
        for i, pair in enumerate(taken[1:], start=1):
            if not isinstance(pair, tuple | list) or len(pair) != 2 or not isinstance(pair[0], Buffer):
                continue  # not a pair of a buffer and a handle: the wrapped provider judges it
            reg = self.shared.registered.get((id(socket), pair[1]))
            if reg is not None and reg.kind == "memory" and not reg.access & need:
                found = self.register_quietly(socket, pair[0], Access.READWRITE)
                if found is not None:
                    taken[i] = (pair[0], found)
        return taken

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_write(socket, self._after_the_first(socket, local_buffers, Access.READ),
                                     target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_read(socket, self._after_the_first(socket, local_buffers, Access.WRITE),
                                    source_descriptor, offset)

    def send(self, socket: Any, buffers: Any) -> Any:
        return self.inner.send(socket, self._after_the_first(socket, buffers, Access.READ))

    def recv(self, socket: Any, buffers: Any) -> Any:
        return self.inner.recv(socket, self._after_the_first(socket, buffers, Access.WRITE))


pytest_san_make_provider = provider_hook(FirstEntryOnlyAccessCheck)
