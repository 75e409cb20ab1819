"""A scatter entry its handle does not allow (the access, or a range outside the registration) is refused at the
call with WSAEFAULT, before anything is posted, instead of by an error completion.

Legal: "rejected" is a SanError at the call or an error completion, with no byte moved (CONTRACT.md section 2);
a provider that keeps its own table of what each handle allows may check it before it posts. A handle it does
not know still gets the error completion the contract names (the wrapped provider's).
"""

from __future__ import annotations

from typing import Any

from pytest_san import Access, SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, entries, inside, provider_hook


class BadEntryRefusedAtTheCall(DelegatingProvider):
    def _check(self, socket: Any, buffers: Any, need: Access) -> None:
        for i, (buffer, handle) in enumerate(entries(buffers)):
            reg = self.shared.registered.get((id(socket), handle))
            if reg is None or reg.kind != "memory" or getattr(buffer, "process", None) is not reg.buffer.process:
                continue  # not ours to judge here: the wrapped provider answers
            length, address = getattr(buffer, "length", None), getattr(buffer, "address", None)
            if type(length) is not int or type(address) is not int or length < 0:
                continue  # numbers that are not ints, a negative length: WSAEINVAL, the wrapped provider's answer
            if length == 0:
                continue  # a zero-length entry moves nothing, wherever it points
            if not reg.access & need or not inside(buffer, reg):
                raise SanError(WsaError.WSAEFAULT, f"local_buffers[{i}] is not {need.name} memory of its handle")

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        self._check(socket, local_buffers, Access.READ)
        return super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        self._check(socket, local_buffers, Access.WRITE)
        return super().rdma_read(socket, local_buffers, source_descriptor, offset)

    def send(self, socket: Any, buffers: Any) -> Any:
        self._check(socket, buffers, Access.READ)
        return super().send(socket, buffers)

    def recv(self, socket: Any, buffers: Any) -> Any:
        self._check(socket, buffers, Access.WRITE)
        return super().recv(socket, buffers)


pytest_san_make_provider = provider_hook(BadEntryRefusedAtTheCall)
