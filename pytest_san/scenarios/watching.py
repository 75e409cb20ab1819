"""A backend whose nodes' providers write down every call made through them, for a switch made over it.

A connection's ``trace`` is the switch's own account of its calls, and a connect that failed has no connection to
read it from. A switch made over ``Watched(backend)`` reaches its providers through the nodes and processes this
backend hands out, so each call it makes lands in ``calls`` as it is made: the scenario reads what the switch did
itself. Everything else is the wrapped backend's, unchanged.

``refuse`` makes the next calls of a method fail with a given error before they reach the provider: a provider
that refuses, say, a deregistration, which no public call could make a correct provider do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pytest_san import Backend, Node, Process

SOCKET_CALLS = frozenset({
    "register_memory", "deregister_memory", "register_rdma_memory", "deregister_rdma_memory", "rdma_write",
    "rdma_read", "send", "recv", "close_socket", "getsockopt",
})
"""The provider's calls whose first argument is a socket (CONTRACT.md section 4)."""
USES = frozenset({"send", "recv", "rdma_write", "rdma_read"})
"""Calls whose local entries (``(buffer, handle)`` pairs, the first argument after the socket) use handles."""


@dataclasses.dataclass
class Call:
    node: str
    method: str
    socket: Any
    args: tuple[Any, ...]
    result: Any = None
    error: BaseException | None = None


class _Provider:
    def __init__(self, inner: Any, node: str, watched: Watched) -> None:
        self._inner, self._node, self._watched = inner, node, watched
        self._calls = watched.calls

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if name not in SOCKET_CALLS:
            return found

        def watched(socket: Any, *args: Any) -> Any:
            at = len(self._calls)
            self._calls.append(Call(self._node, name, socket, args))  # in the order made, then its outcome
            try:
                self._watched.refusal(name)
                result = found(socket, *args)
            except BaseException as exc:
                self._calls[at] = dataclasses.replace(self._calls[at], error=exc)
                raise
            self._calls[at] = dataclasses.replace(self._calls[at], result=result)
            return result

        return watched


class _Node:
    def __init__(self, watched: Watched, inner: Node) -> None:
        self._watched, self._inner = watched, inner
        self.provider = _Provider(inner.provider, inner.name, watched)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def default_process(self) -> _Process:
        return self._watched.process(self._inner.default_process)

    def spawn_process(self) -> _Process:
        return self._watched.process(self._inner.spawn_process())


class _Process:
    def __init__(self, watched: Watched, inner: Process) -> None:
        self._watched, self.inner = watched, inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def node(self) -> _Node:
        return self._watched.node(self.inner.node)


class Watched:
    """``backend`` with every provider call made through its nodes and processes in ``calls``; ``nodes``: only its
    first so many nodes (a smaller lab, made of the same hosts)."""

    def __init__(self, backend: Backend, nodes: int | None = None) -> None:
        self._inner = backend
        self.calls: list[Call] = []
        self._refusing: dict[str, list[BaseException | None]] = {}
        self._nodes: dict[int, _Node] = {}
        self._processes: dict[int, _Process] = {}
        self.nodes = [self.node(node) for node in backend.nodes[:nodes]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def node(self, inner: Node) -> _Node:
        return self._nodes.setdefault(id(inner), _Node(self, inner))

    def process(self, inner: Process) -> _Process:
        return self._processes.setdefault(id(inner), _Process(self, inner))

    def refuse(self, method: str, error: BaseException, times: int = 1, after: int = 0) -> None:
        """Once ``after`` more calls of ``method`` (on any node) went through, the next ``times`` raise ``error``
        and reach no provider; ``times=0`` ends a refusal."""
        self._refusing[method] = [None] * after + [error] * times if times else []

    def refusal(self, method: str) -> None:
        """Raise the refusal waiting for ``method``, if its turn has come."""
        waiting = self._refusing.get(method)
        if waiting:
            error = waiting.pop(0)
            if error is not None:
                raise error

    def connect_sockets(self, a: Any, b: Any) -> Any:
        return self._inner.connect_sockets(getattr(a, "inner", a), getattr(b, "inner", b))


def left_registered(calls: Sequence[Call]) -> list[str]:
    """R11's first clause, read from ``calls``: each register_memory region the switch left registered on a socket
    it then closed, though no operation on that socket had used it."""
    found = []
    for at, close in enumerate(calls):
        if close.method != "close_socket" or close.error is not None:
            continue
        mine = [c for c in calls[:at] if c.socket == close.socket and c.node == close.node]
        handles = [c.result for c in mine if c.method == "register_memory" and c.error is None]
        for c in mine:
            if c.method == "deregister_memory" and c.error is None and c.args[0] in handles:
                handles.remove(c.args[0])
            if c.method in USES:
                handles = [h for h in handles if all(entry[1] != h for entry in c.args[0])]
        found += [f"{close.node}: {h!r:.60} registered on {close.socket!r:.60}, closed without deregistering it"
                  for h in handles]
    return found
