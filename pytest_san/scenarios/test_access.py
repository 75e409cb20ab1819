"""Who may touch registered memory: R1, R2, R5, R6, R7, R8."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from pytest_san import Access, Backend, Buffer, Handle, Process, WsaError
from pytest_san.spi.protocols import Switch, SwitchConnection, SwitchEndpoint

from .support import (
    NEEDS_READ,
    SOURCE_KINDS,
    Scatter,
    attempt,
    expect_error,
    fresh_pair,
    lay_out,
    read_from,
    rejected,
    scatter_shapes,
    sink,
    source,
    succeeded,
    transfer_is_rejected,
    two_processes,
    window,
    write_into,
)

DATA = bytes(range(256)) * 16  # 4 KiB
READ_SCATTER = [NEEDS_READ, pytest.mark.san_requires("rdma_read_scatter")]
"""An RDMA read into more than one buffer: some devices take only one (siw's max_sge_rd)."""


# -- R1: register_memory handles belong to one process and one socket ------------------------------


@pytest.mark.san_rule("R1")
def test_handle_works_in_its_own_process(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.WRITE)
    assert succeeded(write_into(a, desc, DATA), len(DATA))
    assert target.inner.read() == DATA and target.intact()


def _foreign_handle_rejected(b: SwitchEndpoint, intruder: SwitchEndpoint, buf: Buffer, handle: Handle) -> None:
    """``intruder`` writes ``buf`` under a handle it does not own into a window ``b`` made for it."""
    target, _ = window(b, len(DATA), Access.WRITE)
    desc = b.provider.register_rdma_memory(intruder.peer.socket, target.inner, Access.WRITE)
    assert rejected(attempt(lambda: intruder.provider.rdma_write(intruder.socket, [(buf, handle)], desc, 0)))
    assert target.unchanged()


@pytest.mark.san_rule("R1")
def test_handle_from_another_process_is_rejected(san_switch: Switch, conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    other = san_switch.connect(peer=b.process, process=a.process.node.spawn_process()).local
    _, handle = source(a, DATA)  # a's handle, used by another process with its own buffer
    mine = other.process.alloc(len(DATA))
    mine.write(b"\x77" * len(DATA))
    _foreign_handle_rejected(b, other, mine, handle)


@pytest.mark.san_rule("R1")
def test_handle_from_another_process_buffer_is_rejected(san_switch: Switch, conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    other = san_switch.connect(peer=b.process, process=a.process.node.spawn_process()).local
    buf, handle = source(a, DATA)  # a's handle and a's buffer, used by another process
    _foreign_handle_rejected(b, other, buf, handle)


@pytest.mark.san_rule("R1")
def test_handle_on_another_socket_of_the_same_process_is_rejected(san_switch: Switch, conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    second = san_switch.connect(peer=b.process, process=a.process).local
    buf, handle = source(a, DATA)  # registered on the first socket
    _foreign_handle_rejected(b, second, buf, handle)


FOREIGN = ["same-host", "other-host"]
"""Where the other process of a foreign-buffer scenario lives: beside the caller, or on the peer's host."""


def _foreign_process(mine: Process, peer: Process, where: str) -> Process:
    return mine.node.spawn_process() if where == "same-host" else peer


@pytest.mark.san_rule("R1", "R5", "R14")
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
@pytest.mark.parametrize("where", FOREIGN)
def test_registering_another_process_buffer_is_efault(conn: SwitchConnection, where: str, register: str) -> None:
    a = conn.local
    foreign = _foreign_process(a.process, conn.remote.process, where).alloc(4096)
    before = len(a.provider.registrations(a.socket)), a.proxy.live_allocations()
    # Another process's memory, even on the caller's own host, is not in the caller's address space (the same
    # address may well be mapped there: that is the caller's memory, not the buffer it was given).
    expect_error(WsaError.WSAEFAULT, getattr(a.provider, register), a.socket, foreign, Access.READWRITE)
    assert (len(a.provider.registrations(a.socket)), a.proxy.live_allocations()) == before


def _untouched(local: Scatter, foreign: Buffer | None) -> bool:
    return local.unchanged() and (foreign is None or foreign.read() == b"\xf0" * foreign.length)


def _foreign_entry_rejected(backend: Backend, kind: str, where: str) -> None:
    """For each shape: a list of the caller's registered entries, one of them swapped for another process's
    buffer of the same length under that entry's handle: rejected, and no byte of either process moves. The
    other process's buffer is, by turns, one it allocated, and its range at the very address of the entry it
    replaces (what a provider that looks addresses up in the caller's address space takes for that entry)."""
    pa, pb = two_processes(backend)
    other = _foreign_process(pa, pb, where)
    access = Access.READ if kind in SOURCE_KINDS else Access.WRITE
    for turn, shape in enumerate(scatter_shapes("foreign-entry-" + where, kind)):
        n = len(shape.lengths)
        with fresh_pair(backend, pa, pb) as (a, b):
            local = lay_out(backend, a, shape.lengths, [access] * n, [0x30 + i for i in range(n)])
            length = shape.lengths[shape.bad]
            foreign: Buffer | None = None
            if turn % 2 == 0:
                foreign = other.alloc(length)
                foreign.write(b"\xf0" * length)
                alien: Buffer = foreign
            else:  # mapped there or not, it is not the caller's memory
                alien = other.buffer_at(local.entry(shape.bad).address, length)
            entries = [(alien if i == shape.bad else local.entry(i), h) for i, h in enumerate(local.handles)]
            transfer_is_rejected(backend, a, b, kind, entries, functools.partial(_untouched, local, foreign),
                                 f"{kind}, entry #{shape.bad} of {n} another process's ({where}, "
                                 f"{'its own allocation' if foreign else 'at the address of the entry'})")


@pytest.mark.san_rule("R1", "R5")
@pytest.mark.parametrize("kind", ["send", "recv", "rdma_write", pytest.param("rdma_read", marks=READ_SCATTER)])
@pytest.mark.parametrize("where", FOREIGN)
def test_scatter_entry_of_another_process_is_rejected(san_backend: Backend, kind: str, where: str) -> None:
    _foreign_entry_rejected(san_backend, kind, where)


# -- R2: descriptors work only for the connected peer, on that connection ---------------------------


@pytest.mark.san_rule("R2")
def test_descriptor_works_for_connected_peer(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.READWRITE)
    assert succeeded(write_into(a, desc, DATA), len(DATA))
    assert target.inner.read() == DATA and target.intact()


@pytest.mark.san_rule("R2")
@NEEDS_READ
def test_descriptor_read_by_connected_peer(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.READWRITE)
    target.inner.write(DATA)
    outcome, landed = read_from(a, desc, len(DATA))
    assert succeeded(outcome, len(DATA)) and landed.inner.read() == DATA and landed.intact()


INTRUSIONS = ["write", pytest.param("read", marks=NEEDS_READ)]


def _intruder_rejected(owner: SwitchEndpoint, make: Callable[[], SwitchEndpoint], how: str) -> None:
    """A write (or a read) through ``owner``'s descriptor from a fresh intruding connection."""
    target, desc = window(owner, len(DATA), Access.READWRITE)
    if how == "write":
        assert rejected(write_into(make(), desc, DATA))
        assert target.unchanged()
    else:
        outcome, landed = read_from(make(), desc, len(DATA))
        assert rejected(outcome) and landed.unchanged()


@pytest.mark.san_rule("R2")
@pytest.mark.parametrize("how", INTRUSIONS)
def test_descriptor_on_another_connection_between_same_processes(san_switch: Switch, conn: SwitchConnection,
                                                                 how: str) -> None:
    a, b = conn.local, conn.remote
    _intruder_rejected(b, lambda: san_switch.connect(peer=b.process, process=a.process).local, how)


@pytest.mark.san_rule("R2", "R5")
@pytest.mark.parametrize("how", INTRUSIONS)
def test_descriptor_from_another_process_on_the_initiator_host(san_switch: Switch, conn: SwitchConnection,
                                                               how: str) -> None:
    a, b = conn.local, conn.remote
    node = a.process.node
    _intruder_rejected(b, lambda: san_switch.connect(peer=b.process, process=node.spawn_process()).local, how)


@pytest.mark.san_rule("R2", "R5")
@pytest.mark.san_requires("third_host")
@pytest.mark.san_nodes(3)
@pytest.mark.parametrize("how", INTRUSIONS)
def test_descriptor_from_a_third_host(san_switch: Switch, san_backend: Backend, conn: SwitchConnection,
                                      how: str) -> None:
    b = conn.remote
    third = san_backend.nodes[2]
    _intruder_rejected(b, lambda: san_switch.connect(peer=b.process, process=third).local, how)


@pytest.mark.san_rule("R2")
def test_own_descriptor_is_not_a_remote_target(conn: SwitchConnection) -> None:
    a = conn.local
    target, desc = window(a, len(DATA), Access.READWRITE)  # a's own window: only the peer may use it
    assert rejected(write_into(a, desc, DATA))
    assert target.unchanged()


# -- R5: nothing is exposed to other processes or hosts --------------------------------------------


@pytest.mark.san_rule("R5")
@NEEDS_READ
def test_same_address_in_another_process_is_not_the_registered_memory(san_switch: Switch,
                                                                      conn: SwitchConnection) -> None:
    from pytest_san import SanError

    a, b = conn.local, conn.remote
    secret = b"S" * 4096
    buf, _ = source(a, secret)
    neighbour = san_switch.connect(peer=b.process, process=a.process.node.spawn_process()).local
    probe = neighbour.process.buffer_at(buf.address, buf.length)
    try:
        desc = neighbour.provider.register_rdma_memory(neighbour.socket, probe, Access.READ)
    except SanError:
        return  # not mapped in the neighbour: nothing to expose
    outcome, landed = read_from(neighbour.peer, desc, 4096)
    assert succeeded(outcome, 4096)
    assert landed.inner.read() != secret  # the neighbour's own bytes, never a's


@pytest.mark.san_rule("R5", "R2")
@pytest.mark.parametrize("how", INTRUSIONS)
def test_registration_not_reachable_from_processes_on_the_owner_host(san_switch: Switch, conn: SwitchConnection,
                                                                     how: str) -> None:
    a, b = conn.local, conn.remote
    node = a.process.node
    # a's memory, reached by b over a connection to a neighbour process of a: never.
    _intruder_rejected(a, lambda: san_switch.connect(peer=node.spawn_process(), process=b.process).local, how)


# -- R6: read-only memory is never written ---------------------------------------------------------


@pytest.mark.san_rule("R6")
def test_peer_write_into_read_descriptor_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.READ)
    assert rejected(write_into(a, desc, DATA))
    assert target.unchanged()


@pytest.mark.san_rule("R6")
@NEEDS_READ
def test_peer_read_from_read_descriptor_works(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    _, desc = window(b, len(DATA), Access.READ, fill=0x5A)
    outcome, landed = read_from(a, desc, len(DATA))
    assert succeeded(outcome, len(DATA)) and landed.inner.read() == b"\x5a" * len(DATA)


@pytest.mark.san_rule("R6")
def test_read_handle_as_receive_buffer_is_rejected(conn: SwitchConnection) -> None:
    b = conn.remote
    g, handle = sink(b, 256, Access.READ)
    recv = attempt(lambda: b.provider.recv(b.socket, [(g.inner, handle)]))
    assert rejected(recv)
    assert g.unchanged()


@pytest.mark.san_rule("R6")
@NEEDS_READ
def test_read_handle_as_rdma_read_sink_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    _, desc = window(b, len(DATA), Access.READ, fill=0x5A)
    g, handle = sink(a, len(DATA), Access.READ)
    assert rejected(attempt(lambda: a.provider.rdma_read(a.socket, [(g.inner, handle)], desc, 0)))
    assert g.unchanged()


# -- R7: write-only memory is never read -----------------------------------------------------------


@pytest.mark.san_rule("R7")
@NEEDS_READ
def test_peer_read_from_write_descriptor_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    _, desc = window(b, len(DATA), Access.WRITE, fill=0x5A)
    outcome, landed = read_from(a, desc, len(DATA))
    assert rejected(outcome) and landed.unchanged()


@pytest.mark.san_rule("R7")
def test_write_handle_as_rdma_write_source_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.WRITE)
    buf, handle = source(a, DATA, Access.WRITE)
    assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(buf, handle)], desc, 0)))
    assert target.unchanged()


