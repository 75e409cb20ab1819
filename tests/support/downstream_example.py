"""A downstream project's test, written only from CONTRACT.md section 5 (copied into a pytester dir beside the
README's example, which tests/support/readme.py reads from README.md)."""

from pytest_san import Access, SanError, Status, WsaError


def test_second_process_cannot_use_my_handle(san_switch, san_backend):
    conn = san_switch.connect()
    a, b = conn.local, conn.remote
    other = a.process.node.spawn_process()
    conn2 = san_switch.connect(peer=b.process, process=other)
    src = a.process.alloc(64)
    h = a.provider.register_memory(a.socket, src, Access.READ)
    dst = b.process.alloc(64)
    desc = b.provider.register_rdma_memory(conn2.remote.socket, dst, Access.WRITE)
    mine = other.alloc(64)
    try:
        done = other.node.provider.rdma_write(conn2.local.socket, [(mine, h)], desc, offset=0).wait(timeout=10)
        assert done.status is not Status.SUCCESS
    except SanError as exc:
        assert exc.code in (WsaError.WSAEINVAL, WsaError.WSAEFAULT)
    assert dst.read(64) == bytes(64)
    assert san_backend.name in ("emulator", "hil")
    assert san_provider_is_local(san_switch)


def san_provider_is_local(switch):
    return switch.connect().local.provider is switch.backend.nodes[0].provider
