"""What the switch registers and how it tears down: R9, R10, R11.

The switch is the one under test (``san_switch``: pytest-san's own, or a plugin's ``pytest_san_make_switch``), and
these scenarios call only what ``pytest_san.spi.protocols.Switch`` names. They judge it by the parameters each
connection declares (``rdma_threshold``, ``message_size``, ``message_count``): a switch may use others than asked.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from pytest_san import Access, Backend, SanError, Status, WsaError
from pytest_san.spi.protocols import Switch, SwitchConnection, SwitchEndpoint

from .support import NEEDS_READ, TIMEOUT, sink, source, window

THRESHOLD = 8192
"""The threshold the scenarios ask for; they judge by the one the connection declares."""
SHAPES = [{}, {"message_count": 3, "message_size": 128}, {"message_count": 32, "message_size": 4096},
          {"message_count": 5, "message_size": 1000}]
"""Rings to connect with: the switch's own, the smallest, a large one, one of an odd size."""


def _memory_regions(end: SwitchEndpoint) -> list[object]:
    return [r for r in end.provider.registrations(end.socket) if r.kind == "memory"]


def _rdma_calls(conn: SwitchConnection) -> list[tuple[str, str]]:
    return [t for t in conn.trace if t[1] in ("register_rdma_memory", "rdma_read", "rdma_write")]


def _registering(conn: SwitchConnection, since: int) -> list[tuple[str, str]]:
    """The registrations the switch asked for after its ``since`` first provider calls."""
    return [t for t in list(conn.trace)[since:] if t[1] in ("register_memory", "register_rdma_memory")]


# -- R9: two virtually contiguous regions per connected socket -------------------------------------


@pytest.mark.san_rule("R9")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "-".join(map(str, shape.values())) or "default")
def test_connect_registers_exactly_two_regions_per_side(san_switch: Switch, shape: dict[str, Any]) -> None:
    conn = san_switch.connect(**shape)
    for end in (conn.local, conn.remote):
        regions = end.provider.registrations(end.socket)
        assert len(regions) == 2 and all(r.kind == "memory" for r in regions)
        first, second = sorted(regions, key=lambda r: r.address)
        assert first.address + first.length <= second.address  # two separate ranges
        # One for sending (the provider reads it), one for posted receives (the provider writes it), each
        # holding a message at least.
        assert any(r.access & Access.READ for r in regions) and any(r.access & Access.WRITE for r in regions)
        assert min(r.length for r in regions) >= conn.message_size
    assert list(conn.trace).count(("local", "register_memory")) == 2
    assert list(conn.trace).count(("remote", "register_memory")) == 2


@pytest.mark.san_rule("R9", "R10")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "-".join(map(str, shape.values())) or "default")
def test_message_traffic_uses_only_the_two_regions(san_switch: Switch, shape: dict[str, Any]) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD, **shape)
    built = len(conn.trace)
    # Several messages each (6 KiB at most), not above the threshold.
    payload = (bytes(range(256)) * 24)[:min(conn.rdma_threshold, 3 * conn.message_size + 17)]
    small = payload[:100]
    rounds = 2 * conn.message_count + 4  # more messages than receive buffers: flow control must hold
    for _ in range(rounds):
        conn.local.send(payload)
        conn.remote.send(small)
    assert conn.remote.recv(len(payload) * rounds, timeout=TIMEOUT) == payload * rounds
    assert conn.local.recv(len(small) * rounds, timeout=TIMEOUT) == small * rounds
    for end in (conn.local, conn.remote):
        assert len(_memory_regions(end)) == 2
        assert len(end.provider.registrations(end.socket)) == 2
    assert _rdma_calls(conn) == []
    assert _registering(conn, built) == []  # every message went from (and into) the two regions of the connect


