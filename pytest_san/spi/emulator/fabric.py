"""The SAN fabric: which nodes can reach each other, and what happens to connections when that changes."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ..contract import Status
from .sockets import EmulatedSocket, SocketState

if TYPE_CHECKING:
    from .provider import EmulatedProvider


class Fabric:
    """Links between nodes (all up unless dropped) and connection state changes."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._down: set[frozenset[str]] = set()

    def next_id(self) -> int:
        return next(self._ids)

    def link_up(self, a: EmulatedProvider, b: EmulatedProvider) -> bool:
        return a is b or frozenset((a.node_name, b.node_name)) not in self._down

    def set_link(self, a: str, b: str, up: bool, sockets: list[EmulatedSocket]) -> None:
        pair = frozenset((a, b))
        if up:
            self._down.discard(pair)
            return
        self._down.add(pair)
        # Both ends learn of the loss (as RC retries would exhaust): the connections are gone.
        for sock in sockets:
            peer = sock.peer
            if peer is not None and frozenset((sock.provider.node_name, peer.provider.node_name)) == pair:
                self.disconnect(sock, Status.CONNECTION_RESET)

    def restore_all(self) -> None:
        self._down.clear()

    def connect(self, a: EmulatedSocket, b: EmulatedSocket) -> None:
        a.peer, b.peer = b, a

    def disconnect(self, sock: EmulatedSocket, status: Status) -> None:
        """The connection is gone for ``sock``: its pending operations complete with ``status``."""
        if sock.state is SocketState.CLOSED:
            return
        sock.state = SocketState.DISCONNECTED
        for op in sock.pending():
            op.complete(status)
        sock.recv_queue.clear()

    def break_connection(self, sock: EmulatedSocket) -> None:
        """An error completion moved the QP to error: both ends are flushed."""
        for end in (sock, sock.peer):
            if end is not None and end.state is SocketState.CONNECTED:
                end.state = SocketState.ERROR
                for op in end.pending():
                    op.complete(Status.ABORTED)
                end.recv_queue.clear()
