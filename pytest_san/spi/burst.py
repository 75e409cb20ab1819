"""Bursts: the same RDMA transfer repeated ``count`` times with up to ``depth`` in flight, as one operation.

What ``ib_write_bw`` does to measure a link: keep the send queue full of identical writes. Through the
plain SPI every write is one call (on the hil backend one round trip to the agent), which measures the
harness rather than the link. A provider may implement the burst itself, next to the NIC (the verbs
engine does: its process reposts each write as the previous completes); :func:`rdma_write_burst` uses
that when the provider's class defines it (:func:`runs_bursts`: a wrapper delegating by ``__getattr__`` gets
bursts of its own calls) and otherwise runs the same loop over ``rdma_write`` (:class:`WindowedBurst`).

Semantics, whichever runs it (the conformance suite checks them, ``test_burst.py``):

* ``count`` >= 1 transfers of the same local buffers to (or from) the same descriptor and offset;
  at most ``depth`` >= 1 in flight. Errors at the call are those of ``rdma_write`` / ``rdma_read``,
  plus WSAEINVAL for a ``count`` or ``depth`` below 1.
* Its completion: SUCCESS with ``count`` x the transfer's length when every transfer succeeded;
  otherwise the first error status, with the bytes of the transfers that succeeded. Nothing more is
  posted after an error (the connection is broken then, as after any failed transfer).
* Registrations it uses are in use until it completes: deregistering them is WSAEINVAL (R13).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol, cast, runtime_checkable

from . import checks
from .contract import Completion, SanError, Status, WsaError
from .protocols import Descriptor, LocalBuffers, PendingOperation, Provider, Socket

DEPTH = 16
"""Transfers in flight by default (perftest's ``--tx-depth`` is 128; 16 keeps Soft-RoCE busy)."""


@runtime_checkable
class BurstProvider(Protocol):
    """A provider that runs bursts itself (optional: :func:`rdma_write_burst` falls back to the SPI)."""

    def rdma_write_burst(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                         offset: int = 0, count: int = 1, depth: int = DEPTH) -> PendingOperation: ...
    def rdma_read_burst(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                        offset: int = 0, count: int = 1, depth: int = DEPTH) -> PendingOperation: ...


check_burst = checks.burst
"""WSAEINVAL unless ``count`` and ``depth`` are integers >= 1 (the first check of a burst)."""


def rdma_write_burst(provider: Provider, socket: Socket, local_buffers: LocalBuffers,
                     target_descriptor: Descriptor, offset: int = 0, *, count: int,
                     depth: int = DEPTH) -> PendingOperation:
    """``count`` RDMA writes of ``local_buffers`` to ``target_descriptor`` at ``offset``, as one operation."""
    return _burst(provider, "rdma_write", socket, local_buffers, target_descriptor, offset, count, depth)


def rdma_read_burst(provider: Provider, socket: Socket, local_buffers: LocalBuffers,
                    source_descriptor: Descriptor, offset: int = 0, *, count: int,
                    depth: int = DEPTH) -> PendingOperation:
    """``count`` RDMA reads from ``source_descriptor`` at ``offset`` into ``local_buffers``, as one operation."""
    return _burst(provider, "rdma_read", socket, local_buffers, source_descriptor, offset, count, depth)


def runs_bursts(provider: object) -> bool:
    """Whether ``provider`` runs bursts itself: its class defines both burst methods.

    Read from the class, not the object: a wrapper that forwards what it lacks through ``__getattr__`` would
    otherwise hand the burst to the provider it wraps and bypass its own ``rdma_write``/``rdma_read``. Such a
    wrapper gets bursts made of its own calls (:class:`WindowedBurst`), so whatever it does to a transfer it
    does to every transfer of a burst; a wrapper that defines the burst methods is trusted with them.
    """
    klass = type(provider)
    return callable(getattr(klass, "rdma_write_burst", None)) and callable(getattr(klass, "rdma_read_burst", None))


def _burst(provider: Provider, kind: str, socket: Socket, local_buffers: LocalBuffers, descriptor: Descriptor,
           offset: int, count: int, depth: int) -> PendingOperation:
    if runs_bursts(provider):  # the provider's own, e.g. next to the NIC
        bursts = cast(BurstProvider, provider)
        own = bursts.rdma_write_burst if kind == "rdma_write" else bursts.rdma_read_burst
        return own(socket, local_buffers, descriptor, offset, count, depth)
    return WindowedBurst(provider, kind, socket, local_buffers, descriptor, offset, count, depth)


class WindowedBurst:
    """A burst run over the plain SPI: post up to ``depth``, reap in order, repost while all is well.

    It makes progress whenever it is asked (``done``/``wait``); the first window is posted at once, so
    the call's own errors (a bad descriptor, an unconnected socket) raise from the constructor. A full
    send queue later (WSAENETDOWN) narrows the window; any other refusal ends the burst ABORTED.
    """

    def __init__(self, provider: Provider, kind: str, socket: Socket, local_buffers: LocalBuffers,
                 descriptor: Descriptor, offset: int, count: int, depth: int) -> None:
        check_burst(count, depth)
        self._call = provider.rdma_write if kind == "rdma_write" else provider.rdma_read
        self._args = (socket, local_buffers, descriptor, offset)
        self.kind = kind
        self.count = count
        self.depth = depth
        self.bytes = 0
        self.error: SanError | None = None  # a post refused mid-burst: the burst completes ABORTED
        self._status = Status.SUCCESS
        self._completion: Completion | None = None
        self._in_flight: deque[PendingOperation] = deque([self._post()])  # the call's own errors raise here
        self.posted = 1
        self._progress()

    def _post(self) -> PendingOperation:
        return self._call(*self._args)

    def _reap(self, completion: Completion) -> None:
        self._in_flight.popleft()
        if completion.status is Status.SUCCESS:
            self.bytes += completion.bytes
        elif self._status is Status.SUCCESS:
            self._status = completion.status

    def _progress(self) -> None:
        """Reap what has completed, in order; post more while nothing failed; complete when nothing is left."""
        if self._completion is not None:
            return
        while True:
            while self._in_flight and self._in_flight[0].done():
                self._reap(self._in_flight[0].wait(0))
            if (self.posted == self.count or self._status is not Status.SUCCESS
                    or len(self._in_flight) >= self.depth):
                break
            try:
                self._in_flight.append(self._post())
                self.posted += 1
            except SanError as exc:
                if exc.code is WsaError.WSAENETDOWN and self._in_flight:
                    self.depth = len(self._in_flight)  # the send queue is full: keep what fits in flight
                else:
                    self.error, self._status = exc, Status.ABORTED
        if not self._in_flight:
            self._completion = Completion(self._status, self.bytes)

    def done(self) -> bool:
        self._progress()
        return self._completion is not None

    def wait(self, timeout: float | None = 10.0) -> Completion:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._progress()
        while self._completion is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                self._reap(self._in_flight[0].wait(left))
            except TimeoutError:
                raise TimeoutError(f"{self.kind} burst: {self.posted - len(self._in_flight)} of {self.count} "
                                   f"done, still pending after {timeout} s") from None
            self._progress()
        return self._completion

    def __repr__(self) -> str:
        return f"<{self.kind} burst {self.posted}/{self.count} posted, {self._completion or 'pending'}>"


__all__ = ["DEPTH", "BurstProvider", "WindowedBurst", "check_burst", "rdma_read_burst", "rdma_write_burst",
           "runs_bursts"]
