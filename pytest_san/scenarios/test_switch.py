"""What the switch registers and how it tears down: R9, R10, R11."""

from __future__ import annotations

import random
import time

import pytest

from pytest_san import Access, Backend, Connection, Endpoint, SanError, Status, Switch, WsaError

from .support import NEEDS_READ, TIMEOUT, sink, source, window

THRESHOLD = 8192


def _memory_regions(end: Endpoint) -> list[object]:
    return [r for r in end.provider.registrations(end.socket) if r.kind == "memory"]


def _rdma_calls(conn: Connection) -> list[tuple[str, str]]:
    return [t for t in conn.trace if t[1] in ("register_rdma_memory", "rdma_read", "rdma_write")]


# -- R9: two virtually contiguous regions per connected socket -------------------------------------


@pytest.mark.san_rule("R9")
def test_connect_registers_exactly_two_regions_per_side(san_switch: Switch) -> None:
    conn = san_switch.connect()
    for end in (conn.local, conn.remote):
        regions = end.provider.registrations(end.socket)
        assert len(regions) == 2 and all(r.kind == "memory" for r in regions)
        first, second = sorted(regions, key=lambda r: r.address)
        assert first.address + first.length <= second.address  # two separate ranges
        # One for sending (the provider reads it), one for posted receives (the provider writes it).
        assert any(r.access & Access.READ for r in regions) and any(r.access & Access.WRITE for r in regions)
    assert conn.trace.count(("local", "register_memory")) == 2
    assert conn.trace.count(("remote", "register_memory")) == 2


@pytest.mark.san_rule("R9", "R10")
def test_message_traffic_uses_only_the_two_regions(san_switch: Switch) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD)
    payload = bytes(range(256)) * 24  # 6 KiB: below the threshold, several messages
    for _ in range(20):  # more messages than receive buffers: flow control must hold
        conn.local.send(payload)
        conn.remote.send(payload[:100])
    assert conn.remote.recv(len(payload) * 20) == payload * 20
    assert conn.local.recv(2000) == payload[:100] * 20
    for end in (conn.local, conn.remote):
        assert len(_memory_regions(end)) == 2
        assert len(end.provider.registrations(end.socket)) == 2
    assert _rdma_calls(conn) == []


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
@pytest.mark.parametrize("size", [THRESHOLD + 1, 200_000, 3 << 20])
def test_large_transfer_moves_by_rdma_read(san_switch: Switch, size: int) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD)
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
@pytest.mark.parametrize("size", [THRESHOLD + 1, 1 << 20])
def test_large_transfer_moves_by_rdma_write_when_peer_lacks_read(san_switch: Switch, size: int) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode="write")
    data = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    conn.local.send(data)
    assert conn.remote.recv(size, timeout=TIMEOUT) == data
    assert ("remote", "register_rdma_memory") in conn.trace  # the peer offered a WRITE descriptor
    assert ("local", "rdma_write") in conn.trace and ("remote", "rdma_read") not in conn.trace
    conn.flush(timeout=TIMEOUT)
    for end in (conn.local, conn.remote):
        assert len(end.provider.registrations(end.socket)) == 2


@pytest.mark.san_rule("R10")
def test_threshold_boundary_and_mixed_order(san_switch: Switch) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD)
    pieces = [b"a" * THRESHOLD, b"b" * (THRESHOLD + 1), b"c" * 10, b"d" * 50_000, b"e" * 3]
    for piece in pieces:
        conn.local.send(piece)
    assert conn.remote.recv(sum(map(len, pieces)), timeout=TIMEOUT) == b"".join(pieces)
    # Only the two pieces above the threshold went by RDMA: each exposed one descriptor, the sender's (RdmaRead)
    # or the receiver's (RdmaWrite, when the receiver lacks RdmaRead).
    registered = [t for t in conn.trace if t[1] == "register_rdma_memory"]
    assert len(registered) == 2


@pytest.mark.san_rule("R10")
def test_auto_mode_follows_the_peer_capability(san_switch: Switch) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD)
    conn.local.send(b"z" * (THRESHOLD * 2))
    assert conn.remote.recv(THRESHOLD * 2, timeout=TIMEOUT) == b"z" * (THRESHOLD * 2)
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
    # The switch deregistered the idle send region; the busy receive region and the application's
    # registrations were released by the provider at close.
    assert ("local", "deregister_memory") in conn.trace
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
    a.send(b"L" * 100_000)  # the READ descriptor stays registered until the peer has read it
    assert len(a.provider.registrations(a.socket)) == 3
    conn.close()
    assert a.proxy.live_allocations() <= before - 2


@pytest.mark.san_rule("R11")
def test_close_while_the_receiver_offers_a_write_descriptor(san_switch: Switch) -> None:
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode="write")
    a, b = conn.local, conn.remote
    before = b.proxy.live_allocations()
    a.send(b"W" * 100_000)  # announced; the receiver registers a WRITE descriptor for it when it sees that
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
