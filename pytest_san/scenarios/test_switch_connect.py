"""How a connect is made: between which processes, with which options, and all or nothing (R9, R10, R11).

Properties over shapes: every way of naming the two ends (a node, a process, the defaults), every option at
the edges of its range and outside it, and a connect failing at each of its registrations. Only the switch's
public calls (``connect``, the connection's ends, ``trace``, ``flush``, ``progress``) and the providers'.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from pytest_san import Backend, Node, Process, SanError, WsaError
from pytest_san.spi.protocols import Switch, SwitchConnection

from ..plugin.fixtures import make_switch
from .support import NEEDS_READ, TIMEOUT, fail_allocations
from .watching import Watched, left_registered

RDMA = ("register_rdma_memory", "rdma_read", "rdma_write")


def _rdma_calls(conn: SwitchConnection) -> list[tuple[str, str]]:
    return [t for t in conn.trace if t[1] in RDMA]


def _live(backend: Backend) -> list[int]:
    return [node.proxy.live_allocations() for node in backend.nodes]


def _same(a: Process, b: Process) -> bool:
    return a.pid == b.pid and a.node.name == b.node.name


def _carries(conn: SwitchConnection, data: bytes) -> None:
    """``data`` both ways, whole and in order."""
    conn.local.send(data)
    conn.remote.send(data[::-1])
    assert conn.remote.recv(len(data), timeout=TIMEOUT) == data
    assert conn.local.recv(len(data), timeout=TIMEOUT) == data[::-1]


# -- R9: the two ends are where the connect names them ------------------------------------------------

# (process, peer): what each names, as (node index, "node" | "default" | "spawned"), None for the default.
PLACES: list[tuple[tuple[int, str] | None, tuple[int, str] | None]] = [
    (None, None), (None, (1, "node")), (None, (2, "node")), (None, (1, "spawned")), (None, (0, "spawned")),
    ((0, "node"), (2, "spawned")), ((1, "node"), None), ((2, "spawned"), (1, "default")),
    ((0, "spawned"), (0, "default")), ((1, "default"), (2, "node")),
]


@pytest.mark.san_rule("R9")
@pytest.mark.san_nodes(3)
@pytest.mark.san_requires("third_host")
@pytest.mark.parametrize(("process", "peer"), PLACES, ids=[f"{p}-{q}" for p, q in PLACES])
def test_each_end_is_the_process_the_connect_names(san_switch: Switch, san_backend: Backend,
                                                   process: tuple[int, str] | None,
                                                   peer: tuple[int, str] | None) -> None:
    """A node means its default process, a process itself, nothing the first node (``process``) and the second
    (``peer``); each end registers its two regions on its own socket, and the pair carries data."""
    nodes = san_backend.nodes

    def named(place: tuple[int, str] | None, default: int) -> tuple[Node | Process | None, Process]:
        if place is None:
            return None, nodes[default].default_process
        index, kind = place
        node = nodes[index]
        if kind == "node":
            return node, node.default_process
        spawned = node.spawn_process() if kind == "spawned" else node.default_process
        return spawned, spawned

    where_a, want_a = named(process, 0)
    where_b, want_b = named(peer, 1)
    conn = san_switch.connect(peer=where_b, process=where_a)
    for end, want in ((conn.local, want_a), (conn.remote, want_b)):
        assert _same(end.process, want)
        assert end.provider is want.node.provider
        assert len([r for r in end.provider.registrations(end.socket) if r.kind == "memory"]) == 2
    _carries(conn, bytes(range(256)) * 3)


@pytest.mark.san_rule("R9")
@pytest.mark.parametrize("nodes", [1, 2])
def test_the_default_ends_on_a_backend_of_one_or_two_nodes(san_backend: Backend, request: pytest.FixtureRequest,
                                                          nodes: int) -> None:
    """``connect()`` over a backend of one node joins its default process to itself, over two the first node's to
    the second's (``protocols.Switch``): the switch made over the backend's first nodes alone."""
    view = Watched(san_backend, nodes=nodes)
    switch = make_switch(request.config, view)
    try:
        conn = switch.connect()
        assert _same(conn.local.process, view.nodes[0].default_process)
        assert _same(conn.remote.process, view.nodes[nodes - 1].default_process)
        _carries(conn, b"between the default processes")
    finally:
        switch.close_all()


class _AllocOnly:
    """A process's ``alloc`` and nothing else of it."""

    def alloc(self, length: int) -> None:
        raise AssertionError("a switch given something that is no process allocated from it")


