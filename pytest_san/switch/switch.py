"""The Windows Sockets switch, backend-neutral: it only talks to the Provider protocol."""

from __future__ import annotations

from typing import Any, TypeGuard

from ..closing import close_connections
from ..spi.contract import is_int as _is_int
from ..spi.protocols import Backend, Node, Process
from .connection import Connection
from .session import HEADER

RDMA_MODES = ("auto", "read", "write")
OPTIONS = ("rdma_threshold", "rdma_mode", "message_size", "message_count")
MESSAGE_SIZE = 4096
"""A connection's message size unless its connect gives one (docs/downstream.md)."""
MESSAGE_COUNT = 8
"""A connection's message count (receives posted per end) unless its connect gives one."""
MIN_MESSAGE_SIZE = HEADER.size + 1
"""A header and one byte: a payload longer than a message holds (a descriptor, or application data) travels in
several (session.MORE)."""
MAX_MESSAGE_SIZE = 1 << 20
MIN_MESSAGE_COUNT = 3
"""A sender spends its last credit only on a message that returns credits, so with one receive buffer an end
could never send data first, and with two the ends would answer each other's credit-only messages for ever."""
MAX_MESSAGE_COUNT = 1024


def check_options(rdma_threshold: object, rdma_mode: object, message_size: object, message_count: object) -> None:
    """TypeError or ValueError, naming the option, unless every option is usable."""
    if rdma_threshold is not None:
        if not _is_int(rdma_threshold):
            raise TypeError(f"rdma_threshold is an integer or None, got {rdma_threshold!r:.80}")
        if rdma_threshold < 0:
            raise ValueError(f"rdma_threshold must not be negative, got {rdma_threshold}")
    if type(rdma_mode) is not str or rdma_mode not in RDMA_MODES:
        raise ValueError(f"rdma_mode must be one of {RDMA_MODES}, got {rdma_mode!r:.80}")
    for name, value, low, high in (("message_size", message_size, MIN_MESSAGE_SIZE, MAX_MESSAGE_SIZE),
                                   ("message_count", message_count, MIN_MESSAGE_COUNT, MAX_MESSAGE_COUNT)):
        if not _is_int(value):
            raise TypeError(f"{name} is an integer, got {value!r:.80}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be {low}..{high}, got {value}")


class Switch:
    """pytest-san's own switch: opens connected SAN sockets, registers their message memory, moves data, tears
    down.

    A class, exported as ``pytest_san.Switch``; what every switch keeps, and what ``san_switch`` and the
    scenarios are typed by, is the protocol ``pytest_san.protocols.Switch``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.connections: list[Connection] = []

    def _process(self, where: Node | Process | None, default: int, name: str) -> Process:
        if where is None:
            # The node of index ``default``, or the last one when the backend has fewer.
            return self.backend.nodes[:default + 1][-1].default_process
        # By the class's attributes: isinstance() on a runtime protocol reads every property before Python
        # 3.12 (``alive``, ``default_process``: each a round trip to a lab's agent).
        if _is_node(where):
            return where.default_process
        if _is_process(where):
            return where
        raise TypeError(f"{name} must be a node, a process or None, got {where!r:.80}")

    def connect(self, peer: Node | Process | None = None, process: Node | Process | None = None,
                **options: Any) -> Connection:
        """A connected socket pair between ``process`` (default: first node) and ``peer`` (second).

        All or nothing: every argument is checked before anything is built, and a connect that
        fails later (a registration refused, a receive queue too short) releases everything it
        had built -- its registrations, receives and both sockets -- before it raises.
        """
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"unknown connect() options: {', '.join(unknown)}")
        threshold = options.get("rdma_threshold")
        mode = options.get("rdma_mode", "auto")
        size = options.get("message_size", MESSAGE_SIZE)
        count = options.get("message_count", MESSAGE_COUNT)
        check_options(threshold, mode, size, count)
        a = self._process(process, 0, "process")
        b = self._process(peer, 1, "peer")
        sa, sb = self.backend.connect_sockets(a, b)
        conn = Connection(self, (sa, a), (sb, b), rdma_threshold=threshold, rdma_mode=mode,
                          message_size=size, message_count=count)
        self.connections.append(conn)
        return conn

    def close_all(self) -> None:
        """Close every connection this switch made (both ends); safe to call twice."""
        close_connections(self.connections)


def _has(obj: object, protocol: type) -> bool:
    """``obj``'s class, or its own attributes, have every public member of ``protocol`` (read from the
    classes and the instance's ``__dict__``: no property is evaluated)."""
    members = [name for name in vars(protocol) if not name.startswith("_")]
    return all(hasattr(type(obj), name) or name in getattr(obj, "__dict__", {}) for name in members)


def _is_node(obj: object) -> TypeGuard[Node]:
    return _has(obj, Node)


def _is_process(obj: object) -> TypeGuard[Process]:
    return _has(obj, Process)
