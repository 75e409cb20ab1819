"""A connected socket pair: the body of ``HilBackend.connect_sockets``, in two waves when made together.

A pair on one host is one ``connect_local``; across hosts the peer listens (its device's address and a port)
and the connecting host connects to that address through the RDMA connection manager, the peer's child
accepting by itself. Made together (``pytest_san.batch``), any number of pairs cost two round trips: every
host's listens (and local connects) in one write, then every host's connects. A connect that fails closes the
socket its peer listened on (a failed connect leaves nothing behind).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from hil.controller.remote import RemoteProcess, RemoteSocket

if TYPE_CHECKING:
    from hil.controller.backend import Agent

Pair = tuple[RemoteSocket, RemoteSocket]


def connect(agent_of: Callable[[object], Agent], a: object, b: object) -> Pair:
    """A connected pair of sockets of ``a`` and ``b``: asks one host, or two in turn (so, in a batch, two waves)."""
    if not isinstance(a, RemoteProcess) or not isinstance(b, RemoteProcess):
        raise TypeError(f"connect_sockets takes processes of this backend, got {a!r} and {b!r}")
    agent_a, agent_b = agent_of(a), agent_of(b)
    if agent_a is agent_b:
        return agent_a.remote_engine.connect_local(a, b)
    listening, where = agent_b.remote_engine.socket_listen(b)
    try:
        sock_a = agent_a.remote_engine.socket_connect(a, where)
    except Exception:
        with contextlib.suppress(Exception):  # a failed connect leaves nothing behind
            b.node.own_provider.close_socket(listening)
        raise
    relay(agent_a, sock_a, agent_b, listening)
    return sock_a, listening


def relay(agent_a: Agent, sock_a: RemoteSocket, agent_b: Agent, sock_b: RemoteSocket) -> None:
    """A close of either end is told to the other's host, with its next request: CM tells a survivor its peer's
    close, the relay stays for a host that vanished (a no-op otherwise)."""
    sock_a.on_close = lambda: agent_b.session.relay(agent_b.engine, "peer_closed", sock_b)
    sock_b.on_close = lambda: agent_a.session.relay(agent_a.engine, "peer_closed", sock_a)
