"""A registration cache hands back a live registration that covers the range asked, whatever more it allows.

The bug: to save pins and MRs, ``register_memory`` first looks for a live registration of the same socket whose
range contains the buffer and whose access includes the access asked, and returns its handle with its count
raised (as for a repeated registration, R13). A buffer registered READWRITE (or a larger range) and then a part
of it registered READ gets the READWRITE handle: the "read-only" handle can be a receive buffer or an RdmaRead
sink, a "write-only" one a send source, and entries outside the range asked but inside the cached one are taken.

Realistic: registration caches (the WSD page on caching registered memory, MPI's rcache) that match on
"covers and allows at least", which is right for the cache owner and wrong for a provider that must enforce
what each caller asked.

Breaks R6 (memory registered READ is written through its handle), R7 (memory registered WRITE is read through
its handle) and R8 (a local entry past the range registered is accepted).
"""

from __future__ import annotations

from pytest_san import Access
from pytest_san.mutants.wrapping import DelegatingProvider, Registered, inside, provider_hook
from pytest_san.spi.protocols import Buffer, Handle, Socket

from ._common import allows

BREAKS = ("R6", "R7", "R8")


class WideningCache(DelegatingProvider):
    def _covering(self, socket: Socket, buffer: Buffer, access: object) -> Registered | None:
        if type(access) not in (int, Access) or access not in (1, 2, 3):
            return None
        length = getattr(buffer, "length", None)
        if type(length) is not int or length <= 0 or getattr(buffer, "process", None) is not socket.process:
            return None
        for reg in self.shared.of_socket(socket):
            if reg.kind != "memory" or not inside(buffer, reg) or not allows(reg.access, Access(access)):
                continue
            exact = (reg.buffer.address == buffer.address and reg.buffer.length == length
                     and int(reg.access) == int(access))
            if not exact:
                return reg
        return None

    def register_memory(self, socket: Socket, buffer: Buffer, access: Access) -> Handle:
        cached = self._covering(socket, buffer, access)
        if cached is None:
            return super().register_memory(socket, buffer, access)
        # the bug: the wider registration is registered once more (same handle, count raised) and handed out
        handle = self.inner.register_memory(socket, cached.buffer, cached.access)
        self.shared.note(socket, cached.buffer, cached.access, "memory", handle)
        return handle


pytest_san_make_provider = provider_hook(WideningCache)
