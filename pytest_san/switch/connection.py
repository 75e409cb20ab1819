"""A connection the switch made: two endpoints and the loop that drives them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ..protocols import Process, Socket
from ..together import asking, together
from ..types import SO_RDMA_THRESHOLD_SIZE
from .endpoint import Endpoint, check_timeout, raise_first

if TYPE_CHECKING:
    from .switch import Switch


class Connection:
    """``local`` and ``remote`` endpoints of one connected socket pair."""

    def __init__(self, switch: Switch, a: tuple[Socket, Process], b: tuple[Socket, Process], *,
                 rdma_threshold: int | None, rdma_mode: str, message_size: int, message_count: int) -> None:
        """``rdma_threshold``: None asks the local end's provider (SO_RDMA_THRESHOLD_SIZE)."""
        self.switch = switch
        self._ask_threshold = rdma_threshold is None
        self.rdma_threshold: int = rdma_threshold if rdma_threshold is not None else 0
        self.rdma_mode = rdma_mode
        self.message_size = message_size
        self.message_count = message_count
        self.trace: list[tuple[str, str]] = []  # (endpoint, provider call) made by the switch
        self.local = Endpoint(self, "local", *a)
        self.remote = Endpoint(self, "remote", *b)
        self.local.peer, self.remote.peer = self.remote, self.local
        try:
            self._build()
        except BaseException as exc:  # all or nothing: what was built is released before the failure is raised
            self.local.abandon(exc)
            self.remote.abandon(exc)
            raise

    def _build(self) -> None:
        """Both ends at once (on a lab: every host's calls in one round trip): their regions and registrations,
        the threshold if it was not given, then their receives; the first failure is raised."""
        ends = (self.local, self.remote)
        calls = [*self.local.regions(), *self.remote.regions(4)]
        asked = self._ask_threshold
        if asked:
            calls.append((self.local.provider, "getsockopt", (self.local.socket, SO_RDMA_THRESHOLD_SIZE)))
        made = together(self.switch.backend, calls)
        for i, end in enumerate(ends):
            end.regions_made(made[4 * i:4 * i + 4])
        raise_first(made)
        if asked:
            self.rdma_threshold = cast(int, made[-1][1])
        posts = together(self.switch.backend, [*self.local.receives(), *self.remote.receives()])
        count = self.message_count
        self.local.receives_made(posts[:count])
        self.remote.receives_made(posts[count:])
        raise_first(posts)

    def read_mode(self, receiver: Endpoint) -> bool:
        """R10: large transfers use RdmaRead unless the receiving side lacks it (then RdmaWrite)."""
        if self.rdma_mode == "auto":
            return receiver.provider.supports_rdma_read
        return self.rdma_mode == "read"

    def progress(self) -> bool:
        moved = False
        # Drive both ends until neither moves: one call settles everything already possible. Whether each
        # pending operation is done is asked of both ends at once (on a lab: one round trip for both hosts).
        while True:
            with asking(self.switch.backend, self.local.questions() + self.remote.questions()):
                if not self.local.progress() | self.remote.progress():
                    return moved
            moved = True

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