@pytest.mark.san_rule("R7")
def test_write_handle_as_send_source_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    g, rh = sink(b, 256)
    b.provider.recv(b.socket, [(g.inner, rh)])
    buf, handle = source(a, b"w" * 256, Access.WRITE)
    assert rejected(attempt(lambda: a.provider.send(a.socket, [(buf, handle)])))
    assert g.unchanged()


@pytest.mark.san_rule("R7")
@NEEDS_READ
def test_readwrite_allows_both(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, len(DATA), Access.READWRITE)
    assert succeeded(write_into(a, desc, DATA), len(DATA))
    assert target.inner.read() == DATA
    outcome, landed = read_from(a, desc, len(DATA))
    assert succeeded(outcome, len(DATA)) and landed.inner.read() == DATA


# -- R8: bounds ------------------------------------------------------------------------------------


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize("offset,length", [(0, 4097), (4000, 97), (4096, 1), (1 << 20, 16)])
def test_write_past_the_registered_range_is_rejected(conn: SwitchConnection, offset: int, length: int) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, 4096, Access.WRITE)
    assert rejected(write_into(a, desc, b"o" * length, offset))
    assert target.unchanged()


@pytest.mark.san_rule("R8")
@NEEDS_READ
@pytest.mark.parametrize("offset,length", [(0, 4097), (4095, 2)])
def test_read_past_the_registered_range_is_rejected(conn: SwitchConnection, offset: int, length: int) -> None:
    a, b = conn.local, conn.remote
    _, desc = window(b, 4096, Access.READ)
    outcome, landed = read_from(a, desc, length, offset)
    assert rejected(outcome) and landed.unchanged()


