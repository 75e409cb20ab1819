"""A burst: one RDMA work request posted ``count`` times, up to ``depth`` in flight, as one operation.

The posting part starts it (``posting.py``); each completion of one of its work requests comes back
here through the completions part, which reposts (``refill``) until every transfer is done or one
failed. Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hil.agent.engines.verbs.records import Operation
from pytest_san.spi.contract import Status


class Burst:
    """The burst of one ``Operation``: its work request, how many are posted and in flight, its first failure.

    ``fence`` (iWARP) builds the zero-length read posted behind the last write: its completion tells
    whether the responder placed them all (see ``Posting``)."""

    __slots__ = ("count", "depth", "error", "fence", "fenced", "in_flight", "ok_bytes", "posted", "wr")

    def __init__(self, wr: Any, count: int, depth: int, fence: Callable[[], Any] | None = None) -> None:
        self.wr = wr
        self.count = count
        self.depth = depth
        self.fence = fence
        self.posted = 0
        self.in_flight = 0
        self.ok_bytes = 0
        self.error: int | None = None  # the first failure's status: nothing more is posted
        self.fenced = False  # the fence read behind the last write is posted

    def refill(self, op: Operation) -> tuple[int, int] | None:
        """Post the next work requests while there is room, transfers left and no failure; the burst's
        (status, bytes) once it is over, else None."""
        sock = op.sock
        while (self.error is None and self.posted < self.count and self.in_flight < self.depth
               and sock.state == "connected"):
            try:
                sock.qp.post_send(self.wr)
            except Exception:
                self.error = sock.flush_status  # the QP refused: it is in error already
                break
            self.posted += 1
            self.in_flight += 1
        if self.in_flight == 0 and self.error is None and self.posted < self.count:
            self.error = sock.flush_status  # the socket left "connected" between two completions
        if self.in_flight == 0 and (self.error is not None or self.posted == self.count):
            if self.error is None and not self.fenced and self.fence is not None:
                self.fenced = True  # every write completed where it was sent: the fence tells if they landed
                try:
                    sock.qp.post_send(self.fence())
                    self.in_flight = 1
                    return None
                except Exception:
                    self.error = sock.flush_status
            return (Status.SUCCESS.value if self.error is None else self.error), self.ok_bytes
        return None
