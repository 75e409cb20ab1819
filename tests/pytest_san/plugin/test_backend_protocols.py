"""The optional backend protocols the fixtures check with ``isinstance`` (``EndsTests``, ``CountsRoundTrips``):
a backend whose class defines the method is taken at its word, one without it gets the plain path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_san import Leak
from pytest_san.plugin.fixtures import _end_test, round_trips
from pytest_san.spi.emulator.backend import EmulatorBackend
from pytest_san.spi.protocols import CountsRoundTrips, EndsTests


class Plain:
    """A backend with neither: leaks() then reset()."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def leaks(self) -> list[Leak]:
        self.calls.append("leaks")
        return [Leak("node0", "registration", "4096 bytes")]

    def reset(self) -> None:
        self.calls.append("reset")


class Ending(Plain):
    """A backend that ends tests itself and counts its round trips."""

    def end_test(self, close: Callable[[], None] | None = None) -> tuple[list[Leak], list[Exception]]:
        self.calls.append("end_test" if close is None else "end_test(close)")
        if close is not None:
            close()
        return [Leak("node1", "allocation", "8192 bytes")], []

    def round_trips(self) -> dict[str, int]:
        return {"lab1": 3}


class Switch:
    connections = ("one",)

    def __init__(self, backend: Plain) -> None:
        self.backend = backend

    def close_all(self) -> None:
        self.backend.calls.append("close_all")


def test_a_backend_that_defines_the_methods_is_each_protocol() -> None:
    assert isinstance(Ending(), EndsTests) and isinstance(Ending(), CountsRoundTrips)
    assert not isinstance(Plain(), EndsTests) and not isinstance(Plain(), CountsRoundTrips)


def test_the_emulator_is_neither() -> None:
    backend = EmulatorBackend(node_count=2)
    try:
        assert not isinstance(backend, EndsTests) and not isinstance(backend, CountsRoundTrips)
    finally:
        backend.close()


def test_round_trips_are_read_where_counted() -> None:
    assert round_trips(Ending()) == {"lab1": 3}
    assert round_trips(Plain()) is None


def test_the_leak_check_ends_the_test_through_end_test_where_the_backend_has_it() -> None:
    ending = Ending()
    switch: Any = Switch(ending)
    assert _end_test(ending, [switch]) == (["node1: allocation 8192 bytes"], None)
    assert ending.calls == ["end_test(close)", "close_all"]


def test_the_leak_check_asks_leaks_then_resets_where_it_has_not() -> None:
    plain = Plain()
    backend: Any = plain
    assert _end_test(backend, [Switch(plain)]) == (["node0: registration 4096 bytes"], None)
    assert plain.calls == ["leaks", "reset"]
