"""An RDMA path a provider serves itself, by copying bytes, for the bugs that take it too often.

It checks what a correct provider checks -- the descriptor registered and its socket open, the local handles of
the caller's socket with the right access and covering their buffers, the range and the access of the
registration -- except whether the caller may use the descriptor at all, which ``serves`` decides. Anything it
would refuse goes to the wrapped provider, which refuses it as the contract says.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Access, Completion, Status
from ..wrapping import DelegatingProvider, Finished, Registered, entries, gather, inside, scatter


class SoftwareRdma(DelegatingProvider):
    def serves(self, socket: Any, target: Registered) -> bool:
        """Whether this provider moves the bytes itself for ``socket`` through ``target`` (the bug's choice)."""
        raise NotImplementedError

    def _copy(self, socket: Any, local_buffers: Any, descriptor: Any, offset: Any, write: bool) -> Finished | None:
        if not isinstance(descriptor, bytes | bytearray) or type(offset) is not int or offset < 0:
            return None
        target = self.shared.find(bytes(descriptor), "rdma")
        if target is None or target.socket.closed or socket.closed or not socket.connected:
            return None
        if not self.serves(socket, target):
            return None
        pairs = list(entries(local_buffers))
        if len(pairs) != len(local_buffers):
            return None
        need = Access.READ if write else Access.WRITE
        for buffer, handle in pairs:
            reg = self.shared.registered.get((id(socket), handle))
            if reg is None or reg.kind != "memory" or not reg.access & need or not inside(buffer, reg):
                return None
        total = sum(buffer.length for buffer, _ in pairs)
        if not target.access & (Access.WRITE if write else Access.READ) or offset + total > target.buffer.length:
            return None
        try:
            if write:
                target.buffer.write(gather(pairs), offset)
            else:
                scatter(pairs, target.buffer.read(total, offset))
        except Exception:  # the owner is gone: the wrapped provider says how that ends
            return None
        return Finished(Completion(Status.SUCCESS, total))

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        done = self._copy(socket, local_buffers, target_descriptor, offset, write=True)
        return done if done is not None else super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        done = self._copy(socket, local_buffers, source_descriptor, offset, write=False)
        return done if done is not None else super().rdma_read(socket, local_buffers, source_descriptor, offset)
