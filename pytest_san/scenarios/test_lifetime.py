"""When registered memory is reachable: R3, R4, R12, R13."""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend, Connection, SanError, Status, Switch, WsaError

from .support import (
    NEEDS_READ,
    TIMEOUT,
    attempt,
    expect_error,
    read_from,
    rejected,
    sink,
    source,
    succeeded,
    window,
    write_into,
)

DATA = b"\x3c" * 4096


# -- R3: only while registered ---------------------------------------------------------------------


@pytest.mark.san_rule("R3")
def test_descriptor_rejected_after_deregister(conn: Connection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.READWRITE)
    assert succeeded(write_into(a, desc, DATA), len(DATA))
    b.provider.deregister_rdma_memory(b.socket, desc)
    target.inner.write(b"\x22" * len(DATA))
    assert rejected(write_into(a, desc, b"\x99" * len(DATA)))
    assert target.unchanged()


@pytest.mark.san_rule("R3")
@NEEDS_READ
def test_read_rejected_after_deregister(conn: Connection) -> None:
    a, b = conn.local, conn.remote
    _, desc = window(b, len(DATA), Access.READ)
    b.provider.deregister_rdma_memory(b.socket, desc)
    outcome, landed = read_from(a, desc, len(DATA))
    assert rejected(outcome) and landed.unchanged()


@pytest.mark.san_rule("R3")
def test_handle_rejected_after_deregister(conn: Connection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA)
    a.provider.deregister_memory(a.socket, handle)
    target, desc = window(b, len(DATA), Access.WRITE)
    assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(buf, handle)], desc, 0)))
    assert target.unchanged()


# -- R4: only while the connection is established --------------------------------------------------


@pytest.mark.san_rule("R4")
@pytest.mark.parametrize("closer", ["owner", "initiator"])
def test_rdma_rejected_after_either_side_closes(conn: Connection, closer: str) -> None:
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
def test_rdma_rejected_after_link_drop(san_backend: Backend, conn: Connection) -> None:
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
def test_rdma_rejected_after_owner_process_dies(san_switch: Switch, conn: Connection) -> None:
    a = conn.local
    victim = san_switch.connect(peer=conn.remote.process.node.spawn_process(), process=a.process)
    _, desc = window(victim.remote, len(DATA), Access.READWRITE)
    buf, handle = source(victim.local, DATA)
    victim.remote.process.kill()
    assert rejected(attempt(lambda: a.provider.rdma_write(victim.local.socket, [(buf, handle)], desc, 0)))


@pytest.mark.san_rule("R4")
@pytest.mark.san_requires("process_kill")
def test_pending_receive_fails_when_the_peer_process_dies(san_switch: Switch, conn: Connection) -> None:
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
def test_each_registration_pins_through_the_proxy(conn: Connection) -> None:
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
def test_proxy_out_of_memory_is_enobufs_and_leaves_nothing(san_backend: Backend, conn: Connection) -> None:
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
def test_same_buffer_registered_twice_is_reference_counted(conn: Connection) -> None:
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
def test_rdma_registration_reference_counted(conn: Connection) -> None:
    a, b = conn.local, conn.remote
    g = b.process.alloc(4096)
    d1 = b.provider.register_rdma_memory(b.socket, g, Access.WRITE)
    d2 = b.provider.register_rdma_memory(b.socket, g, Access.WRITE)
    b.provider.deregister_rdma_memory(b.socket, d1)
    assert succeeded(write_into(a, d2, DATA), 4096)
    b.provider.deregister_rdma_memory(b.socket, d2)
    assert rejected(write_into(a, d2, DATA))


@pytest.mark.san_rule("R13", "R14")
def test_deregister_unknown_handle_is_einval(conn: Connection) -> None:
    a = conn.local
    for bogus in (0, 0xDEADBEEF, -1):
        expect_error(WsaError.WSAEINVAL, a.provider.deregister_memory, a.socket, bogus)


@pytest.mark.san_rule("R13", "R1")
def test_deregister_on_another_socket_is_einval(san_switch: Switch, conn: Connection) -> None:
    a = conn.local
    other = san_switch.connect(process=a.process).local
    _, handle = source(a, DATA)
    expect_error(WsaError.WSAEINVAL, other.provider.deregister_memory, other.socket, handle)
    a.provider.deregister_memory(a.socket, handle)


@pytest.mark.san_rule("R13")
def test_deregister_in_use_by_pending_operation_is_einval(conn: Connection) -> None:
    b = conn.remote
    g, handle = sink(b, 256)
    pending = b.provider.recv(b.socket, [(g.inner, handle)])  # no sender: stays pending
    assert not pending.done()
    live = len(b.provider.registrations(b.socket))
    expect_error(WsaError.WSAEINVAL, b.provider.deregister_memory, b.socket, handle)
    assert len(b.provider.registrations(b.socket)) == live  # still registered
