"""A connection the switch made: two endpoints and the loop that drives them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..protocols import Process, Socket
from .endpoint import Endpoint, check_timeout

if TYPE_CHECKING:
    from .switch import Switch


class Connection:
    """``local`` and ``remote`` endpoints of one connected socket pair."""

    def __init__(self, switch: Switch, a: tuple[Socket, Process], b: tuple[Socket, Process], *,
                 rdma_threshold: int, rdma_mode: str, message_size: int, message_count: int) -> None:
        self.switch = switch
        self.rdma_threshold = rdma_threshold
        self.rdma_mode = rdma_mode
        self.message_size = message_size
        self.message_count = message_count
        self.trace: list[tuple[str, str]] = []  # (endpoint, provider call) made by the switch
        self.local = Endpoint(self, "local", *a)  # releases what it built if it fails
        try:
            self.remote = Endpoint(self, "remote", *b)
        except BaseException as exc:
            self.local.abandon(exc)
            raise
        self.local.peer, self.remote.peer = self.remote, self.local

    def read_mode(self, receiver: Endpoint) -> bool:
        """R10: large transfers use RdmaRead unless the receiving side lacks it (then RdmaWrite)."""
        if self.rdma_mode == "auto":
            return receiver.provider.supports_rdma_read
        return self.rdma_mode == "read"

    def progress(self) -> bool:
        moved = False
        # Drive both ends until neither moves: one call settles everything already possible.
        while self.local.progress() | self.remote.progress():
            moved = True
        return moved

    def run_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        check_timeout(timeout)
        if not callable(condition):
            raise TypeError(f"run_until needs a condition to call, got {condition!r:.80}")
        deadline = time.monotonic() + timeout
        pause = 0.0
        while True:
            if condition():
                return
            for end in (self.local, self.remote):
                end._check()
            moved = self.progress()
            if time.monotonic() >= deadline:  # also while things move: a livelock must not hang the caller
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            if moved:
                pause = 0.0
                continue
            # Nothing moved: completions come from elsewhere (a remote host). Back off gently.
            time.sleep(pause)
            pause = min(0.01, pause * 2 or 0.0002)

    def flush(self, timeout: float = 10.0) -> None:
        """Until every queued send and large transfer on both ends has finished."""
        self.run_until(lambda: self.local.idle() and self.remote.idle(), timeout, "transfers to finish")

    def close(self) -> None:
        self.local.close()
        self.remote.close()
