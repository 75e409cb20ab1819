"""Closing a switch's connections: the one ``close_all`` of pytest-san's switch, of the example switch
(``pytest_san.examples.simple_switch``, which imports nothing of ``pytest_san.switch``) and of the mutation
corpus's switch wrapper."""

from __future__ import annotations

from typing import TypeVar

from .spi.contract import SanError, WsaError
from .spi.protocols import SwitchConnection

C = TypeVar("C", bound=SwitchConnection)


def close_connections(connections: list[C]) -> None:
    """Close both ends of every connection in ``connections``, then empty the list (a second call closes nothing).

    A socket already gone (WSAENOTSOCK) is no failure; any other SanError of an end's ``close`` is one line of a
    single SanError (WSAEINVAL) raised once every end has been tried, naming the end, its socket and the error.
    """
    errors: list[str] = []
    for conn in connections:
        for end in (conn.local, conn.remote):
            try:
                end.close()
            except SanError as exc:
                if exc.code is not WsaError.WSAENOTSOCK:
                    errors.append(f"{end.name} of {end.socket!r}: {exc}")
    connections.clear()
    if errors:
        raise SanError(WsaError.WSAEINVAL, "closing left errors: " + "; ".join(errors))
