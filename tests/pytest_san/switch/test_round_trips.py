"""pytest-san's own switch on a backend that costs calls as a lab does: every call made alone, and every batch, is
one round trip (hil makes a batch's calls together: one round trip per host, the hosts at once).

The switch makes its calls together where it can (``pytest_san.batch``): a connect's registrations and receives,
a message's slot and its send, and in each round of ``progress`` the question of whether each operation in flight
is done. A change that made each of them a round trip of its own would stay correct, and every scenario would
pass, while a lab run took several times longer; these tests fail instead. The bounds are the switch's counts
today (a change that needs one more round trip says so here); one call at a time costs several times more (a
ring of 16 receives a side alone is 32).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from pytest_san.batch import Call, Outcome, made_one_by_one
from pytest_san.spi.emulator import EmulatorBackend
from pytest_san.switch import Switch


class Trips:
    """Round trips counted; none inside a batch, whose calls travel together."""

    def __init__(self) -> None:
        self.count = 0
        self.batching = False

    def one(self) -> None:
        if not self.batching:
            self.count += 1


class _Op:
    def __init__(self, inner: Any, trips: Trips) -> None:
        self._inner, self._trips = inner, trips

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def done(self) -> bool:
        self._trips.one()
        return bool(self._inner.done())

    def wait(self, timeout: float | None = 10.0) -> Any:
        self._trips.one()
        return self._inner.wait(timeout)


class _Buffer:
    """A process's memory: on a lab its bytes are on the host, so each read and write is a round trip."""

    def __init__(self, inner: Any, trips: Trips) -> None:
        self.inner, self._trips = inner, trips

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def view(self, offset: int, length: int) -> _Buffer:
        return _Buffer(self.inner.view(offset, length), self._trips)

    def read(self, *args: Any) -> bytes:
        self._trips.one()
        return bytes(self.inner.read(*args))

    def write(self, *args: Any) -> Any:
        self._trips.one()
        return self.inner.write(*args)


def _unwrapped(value: Any) -> Any:
    """``value`` with every counted buffer in it (a scatter list's entries too) the provider's own again."""
    if isinstance(value, _Buffer):
        return value.inner
    if type(value) in (list, tuple):
        return type(value)(_unwrapped(v) for v in value)
    return value


class _Provider:
    def __init__(self, inner: Any, trips: Trips) -> None:
        self._inner, self._trips = inner, trips

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found):
            return found

        def counted(*args: Any) -> Any:
            self._trips.one()
            result = found(*_unwrapped(args))
            return _Op(result, self._trips) if hasattr(result, "wait") and hasattr(result, "done") else result

        counted.__name__ = name
        return counted


class _Node:
    def __init__(self, backend: Counting, inner: Any) -> None:
        self._backend, self._inner = backend, inner
        self.provider = _Provider(inner.provider, backend.trips)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def default_process(self) -> _Process:
        return _Process(self._backend, self._inner.default_process)


class _Process:
    def __init__(self, backend: Counting, inner: Any) -> None:
        self._backend, self.inner = backend, inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def node(self) -> _Node:
        return self._backend.node(self.inner.node)

    def alloc(self, length: int) -> _Buffer:
        self._backend.trips.one()
        return _Buffer(self.inner.alloc(length), self._backend.trips)


class Counting:
    """``backend`` with ``Batching``, its providers' calls and their operations' questions counted in ``trips``."""

    def __init__(self, backend: Any) -> None:
        self._inner = backend
        self.trips = Trips()
        self._nodes = {id(n): _Node(self, n) for n in backend.nodes}
        self.nodes = list(self._nodes.values())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def node(self, inner: Any) -> _Node:
        return self._nodes[id(inner)]

    def connect_sockets(self, a: Any, b: Any) -> Any:
        self.trips.one()
        return self._inner.connect_sockets(a.inner, b.inner)

    def make_together(self, calls: Sequence[Call]) -> list[Outcome]:
        self.trips.one()
        self.trips.batching = True
        try:
            return made_one_by_one(calls)
        finally:
            self.trips.batching = False


@pytest.fixture
def counting() -> Iterator[tuple[Switch, Counting]]:
    backend = EmulatorBackend(2)
    lab = Counting(backend)
    switch = Switch(lab)
    yield switch, lab
    switch.close_all()
    assert backend.leaks() == []
    backend.close()


def _trips(lab: Counting, step: Callable[[], object]) -> int:
    before = lab.trips.count
    step()
    return lab.trips.count - before


def test_a_connect_makes_its_calls_together(counting: tuple[Switch, Counting]) -> None:
    switch, lab = counting
    assert _trips(lab, lambda: switch.connect(message_count=16)) <= 3


def test_an_idle_progress_asks_every_operation_in_one_round_trip(counting: tuple[Switch, Counting]) -> None:
    switch, lab = counting
    conn = switch.connect(message_count=16)
    assert _trips(lab, conn.progress) == 1


def test_a_message_costs_a_few_round_trips_whatever_the_ring(counting: tuple[Switch, Counting]) -> None:
    switch, lab = counting
    conn = switch.connect(message_count=16)
    for _ in range(3):
        assert _trips(lab, lambda: conn.local.send(b"x" * 100)) <= 2  # the slot's bytes and the send: one batch
        assert _trips(lab, lambda: conn.remote.recv(100)) <= 5


def test_a_large_transfer_costs_a_few_round_trips(counting: tuple[Switch, Counting]) -> None:
    switch, lab = counting
    conn = switch.connect(message_count=16)
    data = bytes(range(256)) * 400
    assert _trips(lab, lambda: conn.local.send(data)) <= 5
    assert _trips(lab, lambda: conn.remote.recv(len(data))) <= 19
