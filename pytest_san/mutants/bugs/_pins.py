"""A provider that pins a bounce buffer through its node's proxy for each registration, for the bugs in when
those pins are freed."""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider


class BouncePins(DelegatingProvider):
    kinds: tuple[str, ...] = ("memory", "rdma")  # which registrations get a bounce pin
    free_on_deregister = True
    free_on_close = True

    def _pins(self, socket: Any) -> dict[Any, list[Any]]:
        table: dict[int, dict[Any, list[Any]]] = self.shared.extra.setdefault("pins", {})
        return table.setdefault(id(socket), {})

    def _pin(self, socket: Any, kind: str, key: Any, buffer: Any) -> None:
        if kind in self.kinds:
            self._pins(socket).setdefault(key, []).append(self.node.proxy.allocate(max(int(buffer.length), 1)))

    def _unpin(self, socket: Any, key: Any) -> None:
        held = self._pins(socket).get(key)
        if self.free_on_deregister and held:
            self.node.proxy.free(held.pop())

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        handle = super().register_memory(socket, buffer, access)
        self._pin(socket, "memory", handle, buffer)
        return handle

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        super().deregister_memory(socket, handle)
        self._unpin(socket, handle)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: int | None = None) -> Any:
        descriptor = super().register_rdma_memory(socket, buffer, access, descriptor_size)
        self._pin(socket, "rdma", bytes(descriptor), buffer)
        return descriptor

    def deregister_rdma_memory(self, socket: Any, descriptor: Any) -> None:
        super().deregister_rdma_memory(socket, descriptor)
        self._unpin(socket, bytes(descriptor))

    def close_socket(self, socket: Any) -> None:
        super().close_socket(socket)
        held = self.shared.extra.setdefault("pins", {}).pop(id(socket), {})
        if self.free_on_close:
            for pins in held.values():
                for pin in pins:
                    self.node.proxy.free(pin)
