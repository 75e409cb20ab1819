"""The same handle (and descriptor) for a repeated registration, as the wrapped provider answers, but a pin
through the proxy for every registration call: each deregistration frees one, the last frees the rest.

R12 allows one pin per registration call as well as one per distinct registration: what matters is that no pin
outlives the last registration that needed it and none is missing while one is live. A registration whose extra
pin the proxy refuses is WSAENOBUFS and leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...spi.contract import SanError
from ..wrapping import DelegatingProvider, provider_hook


class PinPerRegistrationCall(DelegatingProvider):
    def _pins(self, socket: Any) -> dict[Any, list[Any]]:
        """(kind, key) -> the extra pins of that registration on ``socket``, one per repeated call."""
        tables: dict[int, dict[Any, list[Any]]] = self.shared.extra.setdefault("pins_per_call", {})
        return tables.setdefault(id(socket), {})

    def _pin_again(self, socket: Any, kind: str, key: Any, buffer: Any, undo: Callable[[], None]) -> None:
        reg = self.shared.registered.get((id(socket), key))
        if reg is None or reg.count < 2:  # the first call: the wrapped provider pinned it
            return
        try:
            pin = self.node.proxy.allocate(max(int(buffer.length), 1))
        except SanError:
            undo()
            raise
        self._pins(socket).setdefault((kind, key), []).append(pin)

    def _unpin(self, socket: Any, kind: str, key: Any) -> None:
        held = self._pins(socket).get((kind, key))
        if held:
            self.node.proxy.free(held.pop())

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        handle = super().register_memory(socket, buffer, access)
        self._pin_again(socket, "memory", handle, buffer, lambda: super(PinPerRegistrationCall, self)
                        .deregister_memory(socket, handle))
        return handle

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        super().deregister_memory(socket, handle)
        self._unpin(socket, "memory", handle)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        descriptor = super().register_rdma_memory(socket, buffer, access, descriptor_size)
        self._pin_again(socket, "rdma", bytes(descriptor), buffer, lambda: super(PinPerRegistrationCall, self)
                        .deregister_rdma_memory(socket, descriptor))
        return descriptor

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        super().deregister_rdma_memory(socket, descriptor)
        if isinstance(descriptor, bytes | bytearray):
            self._unpin(socket, "rdma", bytes(descriptor))

    def close_socket(self, socket: Any) -> None:
        super().close_socket(socket)
        for pins in self.shared.extra.get("pins_per_call", {}).pop(id(socket), {}).values():
            for pin in pins:
                self.node.proxy.free(pin)


pytest_san_make_provider = provider_hook(PinPerRegistrationCall)
