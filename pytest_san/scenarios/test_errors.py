"""R14: the error codes of CONTRACT.md section 2, each provoked and checked."""

from __future__ import annotations

from typing import cast

import pytest

from pytest_san import Access, Backend, SanError, Status, WsaError
from pytest_san.batch import batch, values
from pytest_san.spi.protocols import SwitchConnection

from .support import (
    TIMEOUT,
    RawEnd,
    attempt,
    expect_error,
    rejected,
    sink,
    source,
    sources,
    succeeded,
    window,
    write_into,
)


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("flags", [0, 4, 7, -1, 0x10])
def test_bad_access_flags_are_einval(conn: SwitchConnection, flags: int) -> None:
    a = conn.local
    buf = a.process.alloc(64)
    bad = cast(Access, flags)  # deliberately not an Access value
    expect_error(WsaError.WSAEINVAL, lambda: a.provider.register_memory(a.socket, buf, bad))
    expect_error(WsaError.WSAEINVAL, lambda: a.provider.register_rdma_memory(a.socket, buf, bad))


@pytest.mark.san_rule("R14")
def test_unmapped_or_empty_buffer_is_efault(conn: SwitchConnection) -> None:
    a = conn.local
    buf = a.process.alloc(4096)
    for bad in (a.process.buffer_at(0x1000, 4096),  # never mapped
                a.process.buffer_at(buf.address, 1 << 30),  # runs off the end of the mapping
                buf.view(0, 0)):  # empty
        for register in (a.provider.register_memory, a.provider.register_rdma_memory):
            expect_error(WsaError.WSAEFAULT, register, a.socket, bad, Access.READ)


@pytest.mark.san_rule("R14")
def test_descriptor_too_small_probe(conn: SwitchConnection) -> None:
    a = conn.local
    buf = a.process.alloc(4096)
    before = len(a.provider.registrations(a.socket))
    with pytest.raises(SanError) as err:
        a.provider.register_rdma_memory(a.socket, buf, Access.READ, descriptor_size=1)
    assert err.value.code is WsaError.WSAEFAULT
    needed = err.value.required_size
    assert isinstance(needed, int) and needed > 1
    assert len(a.provider.registrations(a.socket)) == before  # the probe registered nothing
    desc = a.provider.register_rdma_memory(a.socket, buf, Access.READ, descriptor_size=needed)
    assert len(desc) == needed  # the probe reveals the length a descriptor has
    a.provider.deregister_rdma_memory(a.socket, desc)


ROOM_ABOVE = (0, 1, 7, 64)
"""descriptor_size values above the required size tried (as offsets from it): each must do."""


@pytest.mark.san_rule("R14")
def test_every_descriptor_size_below_the_required_one_is_the_probe(san_backend: Backend,
                                                                  raw_pair: tuple[RawEnd, RawEnd]) -> None:
    """The size a descriptor needs is whatever the provider says when probed with 0 (never assumed): every size
    from 0 up to it is WSAEFAULT carrying that same size and registers nothing; it and any larger size give a
    descriptor of exactly that size (the probe reveals the provider's length), which the peer can use."""
    a, b = raw_pair
    buf = b.process.alloc(4096)
    before = len(b.provider.registrations(b.socket)), b.proxy.live_allocations()
    needed = expect_error(WsaError.WSAEFAULT, b.provider.register_rdma_memory, b.socket, buf, Access.WRITE,
                          0).required_size
    assert isinstance(needed, int) and needed > 0, f"the probe with 0 says a descriptor needs {needed!r} bytes"
    with batch(san_backend) as bt:
        probes = [bt.call(b.provider.register_rdma_memory, b.socket, buf, Access.WRITE, size)
                  for size in range(1, needed)]
    for size, probe in enumerate(probes, start=1):
        value = probe.error
        assert isinstance(value, SanError), f"descriptor_size={size} of {needed}: gave {probe.outcome[1]!r}"
        assert value.code is WsaError.WSAEFAULT and value.required_size == needed, f"descriptor_size={size}: {value}"
    assert (len(b.provider.registrations(b.socket)), b.proxy.live_allocations()) == before, "a probe registered"
    for extra in ROOM_ABOVE:
        desc = b.provider.register_rdma_memory(b.socket, buf, Access.WRITE, needed + extra)
        assert len(desc) == needed, f"descriptor_size={needed + extra}: a {len(desc)}-byte descriptor, not {needed}"
        if extra == 0:
            assert succeeded(write_into(a, desc, b"\x42" * 64), 64) and buf.read(64) == b"\x42" * 64
        b.provider.deregister_rdma_memory(b.socket, desc)
    assert (len(b.provider.registrations(b.socket)), b.proxy.live_allocations()) == before


