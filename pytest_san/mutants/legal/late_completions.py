"""Completions become visible a fixed time late: an operation that finished reports ``done()`` only some
milliseconds afterwards (``--late-completions-ms``, 15 by default), and ``wait`` returns no sooner.

Nothing in the contract says how soon a finished operation is seen: a completion queue polled by another thread,
an interrupt moderated NIC or a lab host across a slow link all show completions late. A switch or checker that
assumed "at once" (or "within a poll or two") would hang or fail on them.

    pytest --pyargs pytest_san.scenarios -p pytest_san.mutants.legal.late_completions --late-completions-ms 50
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from ...spi.contract import Completion
from ...spi.protocols import Node, Provider
from ..wrapping import DelegatingProvider, Shared, shared

DEFAULT_MS = 15.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--late-completions-ms", type=float, default=DEFAULT_MS, metavar="MS",
                     help="late_completions: how long after an operation finished its completion is seen "
                          f"(default {DEFAULT_MS:g})")


class Late:
    """A pending operation seen ``latency`` seconds after the wrapped one finished."""

    def __init__(self, inner: Any, latency: float) -> None:
        self.inner = inner
        self.latency = latency
        self.visible: float | None = None  # when its completion shows (time.monotonic), once it finished

    def done(self) -> bool:
        if self.visible is None:
            if not self.inner.done():
                return False
            self.visible = time.monotonic() + self.latency
        return time.monotonic() >= self.visible

    def wait(self, timeout: float | None = 10.0) -> Completion:
        start = time.monotonic()
        completion: Completion = self.inner.wait(timeout)
        if self.visible is None:
            self.visible = time.monotonic() + self.latency
        left = self.visible - time.monotonic()
        if left > 0:
            if timeout is not None and time.monotonic() + left > start + timeout:
                raise TimeoutError(f"the completion shows {left * 1000:.1f} ms from now")
            time.sleep(left)
        return completion


class LateCompletions(DelegatingProvider):
    def __init__(self, inner: Any, node: Node, shared: Shared, latency: float) -> None:
        super().__init__(inner, node, shared)
        self.latency = latency

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return Late(super().rdma_write(socket, local_buffers, target_descriptor, offset), self.latency)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return Late(super().rdma_read(socket, local_buffers, source_descriptor, offset), self.latency)

    def send(self, socket: Any, buffers: Any) -> Any:
        return Late(super().send(socket, buffers), self.latency)

    def recv(self, socket: Any, buffers: Any) -> Any:
        return Late(super().recv(socket, buffers), self.latency)


def pytest_san_make_provider(config: pytest.Config, node: Node, provider: Provider) -> object:
    ms = config.getoption("late_completions_ms")
    if not ms >= 0:
        raise pytest.UsageError(f"--late-completions-ms must be a number of milliseconds >= 0, got {ms!r}")
    return LateCompletions(provider, node, shared(config), ms / 1000)
