"""rsockets' declared deviations (pytest_san.Deviation): where librdmacm's rsockets differs from a Windows Sockets
Direct switch, and why. ``conftest.py`` declares them for a run whose backend observes rsockets; the observed
scenarios that show them then count as deviating (docs/judging-a-switch.md)."""

from __future__ import annotations

from pytest_san.deviations import Deviation

__all__ = ["IMPLEMENTATION", "NVME", "NVME_POOL_KEYS", "NVME_RDMA", "RSOCKETS"]

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


NVME_RDMA = "NVMe over Fabrics on RDMA (the kernel's nvme-rdma host)"

EVERY_ACCESS = ("every request's MR gets local write, remote read and remote write, whatever the I/O's direction "
                "(rdma.c nvme_rdma_map_sg_fr)")

NVME: tuple[Deviation, ...] = (
    Deviation(
        rule="R2",
        implementation=NVME_RDMA,
        what=("one protection domain per RDMA device, shared by every controller and every queue of the host "
              "(drivers/nvme/host/rdma.c nvme_rdma_find_get_device: one nvme_rdma_device per ib_device, its PD "
              "allocated once): a key a controller advertised is valid on any other controller's queue pair"),
        why="by-design",
        tests=("test_each_controller_has_its_own_protection_domain",),
    ),
    Deviation(
        rule="R6",
        implementation=NVME_RDMA,
        what=f"{EVERY_ACCESS}: a target may write into the buffer a host sends from",
        why="by-design",
        tests=("test_a_buffer_the_host_sends_from_cannot_be_written_by_the_peer",),
    ),
    Deviation(
        rule="R7",
        implementation=NVME_RDMA,
        what=f"{EVERY_ACCESS}: a target may read the buffer a host receives into",
        why="by-design",
        tests=("test_a_buffer_the_host_receives_into_cannot_be_read_by_the_peer",),
    ),
)
"""Declared with either value of ``register_always``."""

NVME_POOL_KEYS: tuple[Deviation, ...] = (
    Deviation(
        rule="R3",
        implementation=NVME_RDMA,
        what=("a pool MR's key changes only in its low 8 bits (ib_inc_rkey per request), and the pool hands back "
              "the MR it took last: after 256 requests one after the other, the same key is advertised again"),
        why="by-design",
        tests=("test_a_pool_key_is_never_handed_out_again",),
    ),
)
"""Declared with ``register_always=Y`` only: with N a single-segment request uses the global key, no pool MR."""
