"""The simple switch and its connections: what ``pytest_san.spi.protocols.Switch`` names, and nothing of
``pytest_san.switch``."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any, cast

from pytest_san import SO_RDMA_THRESHOLD_SIZE, Backend, Node, Process
from pytest_san.closing import close_connections
from pytest_san.pacing import Backoff

from .endpoint import SimpleEndpoint
from .records import HEADER

MODES = ("auto", "read", "write")
MIN_MESSAGE_SIZE = HEADER.size + 1
MAX_MESSAGE_SIZE = 1 << 20
MIN_MESSAGE_COUNT = 3  # with two, both ends could hold a last credit each that only a report may spend
MAX_MESSAGE_COUNT = 1024
PROGRESS_ROUNDS = 10_000
"""At most this many rounds of both ends per ``progress`` (each round moves something, or it stops)."""


def _whole(name: str, value: object, low: int, high: int) -> int:
    if type(value) is not int:
        raise TypeError(f"{name} is an integer, got {value!r:.80}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {low}..{high}, got {value}")
    return value


class SimpleConnection:
    """Two endpoints, the parameters in force and the trace of the switch's provider calls."""

    endpoint = SimpleEndpoint  # what each end is (a subclass may make another)

    def __init__(self, switch: SimpleSwitch, a: Process, b: Process, *, rdma_threshold: int | None,
                 rdma_mode: str, message_size: int, message_count: int) -> None:
        self.rdma_mode = rdma_mode
        self.message_size = message_size
        self.message_count = message_count
        self.trace: list[tuple[str, str]] = []
        sa, sb = switch.backend.connect_sockets(a, b)
        self.local = self.endpoint(self, "local", sa, a)
        self.remote = self.endpoint(self, "remote", sb, b)
        self.local.peer, self.remote.peer = self.remote, self.local
        try:
            self.rdma_threshold: int = rdma_threshold if rdma_threshold is not None else \
                self.local.call(self.local.provider.getsockopt, SO_RDMA_THRESHOLD_SIZE)
            self.local.build()
            self.remote.build()
        except BaseException:  # all or nothing: what was built goes before the failure is raised
            for end in (self.local, self.remote):
                with contextlib.suppress(Exception):  # the connect's own failure is what the caller is told
                    end.close()
            raise

    def reads(self, receiver: SimpleEndpoint) -> bool:
        """R10: RdmaRead by the receiver, unless it lacks it (then RdmaWrite by the sender)."""
        return receiver.provider.supports_rdma_read if self.rdma_mode == "auto" else self.rdma_mode == "read"

    def progress(self) -> bool:
        for rounds in range(PROGRESS_ROUNDS):
            if not self.local.progress() | self.remote.progress():  # both ends every round
                return rounds > 0
        return True

    def run_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout != timeout:
            raise TypeError(f"timeout is a number of seconds, got {timeout!r:.80}")
        deadline = time.monotonic() + timeout
        pace = Backoff()  # a pause after a round that moved nothing: on a lab each round asks the hosts
        while not condition():
            for end in (self.local, self.remote):
                end.check()
            pace.after(self.progress())
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")

    def flush(self, timeout: float = 10.0) -> None:
        self.run_until(lambda: not (self.local.busy() or self.remote.busy()), timeout, "transfers to finish")

    def close(self) -> None:
        self.local.close()
        self.remote.close()


class SimpleSwitch:
    """A Windows Sockets switch over the ``Provider`` protocol (``pytest_san.spi.protocols.Switch``)."""

    connection = SimpleConnection  # what ``connect`` builds (a subclass may build another)

    def __init__(self, backend: Backend, *, message_size: int = 1024, message_count: int = 16,
                 rdma_threshold: int | None = None) -> None:
        self.backend = backend
        self.defaults = {"rdma_threshold": rdma_threshold, "rdma_mode": "auto", "message_size": message_size,
                         "message_count": message_count}
        self.options(self.defaults)
        self.connections: list[SimpleConnection] = []

    def options(self, given: dict[str, Any]) -> dict[str, Any]:
        """The options a connection uses: ``given`` over the defaults, checked (TypeError or ValueError; an
        unknown one is refused by the connection's constructor, before anything is built)."""
        chosen = {**self.defaults, **given}
        threshold = chosen["rdma_threshold"]
        if threshold is not None:
            _whole("rdma_threshold", threshold, 0, sys.maxsize)
        if type(chosen["rdma_mode"]) is not str or chosen["rdma_mode"] not in MODES:
            raise ValueError(f"rdma_mode must be one of {MODES}, got {chosen['rdma_mode']!r:.80}")
        _whole("message_size", chosen["message_size"], MIN_MESSAGE_SIZE, MAX_MESSAGE_SIZE)
        _whole("message_count", chosen["message_count"], MIN_MESSAGE_COUNT, MAX_MESSAGE_COUNT)
        return chosen

    def _process(self, where: object, default: int, name: str) -> Process:
        if where is None:
            nodes = self.backend.nodes
            return nodes[min(default, len(nodes) - 1)].default_process
        # By their methods (reading one costs nothing; a property may be a round trip to a lab's agent).
        if callable(getattr(where, "spawn_process", None)):
            return cast(Node, where).default_process
        if callable(getattr(where, "alloc", None)) and callable(getattr(where, "buffer_at", None)):
            return cast(Process, where)
        raise TypeError(f"{name} must be a node, a process or None, got {where!r:.80}")

    def connect(self, peer: Node | Process | None = None, process: Node | Process | None = None,
                **options: Any) -> SimpleConnection:
        chosen = self.options(options)
        a, b = self._process(process, 0, "process"), self._process(peer, 1, "peer")
        conn = self.connection(self, a, b, **chosen)
        self.connections.append(conn)
        return conn

    def close_all(self) -> None:
        close_connections(self.connections)
