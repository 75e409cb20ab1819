"""A connection the switch made: two endpoints and the loop that drives them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..batch import batch, done_ahead, raise_first
from ..pacing import Backoff
from ..spi.contract import SO_RDMA_THRESHOLD_SIZE
from ..spi.protocols import Process, Socket
from .endpoint import Endpoint, check_timeout

if TYPE_CHECKING:
    from .switch import Switch

FLUSH_TIMEOUT = 10.0
"""Seconds ``flush`` waits by default."""


class Connection:
    """``local`` and ``remote`` endpoints of one connected socket pair, as pytest-san's own switch makes them
    (``pytest_san.Connection``; the protocol of any switch's is ``pytest_san.protocols.SwitchConnection``)."""

    rdma_threshold: int
    """R10: sends longer than this many bytes move by RDMA (the provider's SO_RDMA_THRESHOLD_SIZE unless the
    connect gave one)."""

    def __init__(self, switch: Switch, a: tuple[Socket, Process], b: tuple[Socket, Process], *,
                 rdma_threshold: int | None, rdma_mode: str, message_size: int, message_count: int) -> None:
        """``rdma_threshold``: None asks the local end's provider (SO_RDMA_THRESHOLD_SIZE).

        All or nothing: a build that fails closes both ends (each releases what it got, and its socket)
        before the failure is raised."""
        self.switch = switch
        self.rdma_mode = rdma_mode
        self.message_size = message_size
        self.message_count = message_count
        self.trace: list[tuple[str, str]] = []  # (endpoint, provider call) made by the switch
        self.local = Endpoint(self, "local", *a)
        self.remote = Endpoint(self, "remote", *b)
        self.local.peer, self.remote.peer = self.remote, self.local
        try:
            self._build(rdma_threshold)
        except BaseException:
            self.close()  # a failure to release is raised instead, the connect's own chained to it
            raise

    def _build(self, threshold: int | None) -> None:
        """Both ends at once: their regions and registrations and the provider's threshold (used when none was
        given: asked in the same round trip either way), then their receives; the first failure is raised."""
        with batch(self.switch.backend) as b:  # on a lab: every host's calls in one round trip
            local, remote = self.local.regions(b), self.remote.regions(b)
            asked = b.call(self.local.provider.getsockopt, self.local.socket, SO_RDMA_THRESHOLD_SIZE)
        self.local.regions_made(local)
        self.remote.regions_made(remote)
        raise_first([*local, *remote, asked])
        self.rdma_threshold = asked.value if threshold is None else threshold
        with batch(self.switch.backend) as b:
            posts = (self.local.receives(b), self.remote.receives(b))
        self.local.receives_made(posts[0])
        self.remote.receives_made(posts[1])
        raise_first([*posts[0], *posts[1]])

    def read_mode(self, receiver: Endpoint) -> bool:
        """R10: large transfers use RdmaRead unless the receiving side lacks it (then RdmaWrite)."""
        if self.rdma_mode == "auto":
            return receiver.provider.supports_rdma_read
        return self.rdma_mode == "read"

    def progress(self) -> bool:
        """Both ends, until neither moves; whether anything moved. Whether each pending operation is done is
        asked of both ends at once (on a lab: one round trip for both hosts)."""
        moved = False
        while True:
            answered = done_ahead(self.switch.backend, self.local.in_flight() + self.remote.in_flight())
            if not self.local.progress(answered) | self.remote.progress(answered):
                return moved
            moved = True

    def run_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Drive both ends until ``condition()``; TimeoutError naming ``what`` after ``timeout`` seconds.

        Each round asks the hosts whether what is pending is done (on a lab: a round trip); after a round in
        which nothing moved it pauses a little longer each time (pytest_san.pacing)."""
        check_timeout(timeout)
        if not callable(condition):
            raise TypeError(f"run_until needs a condition to call, got {condition!r:.80}")
        deadline = time.monotonic() + timeout
        pace = Backoff()
        while not condition():
            for end in (self.local, self.remote):
                end._check()
            pace.after(self.progress())
            if time.monotonic() >= deadline:  # also while things move: a livelock must not hang the caller
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Until every queued send and large transfer on both ends has finished."""
        self.run_until(lambda: self.local.idle() and self.remote.idle(), timeout, "transfers to finish")

    def close(self) -> None:
        """Both ends, the remote one even when closing the local one fails."""
        try:
            self.local.close()
        finally:
            self.remote.close()
