"""The emulator's books of pending operations (``EmulatedSocket.pending``), which the SPI fuzz's invariant and the
leak check read: an operation a close completed is no longer pending."""

from __future__ import annotations

import pytest

from pytest_san import Access
from pytest_san.spi.emulator import EmulatorBackend


@pytest.mark.parametrize("closed", ["sender", "receiver"])
def test_a_send_waiting_for_a_receive_is_not_pending_once_a_close_completed_it(closed: str) -> None:
    """Found by the SPI fuzz (tests/pytest_san/spi/emulator/test_fuzz_spi.py, its emulator run) after 2f584fe stopped a
    close from pruning the peer's queue of waiting sends: the send completed, its handle's in-use mark was
    released, yet the sender's pending() still listed it ("in_use 0, 1 users")."""
    backend = EmulatorBackend(2)
    pa, pb = backend.nodes[0].default_process, backend.nodes[1].default_process
    sa, sb = backend.connect_sockets(pa, pb)
    src = pa.alloc(64)
    handle = pa.node.provider.register_memory(sa, src, Access.READ)
    send = pa.node.provider.send(sa, [(src, handle)])
    assert not send.done() and sa.pending() == [send]
    first, second = (sa, sb) if closed == "sender" else (sb, sa)
    first.provider.close_socket(first)
    assert send.done()
    assert sa.pending() == [] and sb.pending() == []
    second.provider.close_socket(second)
    assert backend.leaks() == []
    backend.close()