@pytest.mark.san_rule("R8")
def test_exact_fit_at_the_end_is_allowed(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    target, desc = window(b, 4096, Access.WRITE)
    assert succeeded(write_into(a, desc, b"E" * 96, 4000), 96)
    assert target.inner.read(96, 4000) == b"E" * 96
    assert target.inner.read(4000) == b"\x22" * 4000 and target.intact()


@pytest.mark.san_rule("R8")
def test_local_buffer_past_its_registration_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    whole = a.process.alloc(8192)
    handle = a.provider.register_memory(a.socket, whole.view(0, 4096), Access.READ)
    target, desc = window(b, 8192, Access.WRITE)
    assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(whole.view(2048, 4096), handle)], desc, 0)))
    assert target.unchanged()


@pytest.mark.san_rule("R8")
def test_scatter_gather_lands_in_order(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    parts = [source(a, bytes([i]) * 1000) for i in (1, 2, 3)]
    target, desc = window(b, 3000, Access.WRITE)
    outcome = attempt(lambda: a.provider.rdma_write(a.socket, parts, desc, 0))
    assert succeeded(outcome, 3000)
    assert target.inner.read() == b"\x01" * 1000 + b"\x02" * 1000 + b"\x03" * 1000 and target.intact()


# -- R6, R7 in scatter lists: one entry without the access, wherever it is -----------------------------


def _one_entry_without_the_access(backend: Backend, kind: str) -> None:
    """For each shape (``MAX_SGE`` entries with the bad one first, in the middle, last; then drawn ones): the
    entries have the access the call needs, but one, registered with the other access only."""
    pa, pb = two_processes(backend)
    wrong = Access.WRITE if kind in SOURCE_KINDS else Access.READ
    for shape in scatter_shapes("entry-without-the-access", kind):
        n = len(shape.lengths)
        accesses = [wrong if i == shape.bad else access for i, access in enumerate(shape.accesses)]
        with fresh_pair(backend, pa, pb) as (a, b):
            local = lay_out(backend, a, shape.lengths, accesses, [0x30 + i for i in range(n)])
            entries = [(local.entry(i), handle) for i, handle in enumerate(local.handles)]
            transfer_is_rejected(backend, a, b, kind, entries, local.unchanged,
                                 f"{kind}, {shape}: entry #{shape.bad} registered {wrong.name} only")


@pytest.mark.san_rule("R6")
@pytest.mark.parametrize("kind", ["recv", pytest.param("rdma_read", marks=READ_SCATTER)])
def test_read_only_entry_anywhere_in_a_sink_list_is_rejected(san_backend: Backend, kind: str) -> None:
    _one_entry_without_the_access(san_backend, kind)


@pytest.mark.san_rule("R7")
@pytest.mark.parametrize("kind", ["send", "rdma_write"])
def test_write_only_entry_anywhere_in_a_source_list_is_rejected(san_backend: Backend, kind: str) -> None:
    _one_entry_without_the_access(san_backend, kind)