# -- bad options: refused by name, before anything is built ------------------------------------------

BAD: list[tuple[dict[str, Any], str]] = [
    ({"bogus": 1}, "bogus"), ({"message_size": 4096, "messagecount": 8}, "messagecount"),
    ({"rdma_threshold": -1}, "rdma_threshold"), ({"rdma_threshold": "big"}, "rdma_threshold"),
    ({"rdma_threshold": 1.5}, "rdma_threshold"), ({"rdma_threshold": [1]}, "rdma_threshold"),
    ({"rdma_mode": "sideways"}, "rdma_mode"), ({"rdma_mode": None}, "rdma_mode"),
    ({"rdma_mode": ["read"]}, "rdma_mode"),
    ({"message_size": "4096"}, "message_size"), ({"message_size": 4096.0}, "message_size"),
    ({"message_size": True}, "message_size"), ({"message_size": 0}, "message_size"),
    ({"message_size": -4096}, "message_size"), ({"message_size": 1 << 40}, "message_size"),
    ({"message_count": None}, "message_count"), ({"message_count": 0}, "message_count"),
    ({"message_count": -8}, "message_count"), ({"message_count": 1 << 40}, "message_count"),
    ({"peer": "node1"}, "peer"), ({"peer": 1}, "peer"), ({"process": object()}, "process"),
    ({"process": b"node0"}, "process"), ({"peer": _AllocOnly()}, "peer"),
]


def _option_id(name: str, value: object) -> str:
    """The same id on every run (a bare object's repr names its address)."""
    return f"{name}={type(value).__name__}" if type(value) in (object, _AllocOnly) else f"{name}={value!r:.24}"


@pytest.mark.san_rule("R11")
@pytest.mark.parametrize(("options", "named"), BAD,
                         ids=[",".join(_option_id(n, v) for n, v in options.items()) for options, _ in BAD])
def test_a_bad_option_is_refused_by_name_and_builds_nothing(san_switch: Switch, san_backend: Backend,
                                                           options: dict[str, Any], named: str) -> None:
    before = _live(san_backend)
    with pytest.raises((TypeError, ValueError)) as info:
        san_switch.connect(**options)
    assert re.search(rf"\b{named}\b", str(info.value))  # the error names what is wrong
    assert san_backend.leaks() == [] and _live(san_backend) == before
    _carries(san_switch.connect(), b"the SAN is as good as before")


# -- R10: the threshold and the mode, at the edges of their range ------------------------------------

SHAPES = [  # (rdma_threshold, message_size, message_count); descriptors longer than a message travel in several
    (None, None, None), (0, None, None), (1, 128, 3), (100, 64 * 3 + 8, 4), (4096, 4096, 64),
    (None, 1 << 20, 3), (12_345, 1 << 20, 3), (64, 9, 3), (0, 16, 4), (100, 24, 8), (30, 33, 5),
]


