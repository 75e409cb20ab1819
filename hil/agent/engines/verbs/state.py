"""What every part of a ``VerbsProcess`` shares: its records and its tables.

* the records: ``Mapping`` (a buffer), ``Registration`` (a handle or an RDMA window), ``Operation``
  (a pending operation) and its ``Burst``, ``Socket`` (its protection domain, RC QP, connection
  manager ids and the provider's tables for it);
* ``ProcessState``: the base of the parts of ``VerbsProcess`` (memory.py, sockets.py,
  registrations.py, operations.py, completions.py): the objects and tables ``VerbsProcess.__init__``
  sets up, and, for the type checker only, the calls one part makes into another.

Standard library + pytest_san.contract, Python 3.9 compatible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_san.contract import (
    DESCRIPTOR,
    QUEUE_DEPTH,
    VALID_ACCESS,
    Access,
    Status,
)

INTERNAL = 1 << 62  # wr_id bit of the engine's own work requests (bind, local invalidate)
FENCED = 1 << 61  # wr_id bit of an iWARP RDMA write whose outcome its fence read tells (operations.py)
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


class Burst:
    """The same RDMA work request posted ``count`` times, up to ``depth`` in flight (one Operation)."""

    __slots__ = ("count", "depth", "error", "fenced", "in_flight", "ok_bytes", "posted", "target", "wr")

    def __init__(self, wr: Any, count: int, depth: int, target: tuple[int, int] = (0, 0)) -> None:
        self.wr = wr
        self.target = target  # (rkey, remote address) of the work request
        self.count = count
        self.depth = depth
        self.posted = 0
        self.in_flight = 0
        self.ok_bytes = 0
        self.error: int | None = None  # the first failure's status: nothing more is posted
        self.fenced = False  # iWARP: the fence read behind the last write is posted


class Operation:
    """A pending operation; ``wr_id`` is its id (every work request of a burst carries it). Completes once."""

    __slots__ = ("burst", "fence_error", "id", "kind", "nbytes", "nbytes_done", "regs", "sock", "status",
                 "wc_status")

    def __init__(self, op_id: int, sock: Socket, kind: str) -> None:
        self.id = op_id
        self.sock = sock
        self.kind = kind
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
        self.null_mr: Any = None  # one registered page of this PD for zero-length scatter lists
        self.handles: dict[int, Registration] = {}  # lkey -> register_memory registration
        self.windows: dict[int, Registration] = {}  # rkey -> register_rdma_memory registration
        self.by_range: dict[tuple[str, int, int, int], Registration] = {}  # reference counting (R13)
        self.send_ops: set[int] = set()  # operation ids outstanding on the send queue
        self.recv_ops: set[int] = set()  # ... and on the receive queue
        self.internal: set[int] = set()  # engine work requests (bind, invalidate) not yet completed
        self.flush_status = Status.ABORTED.value  # what a WR_FLUSH_ERR means for this socket's operations


class ProcessState:
    """The verbs objects and tables of one process (set by ``VerbsProcess.__init__``), shared by its parts."""

    device: str
    port: int
    address: str  # the device's IP address: listeners bind to it, connections start from it
    iwarp: bool  # the transport: iWARP moves a connected QP to RTS itself
    ctx: Any  # pyverbs Context and CQ (each socket has its own PD)
    cq: Any
    max_sge: int
    max_sge_rd: int  # scatter entries an RDMA read may have (siw: 1)
    max_rd_atomic: int  # RDMA reads in flight per QP, each way (the device's limits, at most RD_ATOMIC)
    max_mr_size: int
    mw_mode: str  # "mw2" or "mr"
    device_has_mw2: bool
    mtu: int
    lid: int
    max_msg_sz: int
    cq_size: int
    max_sockets: int
    pid: int
    _bases: list[int]  # sorted buffer addresses
    _maps: dict[int, Mapping]
    _sockets: dict[int, Socket]
    _closed_sockets: set[int]
    _next_socket: int
    _ops: dict[int, Operation]
    _next_op: int
    _internal: dict[int, int]  # internal wr_id -> wc status, once completed
    _next_internal: int
    _zombies: list[Any]  # MRs/MWs whose release the device refused for now
    _null_buf: int  # one page for zero-length scatter lists (registered per socket)
    _pumping: bool  # handling CM events (they are not handled again from inside)
    closed: bool

    if TYPE_CHECKING:  # the calls between parts; each is defined in the part named
        # process.py
        def _check_open(self) -> None: ...

        # memory.py
        def alloc(self, nbytes: int) -> dict[str, int]: ...
        def _mapping_of(self, address: int, length: int) -> Mapping | None: ...
        def _null_sge(self, sock: Socket) -> Any: ...

        # sockets.py
        def _new_socket(self) -> Socket: ...
        def _socket(self, socket: Any) -> Socket: ...
        def _refresh(self, sock: Socket) -> None: ...
        def _connected(self, socket: Any) -> Socket: ...
        def _to_error(self, sock: Socket) -> None: ...
        def close_socket(self, socket: int) -> None: ...

        def socket_peer_closed(self, socket: int, status: int = ...) -> None: ...
        def _close_socket_verbs(self, sock: Socket) -> None: ...

        # connections.py
        def _pump(self, timeout: float = 0.0) -> int: ...
        def _await_established(self, sock: Socket, timeout: float = ...) -> None: ...

        # registrations.py
        def _release(self, sock: Socket, reg: Registration, force: bool = False) -> None: ...
        def _close_verbs(self, obj: Any) -> None: ...
        def _retry_zombies(self) -> None: ...

        # operations.py
        def _refill(self, op: Operation) -> None: ...
        def _send_queue_used(self, sock: Socket) -> int: ...
        def _fences(self, op: Operation) -> bool: ...
        def _fence_status(self, sock: Socket, wc_status: int) -> int: ...

        # completions.py
        def _poll(self) -> int: ...
        def _error_status(self, sock: Socket, wc_status: int) -> int: ...
        def _finish(self, op: Operation, status: int, nbytes: int) -> None: ...
        def _internal_id(self) -> int: ...
        def _run_internal(self, sock: Socket, wr: Any, timeout: float = 20.0) -> int | None: ...
        def _drain(self, sock: Socket, timeout: float) -> None: ...
