"""Closing a switch connection at any point of its traffic, by either end or both (R4, R11): the close
deregisters what no pending operation uses and raises nothing, a second close is harmless, a closed end takes
no more calls, and what the peer still reads is what was sent."""

from __future__ import annotations

import pytest

from pytest_san import Backend, SanError, WsaError
from pytest_san.spi.protocols import Switch, SwitchConnection, SwitchEndpoint

from .support import NEEDS_READ, TIMEOUT
from .watching import Watched

MODES = [pytest.param("read", marks=NEEDS_READ), "write"]
THRESHOLD = 4096


def _data(conn: SwitchConnection) -> tuple[bytes, bytes]:
    """Several messages' worth at most the threshold, and a transfer above it (the connection's own values)."""
    small = (bytes(range(200)) * 12)[:conn.rdma_threshold]
    return small, (bytes(range(251)) * (conn.rdma_threshold // 251 + 20))[:conn.rdma_threshold + 4096]


def _kinds(end: SwitchEndpoint) -> list[str]:
    return [r.kind for r in end.provider.registrations(end.socket)]


def _deregistered(conn: SwitchConnection, end: SwitchEndpoint, since: int) -> tuple[int, int]:
    """How many memory registrations and RDMA descriptors ``end`` deregistered in the trace after ``since``."""
    calls = [m for name, m in conn.trace[since:] if name == end.name]
    return calls.count("deregister_memory"), calls.count("deregister_rdma_memory")


def _close(conn: SwitchConnection, end: SwitchEndpoint, *, idle_regions: int = 0) -> None:
    """``end.close()``: it deregisters every RDMA descriptor it holds (no operation of its own uses one), at least
    ``idle_regions`` memory registrations (ones nothing ever used), and none that a pending operation uses (the
    provider would refuse: the close would raise). A second close does nothing; a closed end is WSAENOTSOCK."""
    kinds, since = _kinds(end), len(conn.trace)
    end.close()
    memory, rdma = _deregistered(conn, end, since)
    assert rdma == kinds.count("rdma")
    assert idle_regions <= memory <= kinds.count("memory")
    assert (end.name, "close_socket") in conn.trace[since:]
    end.close()
    assert conn.trace[-1] == (end.name, "close_socket")  # the second close asked the provider nothing
    with pytest.raises(SanError) as err:
        end.send(b"x")
    assert err.value.code is WsaError.WSAENOTSOCK
    try:
        moved = end.progress()
    except SanError as exc:
        assert exc.code is WsaError.WSAENOTSOCK
    else:
        assert moved is False  # a closed end moves nothing: its aborted operations are the provider's now
    assert conn.trace[-1] == (end.name, "close_socket")


def _prefix_after_close(closer: SwitchEndpoint, peer: SwitchEndpoint, sent: bytes) -> None:
    """What ``peer`` still reads of ``closer``'s stream, if anything, is what was sent, in order."""
    try:
        got = peer.recv(len(sent), timeout=TIMEOUT)
    except SanError:
        return
    assert got == sent


@pytest.mark.san_rule("R4", "R11")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("closer", ["local", "remote", "both"])
@pytest.mark.parametrize("stage", ["announced", "offered", "arrived", "queued", "drained"])
def test_close_at_any_stage_of_a_transfer(san_switch: Switch, mode: str, closer: str, stage: str) -> None:
    """Small and large sends, then a close at one stage of their way: announced (the receiver has not moved), the
    receiver offered or read (it moved once), arrived (the receiver read part), queued (more small sends than the
    receiver has receives for), drained (everything read)."""
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode=mode, message_size=256, message_count=3)
    a, b = conn.local, conn.remote
    small, large = _data(conn)
    sent = small + large
    a.send(small)
    a.send(large)
    read = 0
    if stage == "offered":
        b.progress()
    elif stage == "arrived":
        read = len(small) // 2
    elif stage == "queued":
        for _ in range(3):
            a.send(small)
        sent += small * 3
    elif stage == "drained":
        read = len(sent)
    assert b.recv(read, timeout=TIMEOUT) == sent[:read]
    never_sent = stage == "announced"  # b has sent nothing yet: its send region was never used
    if closer == "local":
        _close(conn, a)
        _prefix_after_close(a, b, sent[read:])
        _close(conn, b)
    elif closer == "remote":
        _close(conn, b, idle_regions=int(never_sent))
        _close(conn, a)
    else:
        conn.close()
        for end in (a, b):
            end.close()
    assert conn.trace.count(("local", "close_socket")) == conn.trace.count(("remote", "close_socket")) == 1


@pytest.mark.san_rule("R11")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("closer", ["sender", "receiver"])
def test_close_while_the_switch_has_operations_held(san_switch: Switch, san_backend: Backend, mode: str,
                                                    closer: str) -> None:
    """The switch's own operations pending at close (held, capability ``faults``): a send, the receiver's RDMA read
    of a large transfer or the sender's RDMA write into the receiver's sink. Close deregisters nothing they use
    (the provider would refuse: close would raise) and everything else, and the operations end ABORTED."""
    faults = san_backend.faults
    assert faults is not None
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode=mode, message_size=256, message_count=3)
    a, b = conn.local, conn.remote
    _, large = _data(conn)
    # The side that moves the large transfer's bytes: the receiver (RdmaRead) or the sender (RdmaWrite).
    mover = b if mode == "read" else a
    regions = _kinds(mover).count("memory")  # its rings: two, or however many this switch keeps
    if mode == "write":
        a.send(large)
    faults.hold(mover.socket)
    if mode == "read":
        a.send(large)
    conn.run_until(lambda: _kinds(mover).count("memory") > regions, TIMEOUT, "the RDMA's local registration")
    faults.hold(a.socket)
    a.send(b"held")  # a send of a's pending
    first = a if closer == "sender" else b
    _close(conn, first)
    faults.release(mover.socket)
    faults.release(a.socket)
    _close(conn, b if first is a else a)