@pytest.mark.san_rule("R10")
@pytest.mark.parametrize(("threshold", "size", "count"), SHAPES, ids=[str(s) for s in SHAPES])
def test_exactly_the_sends_above_the_threshold_move_by_rdma(san_switch: Switch, threshold: int | None,
                                                           size: int | None, count: int | None) -> None:
    """Sends of at most ``rdma_threshold`` bytes travel in messages, longer ones by RDMA; without a threshold
    the switch uses its own (pytest-san's: the provider's SO_RDMA_THRESHOLD_SIZE). Every option in its range is
    usable (a threshold of 0: every send by RDMA), and what the connection uses is what it says."""
    given = (("rdma_threshold", threshold), ("message_size", size), ("message_count", count))
    options: dict[str, Any] = {k: v for k, v in given if v is not None}
    conn = san_switch.connect(**options)
    a, b = conn.local, conn.remote
    if threshold is not None:  # without one, a switch may use its own (pytest_san.spi.protocols.Switch)
        assert conn.rdma_threshold == threshold
    rng = random.Random(f"{threshold}-{size}-{count}")
    limit = conn.rdma_threshold
    for n in sorted({1, limit, limit + 1, rng.randint(1, 2 * limit + 2)} - {0}):
        before = len(_rdma_calls(conn))
        data = rng.randbytes(n)
        a.send(data)
        assert b.recv(n, timeout=TIMEOUT) == data
        conn.flush(timeout=TIMEOUT)
        assert (len(_rdma_calls(conn)) > before) is (n > limit), f"{n} bytes, threshold {limit}"
        for end in (a, b):  # the transfer's registrations are gone: only the two regions are left
            assert len(end.provider.registrations(end.socket)) == 2


@pytest.mark.san_rule("R10")
@pytest.mark.parametrize("mode", [pytest.param("read", marks=NEEDS_READ), "write"])
def test_a_mode_asked_for_is_the_mode_used(san_switch: Switch, mode: str) -> None:
    """``rdma_mode="read"``: the receiver reads the sender's READ descriptor; ``"write"``: the sender writes
    into the receiver's WRITE descriptor, even when the receiver could read."""
    conn = san_switch.connect(rdma_threshold=1024, rdma_mode=mode)
    data = random.Random(mode).randbytes(5000)
    conn.local.send(data)
    assert conn.remote.recv(len(data), timeout=TIMEOUT) == data
    read, write = ("remote", "rdma_read") in conn.trace, ("local", "rdma_write") in conn.trace
    assert (read, write) == (mode == "read", mode == "write")


@pytest.mark.san_rule("R10", "R11")
@pytest.mark.parametrize("seed", range(6))
def test_flush_finishes_every_transfer(san_switch: Switch, seed: int) -> None:
    """Small and large sends from one end, nothing received yet: ``flush`` drives both ends until every
    transfer has finished: each large one moved by RDMA, and the sender holds only its two regions again."""
    rng = random.Random(seed)
    conn = san_switch.connect(rdma_threshold=rng.choice([512, 4096]), rdma_mode=rng.choice(["auto", "write"]))
    sender, receiver = (conn.local, conn.remote) if rng.random() < 0.5 else (conn.remote, conn.local)
    sent, large = bytearray(), 0
    for _ in range(rng.randint(1, 4)):
        data = rng.randbytes(rng.choice([10, conn.rdma_threshold + 1, 20_000]))
        sender.send(data)
        sent.extend(data)
        large += len(data) > conn.rdma_threshold
    conn.flush(timeout=TIMEOUT)
    assert len(sender.provider.registrations(sender.socket)) == 2
    assert len([t for t in conn.trace if t[1] in ("rdma_read", "rdma_write")]) >= large
    assert receiver.recv(len(sent), timeout=TIMEOUT) == sent
    conn.flush(timeout=TIMEOUT)
    for end in (sender, receiver):
        assert len(end.provider.registrations(end.socket)) == 2


@pytest.mark.san_rule("R9")
def test_progress_says_whether_anything_moved(conn: SwitchConnection) -> None:
    """``progress()``: True once it moved what a send started, False (not just falsy) once all is quiet."""
    conn.local.send(b"one message")
    deadline = time.monotonic() + TIMEOUT
    moved = False
    while not moved and time.monotonic() < deadline:  # completions may show late: until one round moves
        moved = conn.progress()
    assert moved is True
    assert conn.remote.recv(11, timeout=TIMEOUT) == b"one message"
    conn.flush(timeout=TIMEOUT)
    conn.run_until(lambda: conn.progress() is False, TIMEOUT, "the ends to fall quiet")


@pytest.mark.san_rule("R9")
def test_recv_of_what_was_never_sent_times_out_and_the_connection_goes_on(conn: SwitchConnection) -> None:
    with pytest.raises(TimeoutError):
        conn.remote.recv(1, timeout=0.05)
    _carries(conn, b"after the timeout")


