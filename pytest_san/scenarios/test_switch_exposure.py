"""What a large transfer exposes to the peer (R10): the sender's READ descriptor for the receiver's RdmaRead, or
the receiver's WRITE descriptor for the sender's RdmaWrite, and no other RDMA registration, at every step.

A switch that registered the sender's data READWRITE, or offered a READWRITE sink, would move the same bytes and
pass every check of what arrived; the peer could then also write into the sender's memory, or read the receiver's.
So each end's RDMA registrations are read between every two steps of the transfer.

What the provider reports is compared with what it reports for the same access asked for directly: a provider
that widens every RDMA registration (R6, R7) is judged by those rules' scenarios, not blamed on the switch.
"""

from __future__ import annotations

import pytest

from pytest_san import Access
from pytest_san.spi.protocols import Switch, SwitchConnection, SwitchEndpoint

from .support import NEEDS_READ, TIMEOUT

THRESHOLD = 4096
ROUNDS = 1000
"""At most this many rounds of both ends' ``progress``: each moves something, or the transfer has gone quiet."""


def _rdma_access(end: SwitchEndpoint) -> list[Access]:
    return [r.access for r in end.provider.registrations(end.socket) if r.kind == "rdma"]


def _reported(end: SwitchEndpoint, access: Access) -> Access:
    """The access ``end``'s provider reports for an RDMA registration asked with ``access`` on its socket."""
    before = _rdma_access(end)
    descriptor = end.provider.register_rdma_memory(end.socket, end.process.alloc(4096), access)
    try:
        added = _rdma_access(end)
        for known in before:
            added.remove(known)
        assert len(added) == 1, f"one RDMA registration made, {len(added)} more reported"
        return added[0]
    finally:
        end.provider.deregister_rdma_memory(end.socket, descriptor)


def _exposed(conn: SwitchConnection, reads: bool, access: Access, step: str) -> int:
    """The RDMA registrations live now, after ``step``: only the exposing end's, each with ``access``."""
    exposing, other = (conn.local, conn.remote) if reads else (conn.remote, conn.local)
    found = _rdma_access(exposing)
    assert all(a == access for a in found), f"after {step}, the {exposing.name} end exposes {found}, not {access!r}"
    assert _rdma_access(other) == [], f"after {step}, the {other.name} end has RDMA registrations: the peer exposes"
    return len(found)


@pytest.mark.san_rule("R10")
@pytest.mark.parametrize("mode", ["auto", pytest.param("read", marks=NEEDS_READ), "write"])
@pytest.mark.parametrize("size", [THRESHOLD + 1, 3 * THRESHOLD + 7])
def test_a_large_transfer_exposes_one_descriptor_of_its_direction_only(san_switch: Switch, mode: str,
                                                                       size: int) -> None:
    """A send above the threshold, the ends moved one at a time: between any two steps the sender's RDMA
    registrations are READ and the receiver has none (RdmaRead), or the receiver's are WRITE and the sender has
    none (RdmaWrite); none is left after. (Whether one is live between two steps depends on how much a switch
    does in one step and on when completions show: not asked.)"""
    conn = san_switch.connect(rdma_threshold=THRESHOLD, rdma_mode=mode)
    size = conn.rdma_threshold + size - THRESHOLD
    reads = conn.remote.provider.supports_rdma_read if mode == "auto" else mode == "read"
    access = _reported(conn.local if reads else conn.remote, Access.READ if reads else Access.WRITE)
    data = bytes(range(251)) * (size // 251) + bytes(size % 251)
    conn.local.send(data)
    _exposed(conn, reads, access, "the send")
    for round_ in range(ROUNDS):
        moved = False
        for end in (conn.local, conn.remote):
            moved = end.progress() or moved
            _exposed(conn, reads, access, f"round {round_} of the {end.name} end")
        if not moved:
            break
    assert conn.remote.recv(size, timeout=TIMEOUT) == data
    conn.flush(timeout=TIMEOUT)
    assert _exposed(conn, reads, access, "the flush") == 0, "an RDMA registration outlived its transfer"
