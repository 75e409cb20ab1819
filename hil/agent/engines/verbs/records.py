"""The records of a verbs process: plain data its parts hand each other, no behaviour of their own.

``Mapping`` (a buffer), ``Registration`` (a handle or an RDMA window), ``Operation`` (a pending
operation), ``Socket`` (its protection domain, RC QP, connection manager ids and the
provider's tables for it); the RDMA descriptor's packing; the work-request id bits.

Standard library + pytest_san.spi.contract, Python 3.9 compatible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_san.spi.contract import (
    DESCRIPTOR,
    QUEUE_DEPTH,
    VALID_ACCESS,
    Access,
    Status,
)

if TYPE_CHECKING:
    from hil.agent.engines.verbs.bursts import Burst

INTERNAL = 1 << 62  # wr_id bit of the engine's own work requests (bind, local invalidate)
FENCED = 1 << 61  # wr_id bit of an iWARP RDMA write whose outcome its fence read tells (posting.py)
INTERNAL_SLOTS = 8  # send-queue room kept for them on top of QUEUE_DEPTH
CQ_PER_SOCKET = 2 * QUEUE_DEPTH + INTERNAL_SLOTS
U64 = (1 << 64) - 1

ACCESS_SHIFT = 56  # iWARP descriptors carry the access in the length's top byte (see pack_descriptor)
LENGTH_MASK = (1 << ACCESS_SHIFT) - 1


def pack_descriptor(reg: Registration, with_access: bool) -> bytes:
    """{address, length, rkey}; ``with_access`` (iWARP) also states the access granted, in the length's top
    byte: siw (kernel 6.1) serves an RDMA read from an MR without REMOTE_READ, so the initiator's provider
    refuses a read of a descriptor that grants none (R7), as it refuses a local one."""
    length = reg.length | (reg.access << ACCESS_SHIFT if with_access else 0)
    return DESCRIPTOR.pack(reg.address, length, reg.key)


def unpack_descriptor(descriptor: bytes) -> tuple[int, int, int, int]:
    """(address, length, rkey, access stated or 0)."""
    address, length, rkey = DESCRIPTOR.unpack(descriptor)
    return address, length & LENGTH_MASK, rkey, length >> ACCESS_SHIFT


class Mapping:
    """One buffer: ``length`` usable bytes at ``address``; ``size`` mapped bytes including the guard page."""

    __slots__ = ("address", "length", "size")

    def __init__(self, address: int, length: int, size: int) -> None:
        self.address = address
        self.length = length
        self.size = size


class Registration:
    """A register_memory handle (``key`` = MR lkey) or an RDMA window (``key`` = window rkey)."""

    __slots__ = ("access", "address", "in_use", "key", "kind", "length", "mr", "mw", "refs")

    def __init__(self, kind: str, key: int, address: int, length: int, access: int, mr: Any, mw: Any) -> None:
        self.kind = kind
        self.key = key
        self.address = address
        self.length = length
        self.access = access
        self.mr = mr
        self.mw = mw
        self.refs = 1
        self.in_use = 0  # pending operations using it

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "address": self.address, "length": self.length,
                "access": self.access, "refs": self.refs, "in_use": self.in_use}

    def __repr__(self) -> str:
        return (f"{self.kind} {self.key:#x} {self.address:#x}+{self.length} "
                f"{Access(self.access).name if self.access in VALID_ACCESS else self.access} refs={self.refs}")


class Operation:
    """A pending operation; ``wr_id`` is its id (every work request of a burst carries it). Completes once."""

    __slots__ = ("burst", "fence_error", "fences", "id", "kind", "nbytes", "nbytes_done", "regs", "sock",
                 "status", "wc_status")

    def __init__(self, op_id: int, sock: Socket, kind: str, fences: bool = False) -> None:
        self.id = op_id
        self.sock = sock
        self.kind = kind
        self.fences = fences  # iWARP: a zero-length read behind it tells whether the responder placed it
        self.regs: list[Registration] = []
        self.nbytes = 0
        self.status: int | None = None
        self.nbytes_done = 0
        self.wc_status: int | None = None  # the raw ibv_wc_status; None when completed in software
        self.burst: Burst | None = None
        self.fence_error: int | None = None  # a fenced write's own failure, reported when its fence completes

    @property
    def on_send_queue(self) -> bool:
        return self.kind != "recv"

    def result(self) -> dict[str, Any]:
        assert self.status is not None
        return {"status": self.status, "bytes": self.nbytes_done, "wc_status": self.wc_status}


class Socket:
    """A SAN socket: its own protection domain (an MR of it is reachable through this QP only: R2 even
    without memory windows), an RC QP connected through the RDMA connection manager, and the provider's
    tables for it."""

    def __init__(self, sid: int, pd: Any, qp: Any) -> None:
        self.id = sid
        self.pd = pd
        self.qp = qp
        # created -> listening (passive) | connecting (active) -> accepted (passive, until ESTABLISHED)
        # -> connected -> error | disconnected -> closed
        self.state = "created"
        self.channel: Any = None  # this socket's CMEventChannel: its events are this socket's alone
        self.fd = -1  # the channel's file descriptor (polled with the child's stdin)
        self.listener: Any = None  # passive: the listening CMID, until it accepted one request
        self.cmid: Any = None  # the CMID of the connection (active: its own; passive: the accepted one)
        self.events: list[int] = []  # CM events a connect is waiting for, in arrival order
        self.handles: dict[int, Registration] = {}  # lkey -> register_memory registration
        self.windows: dict[int, Registration] = {}  # rkey -> register_rdma_memory registration
        self.by_range: dict[tuple[str, int, int, int], Registration] = {}  # reference counting (R13)
        self.send_ops: set[int] = set()  # operation ids outstanding on the send queue
        self.recv_ops: set[int] = set()  # ... and on the receive queue
        self.flush_status = Status.ABORTED.value  # what a WR_FLUSH_ERR means for this socket's operations
