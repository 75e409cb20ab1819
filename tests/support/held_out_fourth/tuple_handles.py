"""Legal: handles are tuples naming the node and a serial number, not integers.

The provider hands out ``("h", node, serial)`` for each distinct registration (the same tuple again for a repeated
registration the wrapped provider counts, R13) and translates it back at every call; any value that is not one of
its live or past handles is treated as a handle nobody holds.

Why the contract allows it: CONTRACT.md section 2, "a handle is an opaque, hashable value the provider chooses (an int,
a string, ...), compared by equality and never assumed to be an int".
"""

from __future__ import annotations

import itertools
from typing import Any

from pytest_san.mutants.wrapping import SubstitutingHandles, fake_handle, provider_hook
from pytest_san.spi.protocols import Buffer, Handle, Socket

TABLES = "tuple_handles"
_serials = itertools.count(1)


class TupleHandles(SubstitutingHandles):
    def _tables(self) -> tuple[dict[Any, Any], dict[tuple[int, Any], tuple[Any, int]]]:
        """(tuple -> the wrapped provider's handle, ever; (socket, its handle) -> [tuple, count] while live)."""
        found: tuple[dict[Any, Any], dict[tuple[int, Any], tuple[Any, int]]] = self.shared.extra.setdefault(
            TABLES, ({}, {}))
        return found

    def _inner_handle(self, handle: object) -> Handle:
        outward, _ = self._tables()
        try:
            found: Handle = outward[handle] if isinstance(handle, tuple) and handle in outward else fake_handle()
        except TypeError:  # a tuple holding something unhashable
            return fake_handle()
        return found

    def substitute(self, socket: Socket, buffer: Buffer, handle: Handle) -> Handle:
        return self._inner_handle(handle)

    def register_memory(self, socket: Socket, buffer: Buffer, access: Any) -> Handle:
        inner = self.inner.register_memory(socket, buffer, access)
        outward, live = self._tables()
        known, count = live.get((id(socket), inner), (None, 0))
        mine: tuple[str, str, int] = known if known is not None else ("h", self.node.name, next(_serials))
        if known is None:
            outward[mine] = inner
        live[id(socket), inner] = (mine, count + 1)
        self.shared.note(socket, buffer, access, "memory", mine)
        return mine

    def deregister_memory(self, socket: Socket, handle: Handle) -> None:
        inner = self._inner_handle(handle)
        self.inner.deregister_memory(socket, inner)
        _, live = self._tables()
        mine, count = live.pop((id(socket), inner), (None, 0))
        if count > 1:
            live[id(socket), inner] = (mine, count - 1)
        self.shared.forget(socket, handle)

    def close_socket(self, socket: Socket) -> None:
        super().close_socket(socket)
        _, live = self._tables()
        for key in [key for key in live if key[0] == id(socket)]:
            del live[key]


pytest_san_make_provider = provider_hook(TupleHandles)
