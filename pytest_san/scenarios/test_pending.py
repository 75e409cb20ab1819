"""RDMA held pending (capability ``faults``) while the connection changes under it (R4): released over a link
that dropped, it completes CONNECTION_RESET and moves no byte; released over the link as it was, it completes
as if never held. Each over one to three local entries, in both directions."""

from __future__ import annotations

import pytest

from pytest_san import Access, Backend, Status

from .support import NEEDS_READ, TIMEOUT, RawEnd, guarded, window

DATA = bytes(range(48))
SCATTER = pytest.mark.san_requires("rdma_read_scatter")
SHAPES = [pytest.param("rdma_write", 1, id="1-rdma_write"),
          pytest.param("rdma_read", 1, id="1-rdma_read", marks=NEEDS_READ),
          pytest.param("rdma_write", 3, id="3-rdma_write"),
          pytest.param("rdma_read", 3, id="3-rdma_read", marks=[NEEDS_READ, SCATTER])]
"""(kind, local entries): an RDMA read into several buffers needs ``rdma_read_scatter``."""


@pytest.mark.san_rule("R4")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize(("kind", "entries"), SHAPES)
@pytest.mark.parametrize("link_drops", [False, True], ids=["link-up", "link-dropped"])
def test_held_rdma_completes_as_the_connection_is_when_released(san_backend: Backend,
                                                                raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                                entries: int, link_drops: bool) -> None:
    a, b = raw_pair
    faults = san_backend.faults
    assert faults is not None
    local = guarded(a, len(DATA), 0x00)
    local.inner.write(DATA)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READWRITE)
    target, desc = window(b, len(DATA), Access.READWRITE, fill=0x77)
    step = len(DATA) // entries
    scatter = [(local.inner.view(i * step, step), handle) for i in range(entries)]
    faults.hold(a.socket)
    op = getattr(a.provider, kind)(a.socket, scatter, desc, 0)
    if link_drops:
        faults.drop_link(a.process.node, b.process.node)
    try:
        faults.release(a.socket)
        done = op.wait(TIMEOUT)
    finally:
        if link_drops:
            faults.restore_link(a.process.node, b.process.node)
    if link_drops:
        assert done.status is Status.CONNECTION_RESET and done.bytes == 0, done
        assert target.unchanged(), "bytes moved over a dropped link"
        assert local.inner.read() == DATA and local.intact()
    else:
        assert done.status is Status.SUCCESS and done.bytes == len(DATA), done
        moved = target.inner.read() if kind == "rdma_write" else local.inner.read()
        assert moved == (DATA if kind == "rdma_write" else bytes([0x77]) * len(DATA))
        assert target.intact() and local.intact()
