"""One pin is shared by every registration of the same range in a process, and the first release unpins it.

The bug: the provider keeps a per-process pin cache keyed by (process, address, length). A second registration
of a range already pinned, on another socket of the process or with another access, reuses the cached pin
instead of asking the proxy for one, and the cache has no count: the first deregistration (or close) that
releases one of them unpins the range while the other registration is still live. Later releases of the same
pin are ignored, so the proxy's books balance at the end and nothing leaks.

Realistic: a pin cache (to avoid pinning the same pages twice) without reference counts, the kind of bug that
shows only when two sockets share a buffer.

Breaks R12 (one pin per distinct registration at least: two live registrations hold one pin, and after the
first is released a live registration has none).

The provider's pins go through the node's proxy (on the emulator the provider drives the proxy the hooks chose),
so the cache is modelled as a proxy wrapper told, by the provider wrapper, which range each pin is for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_san import Access
from pytest_san.mutants.wrapping import DelegatingProvider, DelegatingProxy, provider_hook, proxy_hook
from pytest_san.spi.protocols import Buffer, Descriptor, Handle, Socket

BREAKS = ("R12",)
PINNING = "pin_shared_across_sockets"


class TellsWhatIsPinned(DelegatingProvider):
    def _for(self, socket: Socket, buffer: Buffer) -> None:
        try:
            key: object = (id(socket.process), buffer.address, buffer.length)
            hash(key)
        except (AttributeError, TypeError):
            key = None
        self.shared.extra[PINNING] = key

    def register_memory(self, socket: Socket, buffer: Buffer, access: Access) -> Handle:
        self._for(socket, buffer)
        try:
            return super().register_memory(socket, buffer, access)
        finally:
            self.shared.extra[PINNING] = None

    def register_rdma_memory(self, socket: Socket, buffer: Buffer, access: Access,
                             descriptor_size: int | None = None) -> Descriptor:
        self._for(socket, buffer)
        try:
            return super().register_rdma_memory(socket, buffer, access, descriptor_size)
        finally:
            self.shared.extra[PINNING] = None


@dataclasses.dataclass(eq=False)
class Pin:
    allocation: Any
    unpinned: bool = False


class PinCache(DelegatingProxy):
    def __init__(self, inner: Any, node: Any, shared: Any) -> None:
        super().__init__(inner, node, shared)
        self.pins: dict[object, Pin] = {}  # (process, address, length) -> the cached pin
        self.by_allocation: dict[int, Pin] = {}

    def allocate(self, nbytes: int) -> Any:
        key = self.shared.extra.get(PINNING)
        if key is not None and self.pins and self.inner.live_allocations() == 0:
            self.pins.clear()  # nothing is pinned at all (the backend was reset): no cached pin is valid
            self.by_allocation.clear()
        pin = self.pins.get(key) if key is not None else None
        if pin is not None and not pin.unpinned:
            return pin.allocation  # the bug: reused, and nothing counts that it was
        allocation = self.inner.allocate(nbytes)
        if key is not None:
            pin = self.pins[key] = Pin(allocation)
            self.by_allocation[id(allocation)] = pin
        return allocation

    def free(self, allocation: Any) -> None:
        pin = self.by_allocation.get(id(allocation))
        if pin is None or pin.allocation is not allocation:
            self.inner.free(allocation)
            return
        if not pin.unpinned:
            pin.unpinned = True
            self.inner.free(allocation)  # the first release unpins, for everyone
        # a later release of the same pin: already unpinned, ignored


pytest_san_make_provider = provider_hook(TellsWhatIsPinned)
pytest_san_make_proxy = proxy_hook(PinCache)