# -- R11: a connect that fails at any of its registrations releases all it built ---------------------


@pytest.mark.san_rule("R11")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize("side", [0, 1])
@pytest.mark.parametrize("refused", [1, 3])
@pytest.mark.parametrize("after", [0, 1], ids=["at-the-first-region", "at-the-second-region"])
def test_a_connect_refused_at_any_registration_releases_everything(watched_switch: tuple[Switch, Watched],
                                                                   san_backend: Backend, side: int, refused: int,
                                                                   after: int) -> None:
    """The proxy of one end's node refuses ``refused`` allocations once ``after`` more have succeeded (capability
    ``faults``): so the end's first region is refused, or its second once the first was made (R9: two per
    connected socket, each pinned, R12). Either way the connect raises WSAENOBUFS having released every
    registration, receive and socket it had made, and the next connect works. The switch itself deregistered each
    region no operation used before it closed the socket (R11's first clause, read from the provider calls it
    made: closing would release them too, and hide it)."""
    san_switch, watched = watched_switch
    faults = san_backend.faults
    assert faults is not None
    node = san_backend.nodes[side]
    first = san_switch.connect()  # a connection that stays, untouched by the failure beside it
    before = _live(san_backend)
    regions = [len(end.provider.registrations(end.socket)) for end in (first.local, first.remote)]
    fail_allocations(faults, node, refused, after)
    made = len(watched.calls)
    try:
        with pytest.raises(SanError) as info:
            san_switch.connect()
    finally:
        faults.fail_allocations(node, 0)
    assert info.value.code is WsaError.WSAENOBUFS
    assert left_registered(watched.calls[made:]) == []
    assert _live(san_backend) == before
    assert [len(end.provider.registrations(end.socket)) for end in (first.local, first.remote)] == regions
    _carries(first, b"the connection beside it")
    _carries(san_switch.connect(), b"and a new one")


@pytest.mark.san_rule("R11")
@pytest.mark.san_requires("process_kill")
@pytest.mark.parametrize("which", ["peer", "process"])
def test_a_connect_to_a_process_that_is_gone_builds_nothing(san_switch: Switch, san_backend: Backend,
                                                            which: str) -> None:
    victim = san_backend.nodes[1].spawn_process()
    victim.kill()
    before = _live(san_backend)
    with pytest.raises(SanError):
        san_switch.connect(**{which: victim})
    assert san_backend.leaks() == [] and _live(san_backend) == before


# -- R11: many connections, closed in every order ------------------------------------------------------

ORDERS = list(range(6))


@pytest.mark.san_rule("R11")
@pytest.mark.parametrize("seed", ORDERS)
def test_connections_closed_in_any_order_release_only_their_own(san_switch: Switch, san_backend: Backend,
                                                                seed: int) -> None:
    """Several connections at once (between the same processes, and others); closing them one by one, in any
    order and by either end first, releases each one's sockets and registrations and leaves the others
    working, and ``close_all`` afterwards is safe, twice."""
    rng = random.Random(seed)
    nodes = san_backend.nodes
    base = _live(san_backend)
    conns = [san_switch.connect(peer=rng.choice([None, nodes[0], nodes[1].spawn_process()]))
             for _ in range(rng.randint(2, 4))]
    for conn in conns:
        _carries(conn, rng.randbytes(rng.choice([5, 3000])))
    rng.shuffle(conns)
    for i, conn in enumerate(conns):
        closers: list[Callable[[], None]] = [conn.close] if rng.random() < 0.5 else \
            [conn.remote.close, conn.local.close] if rng.random() < 0.5 else [conn.local.close, conn.remote.close]
        for close in closers:
            close()
        assert conn.local.socket.closed and conn.remote.socket.closed
        for other in conns[i + 1:]:
            for end in (other.local, other.remote):
                assert len(end.provider.registrations(end.socket)) == 2
            _carries(other, b"still here")
    san_switch.close_all()
    san_switch.close_all()
    assert san_backend.leaks() == []
    assert all(now <= was for now, was in zip(_live(san_backend), base, strict=True))
