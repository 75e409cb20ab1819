"""When registered memory is reachable: R2, R3, R4, R12, R13."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from pytest_san import Access, Backend, SanError, Status, WsaError
from pytest_san.batch import batch, values
from pytest_san.spi.protocols import Switch, SwitchConnection

from .support import (
    MAX_SGE,
    NEEDS_READ,
    TIMEOUT,
    RawEnd,
    attempt,
    close_ends,
    expect_error,
    fresh_pair,
    lay_out,
    read_from,
    rejected,
    sink,
    source,
    succeeded,
    two_processes,
    window,
    write_into,
)

DATA = b"\x3c" * 4096


# -- R3: only while registered ---------------------------------------------------------------------


@pytest.mark.san_rule("R3")
def test_descriptor_rejected_after_deregister(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.READWRITE)
    assert succeeded(write_into(a, desc, DATA), len(DATA))
    b.provider.deregister_rdma_memory(b.socket, desc)
    target.inner.write(b"\x22" * len(DATA))
    assert rejected(write_into(a, desc, b"\x99" * len(DATA)))
    assert target.unchanged()


@pytest.mark.san_rule("R3")
@NEEDS_READ
def test_read_rejected_after_deregister(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    _, desc = window(b, len(DATA), Access.READ)
    b.provider.deregister_rdma_memory(b.socket, desc)
    outcome, landed = read_from(a, desc, len(DATA))
    assert rejected(outcome) and landed.unchanged()


@pytest.mark.san_rule("R3")
def test_handle_rejected_after_deregister(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA)
    a.provider.deregister_memory(a.socket, handle)
    target, desc = window(b, len(DATA), Access.WRITE)
    assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(buf, handle)], desc, 0)))
    assert target.unchanged()


@pytest.mark.san_rule("R3")
@pytest.mark.parametrize("kind", ["memory", "rdma"])
def test_deregistering_one_of_two_registrations_at_one_address_ends_that_one(conn: SwitchConnection, kind: str) -> None:
    """Two registrations that start at one address (64 and 32 bytes): deregistering the longer ends it, by its
    handle or descriptor, not whichever the address finds first. The socket then lists the shorter one only, and
    the longer one's memory past the shorter is no longer reachable through it (an error completion ends the
    connection, so it is tried last)."""
    a, b = conn.local, conn.remote
    end = a if kind == "memory" else b
    if kind == "memory":
        buf, longer = source(a, DATA[:64], Access.READWRITE)
        a.provider.register_memory(a.socket, buf.view(0, 32), Access.READWRITE)
        a.provider.deregister_memory(a.socket, longer)
        address = buf.address
    else:
        target, gone = window(b, 64, Access.WRITE)
        b.provider.register_rdma_memory(b.socket, target.inner.view(0, 32), Access.WRITE)
        b.provider.deregister_rdma_memory(b.socket, gone)
        address = target.inner.address
    listed = sorted(r.length for r in end.provider.registrations(end.socket) if r.kind == kind and r.address == address)
    assert listed == [32], (f"after deregistering the 64-byte registration at {address:#x}, the socket lists "
                            f"{listed} byte(s) there: the other one went instead, or both")
    if kind == "memory":
        target, desc = window(b, 64, Access.WRITE)
        outcome = attempt(lambda: a.provider.rdma_write(a.socket, [(buf.view(32, 32), longer)], desc, 0))
    else:
        outcome = write_into(a, gone, b"\x99" * 64)
    assert rejected(outcome), "a deregistered key still moved bytes beside another registration at its address"
    assert target.unchanged()


@pytest.mark.san_rule("R2")
@pytest.mark.parametrize("ended", ["handle", "other-descriptor"])
def test_a_descriptor_keeps_serving_its_peer_whatever_else_of_its_memory_is_deregistered(conn: SwitchConnection,
                                                                                       ended: str) -> None:
    """R2 gives a descriptor to the connected peer for as long as it is registered: ending another registration
    of the same memory (a local handle over it, or a second descriptor of it) must leave it working. The peer's
    write through it still lands, and the socket still lists it."""
    a, b = conn.local, conn.remote
    target, desc = window(b, 256, Access.WRITE)
    if ended == "handle":
        other = b.provider.register_memory(b.socket, target.inner, Access.READWRITE)
        b.provider.deregister_memory(b.socket, other)
    else:
        second = b.provider.register_rdma_memory(b.socket, target.inner.view(0, 128), Access.WRITE)
        b.provider.deregister_rdma_memory(b.socket, second)
    listed = [r for r in b.provider.registrations(b.socket) if r.kind == "rdma" and r.address == target.inner.address]
    assert [r.length for r in listed] == [256], f"deregistering the {ended} ended the descriptor too: {listed}"
    assert succeeded(write_into(a, desc, b"\x5e" * 256), 256), f"the peer's write failed once the {ended} ended"
    assert target.inner.read() == b"\x5e" * 256 and target.intact()


DEREGISTER_CYCLES = 256
"""Register/deregister cycles of one buffer over which no descriptor may come back (on a lab: a few round trips
in all, the cycles go out together)."""
CYCLES_TOGETHER = 64


@pytest.mark.san_rule("R3")
def test_a_deregistered_descriptor_is_never_handed_out_again_on_its_connection(
        san_backend: Backend, raw_pair: tuple[RawEnd, RawEnd]) -> None:
    """Verbs changes an rkey's key bits on every new window for this reason: a stale descriptor the peer kept
    must never name memory again. One buffer, registered and deregistered again and again, with the access and
    the range (the whole buffer or one half) varying: every descriptor differs from every earlier one."""
    _, b = raw_pair
    buf = b.process.alloc(8192)
    ranges = [buf, buf.view(0, 4096), buf.view(4096, 4096)]
    rng = random.Random(DEREGISTER_CYCLES)
    seen: dict[bytes, int] = {}
    for first in range(0, DEREGISTER_CYCLES, CYCLES_TOGETHER):
        with batch(san_backend) as bt:
            cycles = []
            for _ in range(first, min(first + CYCLES_TOGETHER, DEREGISTER_CYCLES)):
                access = rng.choice((Access.READ, Access.WRITE, Access.READWRITE))
                desc = bt.call(b.provider.register_rdma_memory, b.socket, rng.choice(ranges), access)
                cycles.append((desc, bt.call(b.provider.deregister_rdma_memory, b.socket, desc.ref)))
        for cycle, (desc, gone) in enumerate(cycles, first):
            assert desc.error is None, f"cycle {cycle}: register_rdma_memory failed: {desc.error!r}"
            assert gone.error is None, f"cycle {cycle}: deregister_rdma_memory failed: {gone.error!r}"
            assert isinstance(desc.value, bytes | bytearray), desc.value
            earlier = seen.setdefault(bytes(desc.value), cycle)
            assert earlier == cycle, f"cycle {cycle} handed out the descriptor of cycle {earlier} again"
    assert len(seen) == DEREGISTER_CYCLES
    assert len(b.provider.registrations(b.socket)) == 0


REUSE_ATTEMPTS = 3
"""New connections made after a close, looking for one whose socket equals a closed one (a provider that hands
out socket numbers as an OS hands out descriptors gives the lowest free one: the first new socket)."""


@pytest.mark.san_rule("R1", "R2", "R3", "R4", "R11")
def test_registrations_of_a_closed_socket_fail_on_sockets_made_after_it(san_backend: Backend) -> None:
    """A handle and a descriptor of a closed connection name nothing on the connections made after it, between
    the same processes, even on a socket that equals the closed one: deregistering them there is WSAEINVAL, and
    a transfer through them is rejected and moves no byte. Without socket reuse the property holds for every new
    socket all the same. R11 too: once closed, the socket holds no registration, and a socket number handed out
    again starts with none."""
    pa, pb = two_processes(san_backend)
    sa, sb = san_backend.connect_sockets(pa, pb)
    old = (RawEnd(sa, pa, pa.node.provider, pa.node.proxy), RawEnd(sb, pb, pb.node.provider, pb.node.proxy))
    try:
        buf, handle = source(old[0], DATA)
        old_target, old_desc = window(old[1], len(DATA), Access.READWRITE)
    finally:
        close_ends(san_backend, old)
    for attempt_no in range(REUSE_ATTEMPTS):
        what = f"new connection #{attempt_no}"
        with fresh_pair(san_backend, pa, pb) as (a, b):
            reused = a.socket == old[0].socket or b.socket == old[1].socket
            if reused:
                what += " (a socket equal to a closed one)"
            expect_error(WsaError.WSAEINVAL, a.provider.deregister_memory, a.socket, handle)
            expect_error(WsaError.WSAEINVAL, b.provider.deregister_rdma_memory, b.socket, old_desc)
            target, desc = window(b, len(DATA), Access.WRITE)
            assert rejected(attempt(functools.partial(a.provider.rdma_write, a.socket, [(buf, handle)], desc, 0))), what
            assert target.unchanged(), what
        with fresh_pair(san_backend, pa, pb) as (a, _):  # the last transfer may have broken that connection
            assert rejected(write_into(a, old_desc, b"\x99" * len(DATA))), what
            assert old_target.unchanged(), what
        if reused:
            break


# -- R4: only while the connection is established --------------------------------------------------


@pytest.mark.san_rule("R3", "R4")
@pytest.mark.parametrize("closer", ["owner", "initiator"])
def test_rdma_rejected_after_either_side_closes(conn: SwitchConnection, closer: str) -> None:
    """Once either end closed, the peer's RDMA into the owner's window is rejected: the connection is no longer
    established (R4), and a closed socket's registrations are released with it, so the window is no longer
    registered (R3)."""
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.READWRITE)
    buf, handle = source(a, DATA)
    (b if closer == "owner" else a).close()
    if not a.socket.closed:
        assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(buf, handle)], desc, 0)))
    else:
        with pytest.raises(SanError):
            a.provider.rdma_write(a.socket, [(buf, handle)], desc, 0)
    assert target.unchanged()


@pytest.mark.san_rule("R4")
@pytest.mark.san_requires("faults")
def test_rdma_rejected_after_link_drop(san_backend: Backend, conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    assert san_backend.faults is not None
    target, desc = window(b, len(DATA), Access.READWRITE)
    buf, handle = source(a, DATA)
    san_backend.faults.drop_link(a.process.node, b.process.node)
    try:
        assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(buf, handle)], desc, 0)))
    finally:
        san_backend.faults.restore_link(a.process.node, b.process.node)
    assert target.unchanged()


@pytest.mark.san_rule("R4")
@pytest.mark.san_requires("process_kill")
def test_rdma_rejected_after_owner_process_dies(san_switch: Switch, conn: SwitchConnection) -> None:
    a = conn.local
    victim = san_switch.connect(peer=conn.remote.process.node.spawn_process(), process=a.process)
    _, desc = window(victim.remote, len(DATA), Access.READWRITE)
    buf, handle = source(victim.local, DATA)
    victim.remote.process.kill()
    assert rejected(attempt(lambda: a.provider.rdma_write(victim.local.socket, [(buf, handle)], desc, 0)))


@pytest.mark.san_rule("R4")
@pytest.mark.san_requires("process_kill")
def test_pending_receive_fails_when_the_peer_process_dies(san_switch: Switch, conn: SwitchConnection) -> None:
    a = conn.local
    victim = san_switch.connect(peer=conn.remote.process.node.spawn_process(), process=a.process)
    g, handle = sink(victim.local, 256)
    pending = victim.local.provider.recv(victim.local.socket, [(g.inner, handle)])
    victim.remote.process.kill()
    # Whether on this host or another: the survivor learns, and its receive does not wait forever. R4 asks for
    # an error, not which: the connection reset (the emulator, rxe), or the receive flushed as the QP goes down.
    done = pending.wait(timeout=TIMEOUT)
    assert done.status is not Status.SUCCESS and done.bytes == 0
    assert g.unchanged()


# -- R12: registration and the proxy stay balanced -------------------------------------------------


@pytest.mark.san_rule("R12", "P2")
def test_each_registration_pins_through_the_proxy(conn: SwitchConnection) -> None:
    a = conn.local
    before = a.proxy.live_allocations()
    bufs = [a.process.alloc(4096 * (i + 1)) for i in range(3)]
    handles = [a.provider.register_memory(a.socket, buf, Access.READWRITE) for buf in bufs]
    assert a.proxy.live_allocations() == before + 3
    desc = a.provider.register_rdma_memory(a.socket, a.process.alloc(8192), Access.READ)
    assert a.proxy.live_allocations() == before + 4
    for h in handles:
        a.provider.deregister_memory(a.socket, h)
    a.provider.deregister_rdma_memory(a.socket, desc)
    assert a.proxy.live_allocations() == before


@pytest.mark.san_rule("R12", "R14")
@pytest.mark.san_requires("faults")
def test_proxy_out_of_memory_is_enobufs_and_leaves_nothing(san_backend: Backend, conn: SwitchConnection) -> None:
    a = conn.local
    assert san_backend.faults is not None
    before = a.proxy.live_allocations()
    registered = len(a.provider.registrations(a.socket))
    san_backend.faults.fail_allocations(a.process.node, 2)
    for register in (a.provider.register_memory, a.provider.register_rdma_memory):
        expect_error(WsaError.WSAENOBUFS, register, a.socket, a.process.alloc(4096), Access.READ)
    assert a.proxy.live_allocations() == before
    assert len(a.provider.registrations(a.socket)) == registered
    h = a.provider.register_memory(a.socket, a.process.alloc(4096), Access.READ)  # the fault is spent
    a.provider.deregister_memory(a.socket, h)


# -- R13: reference counting -----------------------------------------------------------------------


@pytest.mark.san_rule("R13", "R12")
def test_same_buffer_registered_twice_is_reference_counted(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf = a.process.alloc(4096)
    buf.write(DATA)
    before = a.proxy.live_allocations()
    h1 = a.provider.register_memory(a.socket, buf, Access.READ)
    h2 = a.provider.register_memory(a.socket, buf, Access.READ)
    a.provider.deregister_memory(a.socket, h1)
    # Still registered through the second registration: usable as a source.
    target, desc = window(b, 4096, Access.WRITE)
    assert succeeded(attempt(lambda: a.provider.rdma_write(a.socket, [(buf, h2)], desc, 0)), 4096)
    assert target.inner.read() == DATA
    a.provider.deregister_memory(a.socket, h2)
    assert a.proxy.live_allocations() == before
    expect_error(WsaError.WSAEINVAL, a.provider.deregister_memory, a.socket, h2)


@pytest.mark.san_rule("R13")
def test_rdma_registration_reference_counted(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    g = b.process.alloc(4096)
    d1 = b.provider.register_rdma_memory(b.socket, g, Access.WRITE)
    d2 = b.provider.register_rdma_memory(b.socket, g, Access.WRITE)
    b.provider.deregister_rdma_memory(b.socket, d1)
    assert succeeded(write_into(a, d2, DATA), 4096)
    b.provider.deregister_rdma_memory(b.socket, d2)
    assert rejected(write_into(a, d2, DATA))


@pytest.mark.san_rule("R13", "R14")
def test_deregister_unknown_handle_is_einval(conn: SwitchConnection) -> None:
    a = conn.local
    for bogus in (0, 0xDEADBEEF, -1):
        expect_error(WsaError.WSAEINVAL, a.provider.deregister_memory, a.socket, bogus)


@pytest.mark.san_rule("R13", "R1")
def test_deregister_on_another_socket_is_einval(san_switch: Switch, conn: SwitchConnection) -> None:
    a = conn.local
    other = san_switch.connect(process=a.process).local
    _, handle = source(a, DATA)
    expect_error(WsaError.WSAEINVAL, other.provider.deregister_memory, other.socket, handle)
    a.provider.deregister_memory(a.socket, handle)


@pytest.mark.san_rule("R13")
def test_deregister_in_use_by_pending_operation_is_einval(conn: SwitchConnection) -> None:
    b = conn.remote
    g, handle = sink(b, 256)
    pending = b.provider.recv(b.socket, [(g.inner, handle)])  # no sender: stays pending
    assert not pending.done()
    live = len(b.provider.registrations(b.socket))
    expect_error(WsaError.WSAEINVAL, b.provider.deregister_memory, b.socket, handle)
    assert len(b.provider.registrations(b.socket)) == live  # still registered


@pytest.mark.san_rule("R13", "R12")
def test_a_refused_deregistration_leaves_the_count_as_it_was(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    """A deregistration refused because a pending receive uses the handle (WSAEINVAL) counts for nothing: of two
    registrations of one buffer (one handle or two), once the receive completes, the first deregistration leaves
    the memory registered, still taking a message, and only the second ends it and its pins."""
    a, b = raw_pair
    before = b.proxy.live_allocations()
    g, first = sink(b, 256)
    second = b.provider.register_memory(b.socket, g.inner, Access.WRITE)
    pending = b.provider.recv(b.socket, [(g.inner, first)])
    expect_error(WsaError.WSAEINVAL, b.provider.deregister_memory, b.socket, first)
    sent = source(a, b"\x61" * 10)
    assert succeeded(attempt(functools.partial(a.provider.send, a.socket, [sent])), 10)
    assert pending.wait(timeout=TIMEOUT).bytes == 10
    b.provider.deregister_memory(b.socket, first)
    assert [r.length for r in b.provider.registrations(b.socket) if r.address == g.inner.address] == [256], \
        "the refused deregistration counted: the first one that worked ended both registrations"
    again = b.provider.recv(b.socket, [(g.inner, second)])
    sent = source(a, b"\x62" * 20)
    assert succeeded(attempt(functools.partial(a.provider.send, a.socket, [sent])), 20)
    done = again.wait(timeout=TIMEOUT)
    assert done.status is Status.SUCCESS and done.bytes == 20 and g.inner.read(20) == b"\x62" * 20
    b.provider.deregister_memory(b.socket, second)
    expect_error(WsaError.WSAEINVAL, b.provider.deregister_memory, b.socket, second)
    assert all(r.address != g.inner.address for r in b.provider.registrations(b.socket))
    assert b.proxy.live_allocations() == before


@pytest.mark.san_rule("R3")
def test_a_deregistration_that_returns_ends_its_handle_at_once(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    """A deregistration is refused (WSAEINVAL, R13: a pending receive uses the handle) or it ends the handle at
    once: never accepted now and carried out once the receive completes. If it returned while the receive is
    still pending, an RDMA write from the handle is rejected and moves nothing."""
    a, b = raw_pair
    g, handle = sink(b, 256, Access.READWRITE)
    pending = b.provider.recv(b.socket, [(g.inner, handle)])
    try:
        b.provider.deregister_memory(b.socket, handle)
    except SanError:
        return  # refused, as R13 wants (its scenarios judge the code): nothing ended
    assert not pending.done()
    target, desc = window(a, 256, Access.WRITE)
    assert rejected(attempt(lambda: b.provider.rdma_write(b.socket, [(g.inner, handle)], desc, 0))), \
        "a deregistration returned, yet its handle still moved bytes"
    assert target.unchanged()


@dataclasses.dataclass(frozen=True)
class Uses:
    """Pending receives that all use one handle: each receive's list has ``lengths[j]`` entries, the shared
    handle's (its own 8 bytes of the shared registration) at ``at[j]``, the others registered alone."""

    lengths: tuple[int, ...]
    at: tuple[int, ...]

    def __str__(self) -> str:
        return "+".join(f"{n}@{i}" for n, i in zip(self.lengths, self.at, strict=True))


