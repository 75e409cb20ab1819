"""Completions of a socket's send queue are seen later than those of its receive queue.

The two queues are independent (only each queue's own completions come in order), so a receive posted after a
send may be seen complete first; a provider is free to report them so.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook
from .slow_completions import Late


class CompletionsInAnotherOrder(DelegatingProvider):
    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return Late(super().rdma_write(socket, local_buffers, target_descriptor, offset))

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return Late(super().rdma_read(socket, local_buffers, source_descriptor, offset))

    def send(self, socket: Any, buffers: Any) -> Any:
        return Late(super().send(socket, buffers))


pytest_san_make_provider = provider_hook(CompletionsInAnotherOrder)
