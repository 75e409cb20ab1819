"""rsockets' declared deviations (pytest_san.Deviation): where librdmacm's rsockets differs from a Windows Sockets
Direct switch, and why. ``conftest.py`` declares them for a run whose backend observes rsockets; the observed
scenarios that show them then count as deviating (docs/judging-a-switch.md)."""

from __future__ import annotations

from pytest_san.deviations import Deviation

__all__ = ["IMPLEMENTATION", "RSOCKETS"]

IMPLEMENTATION = "rsockets (librdmacm)"

RSOCKETS: tuple[Deviation, ...] = (
    Deviation(
        rule="R9",
        implementation=IMPLEMENTATION,
        what=("three regions per connected socket, not two: a control area (32 bytes plus 24 per iomap slot, where "
              "the peer writes its receive buffer's location and its iomap table) beside the send and receive "
              "buffers (librdmacm rsocket.c rs_init_bufs)"),
        why="by-design",
        tests=("test_exactly_two_regions_per_connected_socket",),
    ),
    Deviation(
        rule="R11",
        implementation=IMPLEMENTATION,
        what=("rclose of a connected socket with a live riomap never returns: it clears the socket's slot, then its "
              "riounmap answers EBADF in a loop at full CPU, the mapping's MR, QP, CQ and CM id still held "
              "(librdmacm rsocket.c rs_free: rs_remove before rs_free_iomappings); a bug of the RDMA stack under "
              "the contract, in user space"),
        why="kernel-bug",
        reproducer="san-hil lab reproduce rsockets-rclose-live-riomap --state-dir DIR",
        tests=("test_rclose_with_a_live_riomap_releases_everything",),
    ),
)