@pytest.mark.san_rule("R9", "R10")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize("mode", [pytest.param("read", marks=NEEDS_READ), "write"])
@pytest.mark.parametrize("seed", range(8))
def test_flow_control_survives_completions_seen_late(san_switch: Switch, san_backend: Backend, mode: str,
                                                     seed: int) -> None:
    """Traffic both ways, small and large, while either end's completions show late: operations posted on a held
    socket finish only when it is released (capability ``faults``), as on a provider that reports completions
    late. Every byte arrives, in order, whatever the message ring's size, and only the two regions carry messages:
    the two ends' flow control never waits on each other."""
    faults = san_backend.faults
    assert faults is not None
    rng = random.Random(seed)
    count, size = rng.choice([3, 4, 8]), rng.choice([128, 1024, 4096])
    threshold = rng.choice([size, 4 * size])
    conn = san_switch.connect(rdma_threshold=threshold, rdma_mode=mode, message_count=count, message_size=size)
    count, size, threshold = conn.message_count, conn.message_size, conn.rdma_threshold  # what it uses
    ends = (conn.local, conn.remote)
    sent: tuple[bytearray, bytearray] = (bytearray(), bytearray())  # what each end sent
    large = False
    for round_ in range(8):
        # The first round holds both ends while each sends more messages than the ring holds (every credit is
        # spent before either end sees the other's messages); the others are random.
        if round_ == 0:
            held, pieces = list(ends), [(which, threshold) for which in (0, 1) for _ in range(count)]
        else:
            held = [end for end in ends if rng.random() < 0.75]
            # Messages (at times several rings' worth), or a transfer above the threshold (by RDMA).
            sizes = [1, size, 2 * count * size, 3 * count * size, threshold + 1 + rng.randrange(3 * size)]
            pieces = [(rng.randrange(2), rng.choice(sizes)) for _ in range(rng.randint(2, 5))]
        for end in held:
            faults.hold(end.socket)
        for which, n in pieces:
            large = large or n > threshold
            data = rng.randbytes(n)
            ends[which].send(data)
            sent[which].extend(data)
            rng.choice(ends).progress()
        rng.shuffle(held)
        for end in held:
            faults.release(end.socket)
    assert conn.remote.recv(len(sent[0]), timeout=TIMEOUT) == sent[0]
    assert conn.local.recv(len(sent[1]), timeout=TIMEOUT) == sent[1]
    conn.flush(timeout=TIMEOUT)
    for end in ends:  # messages used only the two regions; the transfers' registrations are gone again
        assert len(_memory_regions(end)) == 2 and len(end.provider.registrations(end.socket)) == 2
    assert bool(_rdma_calls(conn)) is large


# -- R10: RDMA only above the threshold, by RdmaRead or (peer without it) RdmaWrite ----------------


@pytest.mark.san_rule("R10")
@NEEDS_READ
@pytest.mark.parametrize("over", [1, 200_000 - THRESHOLD, (3 << 20) - THRESHOLD])
def test_large_transfer_moves_by_rdma_read(san_switch: Switch, over: int) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD)
    size = conn.rdma_threshold + over
    data = (bytes(range(251)) * (size // 251 + 1))[:size]
    conn.local.send(data)
    # The sender exposed its data as a READ descriptor; nothing is read before the receiver asks.
    assert ("local", "register_rdma_memory") in conn.trace
    assert conn.remote.recv(size, timeout=TIMEOUT) == data
    assert ("remote", "rdma_read") in conn.trace and ("local", "rdma_write") not in conn.trace
    conn.flush(timeout=TIMEOUT)
    for end in (conn.local, conn.remote):  # the transfer's registrations are gone again
        assert len(end.provider.registrations(end.socket)) == 2


@pytest.mark.san_rule("R10")
@pytest.mark.parametrize("over", [1, (1 << 20) - THRESHOLD])
def test_large_transfer_moves_by_rdma_write_when_peer_lacks_read(san_switch: Switch, over: int) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode="write")
    size = conn.rdma_threshold + over
    data = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    conn.local.send(data)
    assert conn.remote.recv(size, timeout=TIMEOUT) == data
    assert ("remote", "register_rdma_memory") in conn.trace  # the peer offered a WRITE descriptor
    assert ("local", "rdma_write") in conn.trace and ("remote", "rdma_read") not in conn.trace
    conn.flush(timeout=TIMEOUT)
    for end in (conn.local, conn.remote):
        assert len(end.provider.registrations(end.socket)) == 2


@pytest.mark.san_rule("R10")
@pytest.mark.parametrize("mode", ["auto", "write"])
@pytest.mark.parametrize("asked", [THRESHOLD, 1000, None], ids=["8192", "1000", "provider"])
def test_threshold_boundary_and_mixed_order(san_switch: Switch, mode: str, asked: int | None) -> None:
    """Pieces at, around and far from the threshold the connection declares (the one asked for, an odd one, or
    the provider's SO_RDMA_THRESHOLD_SIZE): exactly those above it go by RDMA, in order with the others."""
    conn = san_switch.connect(rdma_threshold=asked, rdma_mode=mode)
    t = conn.rdma_threshold
    sizes = [t, t + 1, min(10, t), max(50_000, 2 * t + 2), max(t - 1, 0), min(3, t), t + 2]
    pieces = [bytes([0x61 + i]) * n for i, n in enumerate(sizes)]
    for piece in pieces:
        conn.local.send(piece)
    assert conn.remote.recv(sum(map(len, pieces)), timeout=TIMEOUT) == b"".join(pieces)
    # Only the pieces above the threshold went by RDMA: each exposed one descriptor, the sender's (RdmaRead)
    # or the receiver's (RdmaWrite, when the receiver lacks RdmaRead).
    registered = [call for call in conn.trace if call[1] == "register_rdma_memory"]
    assert len(registered) == sum(n > t for n in sizes)


@pytest.mark.san_rule("R10")
def test_auto_mode_follows_the_peer_capability(san_switch: Switch) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD)
    size = 2 * conn.rdma_threshold + 1
    conn.local.send(b"z" * size)
    assert conn.remote.recv(size, timeout=TIMEOUT) == b"z" * size
    used_read = ("remote", "rdma_read") in conn.trace
    assert used_read is conn.remote.provider.supports_rdma_read