@pytest.mark.san_rule("R14")
def test_malformed_descriptor_is_einval(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(a, b"x" * 64)
    _, desc = window(b, 64, Access.WRITE)
    for bad in (b"", desc[:-1], desc + b"\0"):
        expect_error(WsaError.WSAEINVAL, a.provider.rdma_write, a.socket, [(buf, handle)], bad, 0)
        expect_error(WsaError.WSAEINVAL, b.provider.deregister_rdma_memory, b.socket, bad)


@pytest.mark.san_rule("R14")
def test_too_many_buffers_is_einval(san_backend: Backend, conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    parts = sources(san_backend, a, [b"p" * 8] * 64)
    _, desc = window(b, 64 * 8, Access.WRITE)
    expect_error(WsaError.WSAEINVAL, lambda: a.provider.rdma_write(a.socket, parts, desc, 0))


@pytest.mark.san_rule("R14")
def test_full_queue_is_enetdown(san_backend: Backend, conn: SwitchConnection) -> None:
    b = conn.remote
    g, handle = sink(b, 16)
    posted = []
    with pytest.raises(SanError) as err:
        for _ in range(100_000):  # far beyond any receive queue
            posted.append(b.provider.recv(b.socket, [(g.inner, handle)]))
    assert err.value.code is WsaError.WSAENETDOWN
    with batch(san_backend) as bt:  # on a lab: one round trip
        done = [bt.call(op.done) for op in posted]
    assert posted and not any(values(done))


@pytest.mark.san_rule("R14", "R4")
def test_closed_socket_is_enotsock(conn: SwitchConnection) -> None:
    a = conn.local
    buf = a.process.alloc(64)
    a.close()
    expect_error(WsaError.WSAENOTSOCK, lambda: a.provider.register_memory(a.socket, buf, Access.READ))
    expect_error(WsaError.WSAENOTSOCK, lambda: a.provider.close_socket(a.socket))


@pytest.mark.san_rule("R14", "R4")
def test_disconnected_socket_is_enotconn(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    buf, handle = source(b, b"y" * 64)
    a.close()
    fresh = b.process.alloc(64)
    expect_error(WsaError.WSAENOTCONN, lambda: b.provider.register_memory(b.socket, fresh, Access.READ))
    expect_error(WsaError.WSAENOTCONN, lambda: b.provider.send(b.socket, [(buf, handle)]))


@pytest.mark.san_rule("R14")
def test_rdma_read_supported_or_eopnotsupp(conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    _, desc = window(b, 64, Access.READ, fill=0x42)
    g, handle = sink(a, 64)
    if a.provider.supports_rdma_read:
        done = attempt(lambda: a.provider.rdma_read(a.socket, [(g.inner, handle)], desc, 0))
        assert not isinstance(done, SanError) and done.status is Status.SUCCESS
        assert g.inner.read() == b"\x42" * 64
    else:
        expect_error(WsaError.WSAEOPNOTSUPP, lambda: a.provider.rdma_read(a.socket, [(g.inner, handle)], desc, 0))


@pytest.mark.san_rule("R14")
def test_pending_then_aborted_on_close(conn: SwitchConnection) -> None:
    b = conn.remote
    g, handle = sink(b, 64)
    op = b.provider.recv(b.socket, [(g.inner, handle)])
    assert not op.done()  # WSA_IO_PENDING
    with pytest.raises(TimeoutError):
        op.wait(timeout=0.01)
    b.close()
    assert op.wait(timeout=TIMEOUT).status is Status.ABORTED  # WSA_OPERATION_ABORTED


@pytest.mark.san_rule("R14")
def test_receive_too_small_is_local_length(san_backend: Backend, raw_pair: tuple[RawEnd, RawEnd]) -> None:
    a, b = raw_pair
    g, handle = sink(b, 16)
    recv = b.provider.recv(b.socket, [(g.inner, handle)])
    buf, sh = source(a, b"L" * 64)
    send = attempt(lambda: a.provider.send(a.socket, [(buf, sh)]))
    expected = {Status.LOCAL_LENGTH}
    if "verbs" in san_backend.capabilities:
        # Soft-RoCE completes an RC receive that is too small with LOC_QP_OP_ERR (2), not
        # LOC_LEN_ERR (1); the contract maps that to REMOTE_OPERATION. Rejected either way.
        expected.add(Status.REMOTE_OPERATION)
    assert recv.wait(timeout=TIMEOUT).status in expected
    assert rejected(send)
    assert g.unchanged()


@pytest.mark.san_rule("R14")
@pytest.mark.san_requires("faults")
def test_link_drop_is_connection_reset(san_backend: Backend, conn: SwitchConnection) -> None:
    a, b = conn.local, conn.remote
    assert san_backend.faults is not None
    g, handle = sink(a, 64)
    pending = a.provider.recv(a.socket, [(g.inner, handle)])
    san_backend.faults.drop_link(a.process.node, b.process.node)
    try:
        assert pending.wait(timeout=TIMEOUT).status is Status.CONNECTION_RESET  # WSAECONNRESET
        with pytest.raises(SanError) as err:
            a.send(b"after the drop")
            a.recv(1, timeout=1)
        assert err.value.code in (WsaError.WSAECONNRESET, WsaError.WSAENOTCONN)
    finally:
        san_backend.faults.restore_link(a.process.node, b.process.node)


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("kind", ["send", "rdma_write"])
def test_a_stale_handle_in_a_scatter_list_completes_with_its_error(san_backend: Backend,
                                                                   raw_pair: tuple[RawEnd, RawEnd], kind: str) -> None:
    """A handle deregistered before the call names no memory: the operation completes LOCAL_PROTECTION with 0
    bytes (on verbs also REMOTE_OPERATION, a NIC's LOC_QP_OP_ERR), never ABORTED: a flush would say that
    something else failed first."""
    a, b = raw_pair
    buf, handle = source(a, b"S" * 64)
    a.provider.deregister_memory(a.socket, handle)
    if kind == "send":
        g, dh = sink(b, 64)
        b.provider.recv(b.socket, [(g.inner, dh)])
        op = a.provider.send(a.socket, [(buf, handle)])
    else:
        g, descriptor = window(b, 64, Access.WRITE)
        op = a.provider.rdma_write(a.socket, [(buf, handle)], descriptor, 0)
    done = op.wait(timeout=TIMEOUT)
    expected = {Status.LOCAL_PROTECTION}
    if "verbs" in san_backend.capabilities:
        expected.add(Status.REMOTE_OPERATION)  # the model's unknown-lkey-status: rxe, siw
    assert done.status in expected and done.bytes == 0, done
    assert g.unchanged()
