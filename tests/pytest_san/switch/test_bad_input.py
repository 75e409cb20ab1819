"""The switch is all or nothing (issue 9, CONTRACT.md section 4): a connect that fails releases what it built.

Run on the emulator, where every socket, registration and proxy allocation can be counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from pytest_san import Access, SanError, Switch, WsaError
from pytest_san.spi.emulator import EmulatorBackend
from pytest_san.spi.emulator.provider import QUEUE_DEPTH


@pytest.fixture
def backend() -> Iterator[EmulatorBackend]:
    b = EmulatorBackend()
    yield b
    b.close()


def _state(backend: EmulatorBackend) -> tuple[object, ...]:
    return (backend.leaks(), [s for s in backend.sockets() if not s.closed],
            [n.base_proxy.live_allocations() for n in backend.nodes],
            [len(p.sockets) for n in backend.nodes for p in n.processes if p.alive and not
             all(s.closed for s in p.sockets)])


def _works(switch: Switch) -> None:
    """A connect after the failed one still works, sends, and closes clean."""
    conn = switch.connect()
    conn.local.send(b"still fine")
    assert conn.remote.recv(10) == b"still fine"


@pytest.mark.parametrize("side", [0, 1])
def test_connect_failing_on_a_refused_allocation_releases_everything(backend: EmulatorBackend, side: int) -> None:
    switch = Switch(backend)
    before = _state(backend)
    backend.faults.fail_allocations(backend.nodes[side], 1)  # side 1: after the local end is complete
    with pytest.raises(SanError) as info:
        switch.connect()
    assert info.value.code is WsaError.WSAENOBUFS
    assert _state(backend) == before  # no registration, no open socket, no proxy allocation
    assert backend.leaks() == [] and switch.connections == []
    _works(switch)
    switch.close_all()
    assert backend.leaks() == []


def test_connect_failing_on_a_full_receive_queue_releases_everything(backend: EmulatorBackend) -> None:
    switch = Switch(backend)
    before = _state(backend)
    with pytest.raises(SanError) as info:
        switch.connect(message_count=QUEUE_DEPTH + 1, message_size=64)  # more receives than the queue holds
    assert info.value.code is WsaError.WSAENETDOWN
    assert _state(backend) == before
    _works(switch)
    switch.close_all()
    assert backend.leaks() == []


def test_connect_to_a_dead_process_builds_nothing(backend: EmulatorBackend) -> None:
    switch = Switch(backend)
    victim = backend.nodes[1].spawn_process()
    victim.kill()
    before = _state(backend)
    with pytest.raises(SanError):
        switch.connect(peer=victim)
    assert _state(backend) == before


@pytest.mark.parametrize(("options", "error"), [
    ({"bogus": 1}, TypeError),
    ({"rdma_threshold": 1024, "messagesize": 64}, TypeError),
    ({"message_size": "4096"}, TypeError),
    ({"message_size": 4096.0}, TypeError),
    ({"message_size": True}, TypeError),
    ({"message_size": 8}, ValueError),  # no room for a message header and a descriptor
    ({"message_size": 0}, ValueError),
    ({"message_size": 1 << 40}, ValueError),
    ({"message_count": 0}, ValueError),
    ({"message_count": -1}, ValueError),
    ({"message_count": None}, TypeError),
    ({"rdma_threshold": -1}, ValueError),
    ({"rdma_threshold": "big"}, TypeError),
    ({"rdma_threshold": 1.5}, TypeError),
    ({"rdma_mode": "fast"}, ValueError),
    ({"rdma_mode": None}, ValueError),
    ({"rdma_mode": ["read"]}, ValueError),
    ({"peer": "node1"}, TypeError),
    ({"peer": 1}, TypeError),
    ({"process": object()}, TypeError),
])
def test_connect_with_bad_arguments_raises_before_building_anything(backend: EmulatorBackend,
                                                                     options: dict[str, Any],
                                                                     error: type[Exception]) -> None:
    switch = Switch(backend)
    before = _state(backend)
    with pytest.raises(error):
        switch.connect(**options)
    assert _state(backend) == before and switch.connections == []
    _works(switch)
    switch.close_all()


def test_connect_to_a_node_of_another_backend_builds_nothing(backend: EmulatorBackend) -> None:
    other = EmulatorBackend(2)
    switch = Switch(backend)
    before = _state(backend)
    with pytest.raises(ValueError):
        switch.connect(peer=other.nodes[1])
    assert _state(backend) == before and other.sockets() == []


def test_endpoint_calls_refuse_bad_arguments_and_keep_working(backend: EmulatorBackend) -> None:
    switch = Switch(backend)
    conn = switch.connect()
    for data in (None, "text", 5, [b"x"]):
        with pytest.raises(TypeError):
            conn.local.send(data)  # type: ignore[arg-type]
    for nbytes, timeout in ((None, 1.0), (1.5, 1.0), (True, 1.0), ("4", 1.0), (4, "1"), (4, None)):
        with pytest.raises(TypeError):
            conn.remote.recv(nbytes, timeout)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        conn.remote.recv(-1)
    with pytest.raises(TypeError):
        conn.flush("soon")  # type: ignore[arg-type]
    conn.local.send(memoryview(b"abcd"))
    conn.local.send(bytearray(b"efgh"))
    assert conn.remote.recv(8) == b"abcdefgh"
    switch.close_all()
    assert backend.leaks() == []


def test_close_releases_the_rest_even_when_one_release_fails(backend: EmulatorBackend) -> None:
    switch = Switch(backend)
    conn = switch.connect()
    end = conn.local
    end.provider.deregister_memory(end.socket, end.send_handle)  # behind the switch's back
    with pytest.raises(SanError) as info:
        end.close()
    assert info.value.code is WsaError.WSAEINVAL
    assert end.socket.closed  # closed anyway: the provider released the receive region
    conn.remote.close()
    assert backend.leaks() == []


# -- found by the fuzz: small windows --------------------------------------------------------------------


@pytest.mark.parametrize("count", [3, 4, 5])
@pytest.mark.parametrize("size", [64, 4096])
def test_small_windows_carry_data_both_ways_and_then_fall_quiet(backend: EmulatorBackend, count: int,
                                                               size: int) -> None:
    """With two or three receive buffers a credit-only message used to answer the peer's credit-only
    message, for ever: the ends never went idle, and recv ignored its timeout while they chattered."""
    switch = Switch(backend)
    conn = switch.connect(message_count=count, message_size=size)
    for i in range(10):
        conn.local.send(bytes([i]) * (300 + i))
        conn.remote.send(bytes([i]) * (i + 1))
    assert conn.remote.recv(sum(300 + i for i in range(10)), timeout=5) == b"".join(
        bytes([i]) * (300 + i) for i in range(10))
    assert conn.local.recv(55, timeout=5) == b"".join(bytes([i]) * (i + 1) for i in range(10))
    conn.flush(5)
    assert not conn.progress()  # nothing left to say: no credit ping-pong
    switch.close_all()
    assert backend.leaks() == []


@pytest.mark.parametrize("count", [1, 2])
def test_windows_too_small_to_carry_data_are_refused(backend: EmulatorBackend, count: int) -> None:
    """One receive buffer can never carry data (the last credit is kept for credit-only messages)."""
    switch = Switch(backend)
    with pytest.raises(ValueError, match="message_count"):
        switch.connect(message_count=count)
    assert backend.leaks() == [] and backend.sockets() == []


def test_recv_times_out_even_while_the_ends_keep_moving(backend: EmulatorBackend,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    switch = Switch(backend)
    conn = switch.connect()
    monkeypatch.setattr(conn, "progress", lambda: True)  # a livelock: something always moves
    with pytest.raises(TimeoutError):
        conn.remote.recv(1, timeout=0.2)
    monkeypatch.undo()
    switch.close_all()


def test_calls_made_together_keep_each_outcome() -> None:
    """A batch in-process: each call in turn, a failure kept as its outcome without stopping the ones after it
    (what a batching backend does too)."""
    from pytest_san.batch import batch, first_error

    backend = EmulatorBackend()
    node = backend.nodes[0]
    process = node.default_process
    sock, _ = backend.connect_sockets(process, node.spawn_process())
    buf = process.alloc(64)
    with batch(backend) as b:
        made = [b.call(node.provider.register_memory, sock, buf, Access.READ),
                b.call(node.provider.register_memory, sock, buf, cast(Access, 9)), b.call(process.alloc, 16)]
    assert [later.error is None for later in made] == [True, False, True]
    failure = first_error(made)
    assert isinstance(failure, SanError) and failure.code is WsaError.WSAEINVAL
    assert [r.refs for r in node.provider.registrations(sock)] == [1]


def test_a_connect_whose_receives_cannot_all_be_posted_releases_everything() -> None:
    """The end's receives are posted together; one refused (the queue is full) undoes the whole connect."""
    backend = EmulatorBackend()
    switch = Switch(backend)
    with pytest.raises(SanError) as failed:
        switch.connect(message_count=QUEUE_DEPTH + 1)
    assert failed.value.code is WsaError.WSAENETDOWN
    assert backend.leaks() == [] and switch.connections == []
    assert all(node.proxy.live_allocations() == 0 for node in backend.nodes)