@pytest.mark.san_rule("R4", "R11")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize("mode", MODES)
def test_a_dropped_link_fails_both_ends_and_close_releases(san_switch: Switch, san_backend: Backend,
                                                          mode: str) -> None:
    """The link under a connection with transfers on their way drops: a receive on either end then fails with a
    SanError (never a hang, never bytes that were not sent), and closing both ends raises nothing."""
    faults = san_backend.faults
    assert faults is not None
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode=mode, message_size=256, message_count=3)
    a, b = conn.local, conn.remote
    small, large = _data(conn)
    a.send(small)
    b.send(small)
    a.send(large)
    faults.drop_link(a.process.node, b.process.node)
    for end in (a, b):
        for _ in range(conn.message_count + 2):  # more receives than either end posted: each one fails
            with pytest.raises(SanError):
                end.recv(len(small) + len(large) + 1, timeout=TIMEOUT)
    faults.restore_link(a.process.node, b.process.node)
    conn.close()
    conn.close()


@pytest.mark.san_rule("R10", "R11")
@pytest.mark.san_requires("faults")
def test_flush_waits_for_an_rdma_write_in_flight(san_switch: Switch, san_backend: Backend) -> None:
    """``flush`` returns only once every large transfer has finished: with the sender's RDMA write held (capability
    ``faults``) it times out, and once released it finishes and the receiver has every byte."""
    faults = san_backend.faults
    assert faults is not None
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode="write", message_size=256, message_count=3)
    a, b = conn.local, conn.remote
    _, large = _data(conn)
    regions = _kinds(a).count("memory")
    a.send(large)
    faults.hold(a.socket)
    try:
        conn.run_until(lambda: _kinds(a).count("memory") > regions, TIMEOUT, "the RDMA write's registration")
        with pytest.raises(TimeoutError):
            conn.flush(timeout=0.2)  # held until released below, however long it waits
    finally:
        faults.release(a.socket)
    conn.flush(timeout=TIMEOUT)
    assert b.recv(len(large), timeout=TIMEOUT) == large


REFUSED = "refused by the scenario"


def _close_left_sockets(watched: Watched) -> None:
    """Close each socket the switch made a call on and left open (a switch may stop at a refused step)."""
    for call in watched.calls:
        node = next(n for n in watched.nodes if n.name == call.node)
        if not call.socket.closed:
            node.provider.close_socket(call.socket)


@pytest.mark.san_rule("R11")
def test_a_deregistration_the_provider_refuses_fails_close_all(watched_switch: tuple[Switch, Watched]) -> None:
    """The provider refuses the first deregistration of ``close_all`` (a SanError no public call could make a
    correct provider raise): ``close_all`` raises one SanError with a code and naming it; only a socket already
    gone (WSAENOTSOCK) is no failure."""
    switch, watched = watched_switch
    conn = switch.connect()
    conn.local.send(b"a message each way")
    conn.remote.send(b"a message each way")
    assert conn.remote.recv(18, timeout=TIMEOUT) == conn.local.recv(18, timeout=TIMEOUT)
    conn.flush(timeout=TIMEOUT)
    watched.refuse("deregister_memory", SanError(WsaError.WSAEFAULT, REFUSED))
    try:
        with pytest.raises(SanError) as info:
            switch.close_all()
        assert isinstance(info.value.code, WsaError) and info.value.code is not WsaError.WSAENOTSOCK
        assert REFUSED in str(info.value)
    finally:
        _close_left_sockets(watched)


@pytest.mark.san_rule("R11")
@pytest.mark.parametrize("at", [0, 1, 2, 3], ids=lambda at: f"registration-{at}")
def test_a_connect_refused_whose_release_is_refused_too_raises_a_san_error(
        watched_switch: tuple[Switch, Watched], at: int) -> None:
    """A connect whose ``at``-th registration is refused, and whose first release of what it built is refused
    too: the connect raises a SanError (its own failure or the release's), never another exception in its place;
    the switch goes on connecting."""
    switch, watched = watched_switch
    watched.refuse("register_memory", SanError(WsaError.WSAENOBUFS, REFUSED), after=at)
    watched.refuse("deregister_memory", SanError(WsaError.WSAEFAULT, REFUSED))
    try:
        with pytest.raises(SanError) as info:
            switch.connect()
        assert info.value.code in (WsaError.WSAENOBUFS, WsaError.WSAEFAULT)
    finally:
        watched.refuse("register_memory", SanError(WsaError.WSAENOBUFS, REFUSED), times=0)
        watched.refuse("deregister_memory", SanError(WsaError.WSAEFAULT, REFUSED), times=0)
        _close_left_sockets(watched)
    conn = switch.connect()
    conn.local.send(b"and the next connect works")
    assert conn.remote.recv(26, timeout=TIMEOUT) == b"and the next connect works"
