"""Operations complete later than the emulator's: ``done()`` answers False a few more times before it tells.

Nothing in the contract says when a pending operation completes; a checker that assumed "at once" (or after one
poll) would fail real hardware.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Completion
from ..wrapping import DelegatingProvider, provider_hook

POLLS = 3


class Late:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.polls = 0

    def done(self) -> bool:
        self.polls += 1
        return self.polls > POLLS and bool(self.inner.done())

    def wait(self, timeout: float | None = 10.0) -> Completion:
        done: Completion = self.inner.wait(timeout)
        self.polls = POLLS
        return done


class SlowCompletions(DelegatingProvider):
    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return Late(super().rdma_write(socket, local_buffers, target_descriptor, offset))

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return Late(super().rdma_read(socket, local_buffers, source_descriptor, offset))

    def send(self, socket: Any, buffers: Any) -> Any:
        return Late(super().send(socket, buffers))

    def recv(self, socket: Any, buffers: Any) -> Any:
        return Late(super().recv(socket, buffers))


pytest_san_make_provider = provider_hook(SlowCompletions)
