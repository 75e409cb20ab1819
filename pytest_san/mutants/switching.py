"""What the corpus's switch entries are built from: a switch that forwards ``pytest_san.spi.protocols.Switch`` to
the one it wraps, changing only what its entry is about.

An entry over pytest-san's own switch (``pytest_san.switch.Switch``) changes the options ``connect`` passes
(``adjust``), what a connection declares (``declare``) or what an endpoint's ``close`` does (``EndpointView``),
through the switch's public constructor and options only, so it keeps working whatever the switch's internals
become. An entry over ``pytest_san.examples.simple_switch`` subclasses that switch's endpoint instead (its
methods are the seams).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ..closing import close_connections
from ..spi.protocols import Backend, Node, Process, Switch, SwitchConnection, SwitchEndpoint


class EndpointView:
    """An endpoint of the wrapped switch, forwarded; a subclass overrides what its entry changes."""

    def __init__(self, inner: SwitchEndpoint, conn: ConnectionView) -> None:
        self.inner = inner
        self.conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def close(self) -> None:
        self.inner.close()


class ConnectionView:
    """A connection of the wrapped switch, forwarded, with the parameters ``declared`` in place of its own."""

    endpoint: type[EndpointView] = EndpointView

    def __init__(self, inner: SwitchConnection, declared: dict[str, int]) -> None:
        self.inner = inner
        self.declared = declared
        self.local: SwitchEndpoint = self.endpoint(inner.local, self)
        self.remote: SwitchEndpoint = self.endpoint(inner.remote, self)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "declared"):
            raise AttributeError(name)
        if name in self.declared:
            return self.declared[name]
        return getattr(self.inner, name)

    def close(self) -> None:
        self.local.close()
        self.remote.close()


class SwitchWrapper:
    """Forwards ``connect`` (its options first through ``adjust``) and ``close_all`` to ``inner``."""

    view: type[ConnectionView] | None = None  # connections are returned as they are unless a view is named

    def __init__(self, inner: Switch) -> None:
        self.inner = inner
        self.connections: list[SwitchConnection] = []

    def adjust(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options to pass on instead of those asked."""
        return options

    def declare(self, conn: SwitchConnection, asked: dict[str, Any]) -> dict[str, int]:
        """The parameters the connection is to declare in place of its own."""
        return {}

    def connect(self, peer: Node | Process | None = None, process: Node | Process | None = None,
                **options: Any) -> SwitchConnection:
        conn = self.inner.connect(peer, process, **self.adjust(dict(options)))
        if self.view is not None:
            conn = self.view(conn, self.declare(conn, options))
        self.connections.append(conn)
        return conn

    def close_all(self) -> None:
        try:
            close_connections(self.connections)  # the views' ends first (an entry's close may differ)
        finally:
            self.inner.close_all()


def usable(options: dict[str, Any], name: str, low: int, high: int, *, none: bool = False) -> bool:
    """Whether ``options`` leaves ``name`` out or gives a value the switch takes (a whole number in [low, high], or
    None where ``none``): an entry changes only such values, and passes any other on for the switch to refuse
    (a bad option must still be refused)."""
    if name not in options:
        return True
    value = options[name]
    return (none and value is None) or (type(value) is int and low <= value <= high)


def own_switch(backend: Backend) -> Switch:
    from ..switch import Switch as OwnSwitch  # the switch as pytest-san ships it

    return OwnSwitch(backend)


def switch_hook(make: Callable[[Backend], object]) -> Callable[..., object]:
    """The ``pytest_san_make_switch`` of an entry: ``make(backend)`` is the switch under test."""

    def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> object:
        return make(backend)

    return pytest_san_make_switch


def traced(end: SwitchEndpoint, conn: SwitchConnection, method: str) -> None:
    """Note in ``conn``'s trace a provider call an entry made itself on ``end``'s socket (the trace is a list)."""
    trace: Sequence[tuple[str, str]] = conn.trace
    assert isinstance(trace, list)
    trace.append((end.name, method))


def simple_switch_hook(endpoint: type[Any]) -> Callable[..., object]:
    """The ``pytest_san_make_switch`` of an entry over ``pytest_san.examples.simple_switch``: its switch, each
    end an ``endpoint`` (a subclass of ``SimpleEndpoint`` with the entry's bug)."""
    from ..examples.simple_switch import SimpleConnection, SimpleSwitch

    connection = type(f"{endpoint.__name__}Connection", (SimpleConnection,), {"endpoint": endpoint})
    switch = type(f"{endpoint.__name__}Switch", (SimpleSwitch,), {"connection": connection})
    return switch_hook(switch)


__all__ = ["ConnectionView", "EndpointView", "SwitchWrapper", "own_switch", "simple_switch_hook", "switch_hook",
           "traced", "usable"]
