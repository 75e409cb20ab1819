"""A deregistration refused because the registration is in use still takes one off its reference count.

The bug: ``deregister`` decrements the registration's count first and checks the in-use mark after, returning
WSAEINVAL without putting the count back. The refusal itself is right; the damage shows later: a buffer
registered twice (the same handle, count 2) whose deregistration was once refused while an operation used it
is released at the caller's *first* deregistration after the operation ends, while the caller still holds one
registration. Its handle then stops working, its pin is gone, and the caller's last deregistration is refused
as unknown.

Realistic: a decrement-then-validate ordering in a refcounted table, with the early return forgetting to undo.

Breaks R13 (only the last deregistration releases a repeated registration) and R12 (a live registration has
no pin once the early release freed it).
"""

from __future__ import annotations

from typing import Any

from pytest_san import SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Descriptor, Handle, Socket

from ._common import live

BREAKS = ("R12", "R13")
OWED = "refused_deregistration_still_decrements"


class DecrementsFirst(DelegatingProvider):
    def _owed(self) -> dict[tuple[int, str, object], tuple[Socket, int]]:
        found: dict[tuple[int, str, object], tuple[Socket, int]] = self.shared.extra.setdefault(OWED, {})
        return found

    def _deregister(self, kind: str, socket: Socket, key: Any) -> None:
        release = self.inner.deregister_memory if kind == "memory" else self.inner.deregister_rdma_memory
        noted = bytes(key) if isinstance(key, bytes | bytearray) else key
        try:
            if kind == "memory":
                super().deregister_memory(socket, key)
            else:
                super().deregister_rdma_memory(socket, key)
        except SanError as exc:
            if exc.code == WsaError.WSAEINVAL and live(self.shared, socket, noted, kind) is not None:
                entry = (id(socket), kind, noted)
                self._owed()[entry] = (socket, self._owed().get(entry, (socket, 0))[1] + 1)  # the bug
            raise
        # the decrements the refused calls made show now: as many more releases
        _, count = self._owed().pop((id(socket), kind, noted), (socket, 0))
        for _ in range(count):
            try:
                release(socket, key)
            except SanError:
                break
            self.shared.forget(socket, noted)

    def deregister_memory(self, socket: Socket, handle: Handle) -> None:
        self._deregister("memory", socket, handle)

    def deregister_rdma_memory(self, socket: Socket, descriptor: Descriptor) -> None:
        self._deregister("rdma", socket, descriptor)

    def close_socket(self, socket: Socket) -> None:
        super().close_socket(socket)
        for entry in [entry for entry in self._owed() if entry[0] == id(socket)]:
            del self._owed()[entry]


pytest_san_make_provider = provider_hook(DecrementsFirst)