# -- R11: close deregisters what is idle; the provider releases the rest ---------------------------


@pytest.mark.san_rule("R11")
def test_close_releases_everything(san_switch: Switch) -> None:
    conn = san_switch.connect()
    a, b = conn.local, conn.remote
    base_a, base_b = a.proxy.live_allocations(), b.proxy.live_allocations()
    conn.local.send(b"hello")
    assert conn.remote.recv(5) == b"hello"
    conn.close()
    assert a.socket.closed and b.socket.closed
    # Nothing of these sockets is registered any more, and the proxies gave the memory back.
    assert a.proxy.live_allocations() <= base_a - 2 and b.proxy.live_allocations() <= base_b - 2


@pytest.mark.san_rule("R11")
def test_close_with_operations_in_flight(san_switch: Switch) -> None:
    conn = san_switch.connect()
    a = conn.local
    before = a.proxy.live_allocations()
    g, handle = sink(a, 1024)
    pending = a.provider.recv(a.socket, [(g.inner, handle)])  # in flight: nothing will arrive
    _, h2 = source(a, b"q" * 512)  # the application may deregister its own before close
    a.provider.deregister_memory(a.socket, h2)
    _, desc = window(a, 4096, Access.READ)
    assert not pending.done()
    a.close()
    done = pending.wait(timeout=TIMEOUT)
    assert done.status is Status.ABORTED
    # The switch deregistered the idle send region before it closed the socket; the busy receive region and the
    # application's registrations were released by the provider at close.
    trace = list(conn.trace)
    assert ("local", "deregister_memory") in trace
    if ("local", "close_socket") in trace:
        assert trace.index(("local", "deregister_memory")) < trace.index(("local", "close_socket"))
    assert a.proxy.live_allocations() <= before - 2
    with pytest.raises(SanError) as err:
        a.provider.deregister_rdma_memory(a.socket, desc)
    assert err.value.code in (WsaError.WSAENOTSOCK, WsaError.WSAEINVAL)


@pytest.mark.san_rule("R11")
@NEEDS_READ
def test_close_during_a_large_transfer(san_switch: Switch) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD)
    a = conn.local
    before = a.proxy.live_allocations()
    # The READ descriptor stays registered until the peer has read it.
    a.send(b"L" * max(100_000, conn.rdma_threshold + 1))
    assert len(a.provider.registrations(a.socket)) == 3
    conn.close()
    assert a.proxy.live_allocations() <= before - 2


@pytest.mark.san_rule("R11")
def test_close_while_the_receiver_offers_a_write_descriptor(san_switch: Switch) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode="write")
    a, b = conn.local, conn.remote
    before = b.proxy.live_allocations()
    # Announced; the receiver registers a WRITE descriptor for it when it sees that.
    a.send(b"W" * max(100_000, conn.rdma_threshold + 1))
    deadline = time.monotonic() + TIMEOUT
    while len(b.provider.registrations(b.socket)) < 3:  # only the receiver moves: the write never starts
        assert time.monotonic() < deadline, "the receiver never offered a WRITE descriptor"
        if not b.progress():
            time.sleep(0.01)
    conn.close()
    assert b.proxy.live_allocations() <= before - 2


@pytest.mark.san_rule("R11", "R4")
def test_peer_close_completes_pending_receive(san_switch: Switch) -> None:
    conn = san_switch.connect()
    a, b = conn.local, conn.remote
    g, handle = sink(b, 128)
    pending = b.provider.recv(b.socket, [(g.inner, handle)])
    a.close()
    done = pending.wait(timeout=TIMEOUT)
    assert done.status is not Status.SUCCESS and g.unchanged()
    b.close()
