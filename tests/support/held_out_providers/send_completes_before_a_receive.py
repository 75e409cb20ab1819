"""A send completes as soon as it is posted, before any receive took it: the bytes are kept for later.

Breaks R14: a send is pending (WSA_IO_PENDING) until the peer's receive takes it, where the provider declares
``send_waits``; its completion tells the caller that the peer has the bytes. Realistic: a provider that copies a
send into a bounce buffer and completes it at once, as a stream socket would.
"""

from __future__ import annotations

from typing import Any

from pytest_san import Completion, Status
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook

BREAKS = ("R14",)


class Eager:
    """Done at once with every byte "sent"; the wrapped send goes on underneath."""

    def __init__(self, inner: Any, nbytes: int) -> None:
        self.inner = inner
        self.nbytes = nbytes

    def done(self) -> bool:
        return True

    def wait(self, timeout: float | None = 10.0) -> Completion:
        if self.inner.done():
            completion: Completion = self.inner.wait(0)
            return completion
        return Completion(Status.SUCCESS, self.nbytes)


class SendCompletesBeforeAReceive(DelegatingProvider):
    def send(self, socket: Any, buffers: Any) -> Any:
        op = super().send(socket, buffers)
        return Eager(op, sum(buffer.length for buffer, _ in buffers))


pytest_san_make_provider = provider_hook(SendCompletesBeforeAReceive)
