"""A scatter list's bounds are checked on its first entry only: a later entry may reach past its registration.

Breaks R8 (bytes outside the registered range move). Realistic: the range check was written for one-entry lists
and looks at ``local_buffers[0]``; the rest go to the NIC under a key that covers the pages around them.
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import SubstitutingHandles, inside, provider_hook
from pytest_san.spi.protocols import Buffer

BREAKS = ("R8",)


class FirstEntryOnlyRangeCheck(SubstitutingHandles):
    def _after_the_first(self, socket: Any, buffers: Any) -> Any:
        if not isinstance(buffers, list | tuple):
            return buffers
        taken = list(buffers)
        for i, pair in enumerate(taken[1:], start=1):
            if not isinstance(pair, tuple | list) or len(pair) != 2 or not isinstance(pair[0], Buffer):
                continue  # not a pair of a buffer and a handle: the wrapped provider judges it
            reg = self.shared.registered.get((id(socket), pair[1]))
            if reg is not None and reg.kind == "memory" and not inside(pair[0], reg):
                found = self.register_quietly(socket, pair[0], reg.access)
                if found is not None:
                    taken[i] = (pair[0], found)
        return taken

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_write(socket, self._after_the_first(socket, local_buffers), target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return self.inner.rdma_read(socket, self._after_the_first(socket, local_buffers), source_descriptor, offset)

    def send(self, socket: Any, buffers: Any) -> Any:
        return self.inner.send(socket, self._after_the_first(socket, buffers))

    def recv(self, socket: Any, buffers: Any) -> Any:
        return self.inner.recv(socket, self._after_the_first(socket, buffers))


pytest_san_make_provider = provider_hook(FirstEntryOnlyRangeCheck)