def _drawn_uses(seed: int) -> Uses:
    rng = random.Random(seed)
    lengths = tuple(rng.randint(1, MAX_SGE) for _ in range(rng.randint(2, 4)))
    return Uses(lengths, tuple(rng.randrange(n) for n in lengths))


IN_USE_SHAPES = [
    Uses((1, 1), (0, 0)),
    Uses((MAX_SGE, MAX_SGE, MAX_SGE), (0, MAX_SGE // 2, MAX_SGE - 1)),
    Uses((MAX_SGE, 2, MAX_SGE), (MAX_SGE - 1, 0, 1)),
    _drawn_uses(13),
]
SHARED = 8  # bytes of the shared registration each receive uses
OTHER = 16  # bytes of each other entry


@pytest.mark.san_rule("R13")
@pytest.mark.parametrize("uses", IN_USE_SHAPES, ids=str)
def test_a_handle_stays_in_use_until_its_last_pending_operation_completes(
        san_backend: Backend, raw_pair: tuple[RawEnd, RawEnd], uses: Uses) -> None:
    """Receives posted with no send: they stay pending, each holding the shared handle in use. They complete one
    by one as the peer sends (in the order posted); until the last has, deregistering the handle is WSAEINVAL
    and leaves it registered; then it deregisters. An in-use mark, not a count, is cleared by the first."""
    a, b = raw_pair
    k = len(uses.lengths)
    shared = b.process.alloc(SHARED * k)
    handle = b.provider.register_memory(b.socket, shared, Access.WRITE)
    others = lay_out(san_backend, b, [OTHER] * (sum(uses.lengths) - k), [Access.WRITE] * (sum(uses.lengths) - k),
                     [0] * (sum(uses.lengths) - k))
    spare = iter(range(len(others.handles)))
    lists = []
    for j, (n, at) in enumerate(zip(uses.lengths, uses.at, strict=True)):
        entries = []
        for i in range(n):
            if i == at:
                entries.append((shared.view(SHARED * j, SHARED), handle))
            else:
                e = next(spare)
                entries.append((others.entry(e), others.handles[e]))
        lists.append(entries)
    receives = [b.provider.recv(b.socket, entries) for entries in lists]
    with batch(san_backend) as bt:
        done = [bt.call(op.done) for op in receives]
    assert not any(values(done)), "a receive completed with nothing sent"
    live = len(b.provider.registrations(b.socket))
    message = a.process.alloc(SHARED + OTHER * (MAX_SGE - 1))
    sent = a.provider.register_memory(a.socket, message, Access.READ)
    for j, entries in enumerate(lists):
        expect_error(WsaError.WSAEINVAL, b.provider.deregister_memory, b.socket, handle)
        assert len(b.provider.registrations(b.socket)) == live, f"{uses}: refused, yet a registration changed"
        nbytes = sum(buffer.length for buffer, _ in entries)
        message.write(bytes([0x41 + j]) * nbytes)
        assert succeeded(attempt(functools.partial(a.provider.send, a.socket, [(message.view(0, nbytes), sent)])),
                         nbytes)
        done = receives[j].wait(timeout=TIMEOUT)
        assert done.status is Status.SUCCESS and done.bytes == nbytes, f"{uses}: receive #{j}: {done}"
    b.provider.deregister_memory(b.socket, handle)  # the last use is over
    assert shared.read() == b"".join(bytes([0x41 + j]) * SHARED for j in range(k))


@pytest.mark.san_rule("R13")
@pytest.mark.san_requires("send_waits")  # a send with no receive to take it stays pending (not on iWARP)
@pytest.mark.parametrize("first", ["send", "recv"])
def test_a_handle_used_by_a_pending_send_and_receive_is_in_use_until_both_complete(
        raw_pair: tuple[RawEnd, RawEnd], first: str) -> None:
    """One READWRITE handle, half of it a pending receive's sink, half a pending send's source: whichever
    completes first, the other still holds it in use (WSAEINVAL), and it deregisters once both have."""
    a, b = raw_pair
    shared = b.process.alloc(64)
    shared.write(b"\x55" * 64)
    handle = b.provider.register_memory(b.socket, shared, Access.READWRITE)
    recv = b.provider.recv(b.socket, [(shared.view(0, 32), handle)])  # nothing sent to it yet
    send = b.provider.send(b.socket, [(shared.view(32, 32), handle)])  # no receive posted for it yet
    assert not recv.done() and not send.done()
    landed, into = sink(a, 32)
    data, sent = source(a, b"\x77" * 32)
    for which in (first, "recv" if first == "send" else "send"):
        expect_error(WsaError.WSAEINVAL, b.provider.deregister_memory, b.socket, handle)
        if which == "send":  # the peer's receive takes b's send
            taken = a.provider.recv(a.socket, [(landed.inner, into)])
            assert send.wait(timeout=TIMEOUT).status is Status.SUCCESS
            assert succeeded(taken.wait(timeout=TIMEOUT), 32) and landed.inner.read() == b"\x55" * 32
        else:  # the peer sends into b's receive
            assert succeeded(attempt(functools.partial(a.provider.send, a.socket, [(data, sent)])), 32)
            assert succeeded(recv.wait(timeout=TIMEOUT), 32)
    b.provider.deregister_memory(b.socket, handle)  # both uses are over
    assert shared.read() == b"\x77" * 32 + b"\x55" * 32
