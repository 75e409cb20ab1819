"""Handles live in a table keyed by socket number, which closing a socket does not clear: a new socket that gets
the closed one's number (the lowest free, as an OS hands out descriptors) inherits its handles.

Breaks R1 (a handle works on a socket it was not registered on), R3 (the registration was released when its
socket closed, yet the handle names memory again) and R11 (the closed socket's registrations outlive it).
Realistic: per-socket state indexed by the SOCKET value, and cleanup that forgets one table.
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import Registered, Shared, SubstitutingHandles, provider_hook

BREAKS = ("R1", "R3", "R11")


class HandlesSurviveSocketNumberReuse(SubstitutingHandles):
    def __init__(self, inner: Any, node: Any, shared: Shared) -> None:
        super().__init__(inner, node, shared)
        self.numbers: dict[int, tuple[Any, int]] = {}  # id(socket) -> (socket, its number)
        self.by_number: dict[int, list[Registered]] = {}  # number -> memory registrations, never cleared

    def _number(self, socket: Any) -> int:
        known = self.numbers.get(id(socket))
        if known is not None and known[0] is socket:
            return known[1]
        live = {n for s, n in self.numbers.values() if s is not socket and not s.closed}
        number = next(n for n in range(len(live) + 1) if n not in live)
        self.numbers[id(socket)] = (socket, number)
        return number

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        handle = super().register_memory(socket, buffer, access)
        reg = self.shared.registered.get((id(socket), handle))
        if reg is not None:
            self.by_number.setdefault(self._number(socket), []).append(reg)
        return handle

    def _inherited(self, socket: Any, handle: Any) -> Registered | None:
        """A registration of a closed socket that had ``socket``'s number, under ``handle``."""
        if (id(socket), handle) in self.shared.registered:
            return None
        for reg in self.by_number.get(self._number(socket), []):
            if reg.key == handle and reg.socket is not socket and reg.socket.closed:
                return reg
        return None

    def substitute(self, socket: Any, buffer: Any, handle: Any) -> Any:
        reg = self._inherited(socket, handle)
        if reg is None:
            return handle
        found = self.register_quietly(socket, buffer, reg.access)
        return handle if found is None else found

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        reg = self._inherited(socket, handle)
        if reg is None:
            super().deregister_memory(socket, handle)
            return
        self.by_number[self._number(socket)].remove(reg)  # "deregistered", from the table the socket inherited


pytest_san_make_provider = provider_hook(HandlesSurviveSocketNumberReuse)
