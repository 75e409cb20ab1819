"""Bursts (``pytest_san.spi.burst``): many identical RDMA transfers as one operation keep every rule a single one does.

On the verbs engine a burst runs next to the NIC (the child reposts each write as the previous
completes); elsewhere it runs over the SPI. Either way: R6, R7, R8 as for one transfer, R13 while it
is pending, R11 when the socket closes under it, R14 for its own arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pytest_san import Access, Backend, Completion, Handle, PendingOperation, Status, WsaError
from pytest_san.spi.burst import rdma_read_burst, rdma_write_burst
from pytest_san.spi.protocols import SwitchConnection

from .support import TIMEOUT, Guarded, attempt, expect_error, rejected, sink, source, window

SIZE = 4096
COUNT = 40  # more than one window of DEPTH (16): reposting is exercised
DATA = bytes(range(256)) * (SIZE // 256)


def _wait(op: PendingOperation) -> Completion:
    return op.wait(timeout=TIMEOUT)


@pytest.mark.san_rule("R8")
def test_write_burst_moves_count_times_the_bytes_and_nothing_else(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA)
    target, desc = window(b, SIZE, Access.WRITE)
    done = _wait(rdma_write_burst(a.provider, a.socket, [(buf, handle)], desc, count=COUNT))
    assert done.status is Status.SUCCESS and done.bytes == COUNT * SIZE
    assert target.inner.read() == DATA and target.intact()
    # The registrations are free again once it completed (nothing left in use).
    a.provider.deregister_memory(a.socket, handle)
    b.provider.deregister_rdma_memory(b.socket, desc)


@pytest.mark.san_rule("R8")
def test_write_burst_at_an_offset_with_depth_one(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA[:1024])
    target, desc = window(b, SIZE, Access.WRITE)
    done = _wait(rdma_write_burst(a.provider, a.socket, [(buf, handle)], desc, 3072, count=5, depth=1))
    assert done.status is Status.SUCCESS and done.bytes == 5 * 1024
    assert target.inner.read() == bytes([target.fill]) * 3072 + DATA[:1024] and target.intact()


@pytest.mark.san_rule("R8")
@pytest.mark.san_requires("rdma_read")
def test_read_burst_reads_count_times(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    remote, desc = window(b, SIZE, Access.READ)
    remote.inner.write(DATA)
    g, handle = sink(a, SIZE)
    done = _wait(rdma_read_burst(a.provider, a.socket, [(g.inner, handle)], desc, count=COUNT))
    assert done.status is Status.SUCCESS and done.bytes == COUNT * SIZE
    assert g.inner.read() == DATA and g.intact()


@pytest.mark.san_rule("R6")
def test_write_burst_into_a_read_descriptor_is_rejected_after_the_first(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA)
    target, desc = window(b, SIZE, Access.READ)
    outcome = attempt(lambda: rdma_write_burst(a.provider, a.socket, [(buf, handle)], desc, count=COUNT))
    assert rejected(outcome)
    if isinstance(outcome, Completion):  # no write of it succeeded, and none was posted after the failure
        assert outcome.bytes == 0
    assert target.unchanged()


@pytest.mark.san_rule("R7")
def test_write_burst_from_a_write_only_handle_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA, Access.WRITE)
    target, desc = window(b, SIZE, Access.WRITE)
    assert rejected(attempt(lambda: rdma_write_burst(a.provider, a.socket, [(buf, handle)], desc, count=COUNT)))
    assert target.unchanged()


@pytest.mark.san_rule("R8")
def test_write_burst_past_the_end_is_rejected(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA)
    target, desc = window(b, SIZE, Access.WRITE)
    assert rejected(attempt(lambda: rdma_write_burst(a.provider, a.socket, [(buf, handle)], desc, 1, count=COUNT)))
    assert target.unchanged()


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize(("count", "depth"), [(0, 4), (-1, 4), (4, 0), (2.0, 4)])
def test_burst_count_and_depth_below_one_are_einval(conn: SwitchConnection, count: Any, depth: Any) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, DATA)
    target, desc = window(b, SIZE, Access.WRITE)
    expect_error(WsaError.WSAEINVAL, lambda: rdma_write_burst(a.provider, a.socket, [(buf, handle)], desc,
                                                             count=count, depth=depth))  # bad on purpose
    assert target.unchanged()


@dataclasses.dataclass
class Held:
    """A burst posted on a held socket (capability ``faults``): pending until ``release``."""

    handle: Handle
    target: Guarded
    burst: PendingOperation


def held_burst(san_backend: Backend, conn: SwitchConnection) -> Held:
    a, b = conn.local, conn.remote
    assert san_backend.faults is not None
    buf, handle = source(a, DATA)
    target, desc = window(b, SIZE, Access.WRITE)
    san_backend.faults.hold(a.socket)
    return Held(handle, target, rdma_write_burst(a.provider, a.socket, [(buf, handle)], desc, count=COUNT, depth=4))


@pytest.mark.san_rule("R13")
@pytest.mark.san_requires("faults")
def test_registrations_of_a_pending_burst_cannot_be_deregistered(san_backend: Backend, conn: SwitchConnection) -> None:
    a = conn.local
    held = held_burst(san_backend, conn)
    assert not held.burst.done()
    expect_error(WsaError.WSAEINVAL, a.provider.deregister_memory, a.socket, held.handle)
    faults = san_backend.faults
    assert faults is not None  # san_requires("faults")
    faults.release(a.socket)
    done = _wait(held.burst)
    assert done.status is Status.SUCCESS and done.bytes == COUNT * SIZE
    assert held.target.inner.read() == DATA and held.target.intact()
    a.provider.deregister_memory(a.socket, held.handle)  # completed: no longer in use


@pytest.mark.san_rule("R11")
@pytest.mark.san_requires("faults")
def test_close_under_a_pending_burst_aborts_it_and_releases_everything(san_backend: Backend,
                                                                      conn: SwitchConnection) -> None:
    a = conn.local
    held = held_burst(san_backend, conn)
    conn.close()
    done = _wait(held.burst)
    assert done.status is Status.ABORTED and done.bytes == 0
    assert held.target.unchanged()
    assert a.socket.closed and not a.provider.registrations(a.socket)
