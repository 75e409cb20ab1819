"""One modelled process = one real OS process: its own pyverbs Context and CQ, a PD per socket.

Everything a SAN provider keeps for the sockets of one process lives here, on real verbs objects:

* buffers: anonymous mmap'd memory at real virtual addresses (ctypes), each followed by a
  PROT_NONE guard page so no range can run from one buffer into the next;
* per socket a protection domain and an RC QP in it, connected through the RDMA connection manager
  (``socket_listen`` -> {address, port} for the peer; ``socket_connect`` to such a listener; the
  listening child accepts by itself: connections.py);
* register_memory: one MR per registration (access 0 for READ, LOCAL_WRITE for WRITE/READWRITE)
  in the socket's PD; the handle IS the MR's lkey, so a handle from another process (another
  Context) or another socket (another PD) reaches the NIC and fails there (R1). The READ/WRITE split
  for local use is kept in software too (R6 local half, R7), as is "only on its socket";
* register_rdma_memory: where the device has type-2 memory windows, an MR with LOCAL_WRITE|MW_BIND
  and a window bound on the socket's QP (IBV_WR_BIND_MW, REMOTE_READ / REMOTE_WRITE / both); else
  an MR with those remote rights. Either way in the socket's PD, so the responder's NIC refuses it
  through any other QP (R2: both rxe and siw check an MR's PD against the QP's), after deregistration
  (R3), without the right (R6, R7) and out of bounds (R8); the descriptor packs {address, length, rkey};
* deregistration: IBV_WR_LOCAL_INV on the window rkey, dealloc the MW, dereg the MR;
* data transfer: posted work requests; completions are polled from the one CQ and their
  ibv_wc_status numbers are the contract's Status values (unknown ones become REMOTE_OPERATION);
* close_socket: CM disconnects (the peer's DISCONNECTED tells it), the QP goes to ERR, the flush
  completes pending operations ABORTED, every registration of the socket is released and the QP,
  CM ids and PD destroyed (R11).

Capabilities come from the device, never from its name: max_sge, max_sge_rd (an RDMA read with more
buffers is WSAEINVAL, "too many buffers"), type-2 windows, RDMA reads in flight, the transport.
Errors are ``pytest_san.contract.SanError`` with the contract's Winsock codes. Standard library + pyverbs,
Python 3.9 compatible.

Where each part lives: ``state.py`` (the records and tables), ``memory.py`` (buffers),
``sockets.py`` (PD and QP: create, state, close), ``connections.py`` (the connection manager),
``registrations.py`` (MRs, windows), ``operations.py`` (posting RDMA, send, receive, bursts),
``completions.py`` (the CQ, waits, the engine's own work requests); this module assembles them into
``VerbsProcess``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from pyverbs.cq import CQ  # type: ignore[import-not-found]
from pyverbs.device import Context  # type: ignore[import-not-found]

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.completions import CompletionsMixin
from hil.agent.engines.verbs.connections import RD_ATOMIC, ConnectionsMixin
from hil.agent.engines.verbs.devices import SYSFS, device_address
from hil.agent.engines.verbs.libc import libc
from hil.agent.engines.verbs.memory import MemoryMixin
from hil.agent.engines.verbs.operations import OperationsMixin
from hil.agent.engines.verbs.registrations import RegistrationsMixin
from hil.agent.engines.verbs.sockets import SocketsMixin
from hil.agent.engines.verbs.state import CQ_PER_SOCKET, INTERNAL, Mapping, Operation, Socket
from pytest_san.contract import (
    MAX_SGE,
    SanError,
    WsaError,
)


class VerbsProcess(MemoryMixin, SocketsMixin, ConnectionsMixin, RegistrationsMixin, OperationsMixin,
                   CompletionsMixin):
    """The provider side of one process: buffers, sockets, registrations and operations on real verbs.

    ``mw_mode`` is ``"mw2"`` (type-2 memory windows bound to the socket's QP, the contract's mechanism)
    or ``"mr"`` (an MR with remote rights, for a device without type-2 windows: "memory_windows" is not
    claimed). Both keep R2 through the socket's own PD. ``"auto"`` picks mw2 when the device advertises
    type-2 windows. ``address`` is the IP address CM binds to (default: the device's netdev's).
    """

    def __init__(self, device: str, port: int = 1, address: str | None = None, mw_mode: str = "auto",
                 cq_size: int = 4096) -> None:
        self.device = device
        self.port = port
        self.address = address or device_address(device, port)[1]
        self.iwarp = _node_type(device).startswith("4")  # "4: RNIC"
        self.ctx = Context(name=device)
        try:
            attr = self.ctx.query_device()
            self.max_sge = min(MAX_SGE, int(attr.max_sge))
            self.max_sge_rd = max(1, min(self.max_sge, int(attr.max_sge_rd) or self.max_sge))
            self.max_rd_atomic = max(1, min(RD_ATOMIC, int(attr.max_qp_rd_atom), int(attr.max_qp_init_rd_atom)))
            self.atomic_cap = int(attr.atomic_caps)
            self.max_mr_size = int(attr.max_mr_size)
            cap_flags = int(attr.device_cap_flags)
            has_mw2 = bool(cap_flags & (e.IBV_DEVICE_MEM_WINDOW_TYPE_2A | e.IBV_DEVICE_MEM_WINDOW_TYPE_2B)) \
                and int(attr.max_mw) > 0
            if mw_mode == "auto":
                mw_mode = "mw2" if has_mw2 else "mr"
            if mw_mode not in ("mw2", "mr"):
                raise ValueError(f"mw_mode must be auto, mw2 or mr, got {mw_mode!r}")
            self.mw_mode = mw_mode
            self.device_has_mw2 = has_mw2
            port_attr = self.ctx.query_port(port)
            if int(port_attr.state) != e.IBV_PORT_ACTIVE:
                raise SanError(WsaError.WSAENETDOWN, f"port {port} of {device} is not ACTIVE "
                               f"(state {int(port_attr.state)})")
            self.mtu = int(port_attr.active_mtu)
            self.max_msg_sz = int(port_attr.max_msg_sz)
            self.cq_size = min(int(attr.max_cqe), cq_size)
            self.cq = CQ(self.ctx, self.cq_size)
        except BaseException:
            self.ctx.close()
            raise
        self.max_sockets = max(1, self.cq_size // CQ_PER_SOCKET)
        self.pid = os.getpid()
        self._bases: list[int] = []  # sorted buffer addresses
        self._maps: dict[int, Mapping] = {}
        self._sockets: dict[int, Socket] = {}
        self._closed_sockets: set[int] = set()
        self._next_socket = 1
        self._ops: dict[int, Operation] = {}
        self._next_op = 1
        self._internal: dict[int, int] = {}  # internal wr_id -> wc status, once completed
        self._next_internal = INTERNAL | 1
        self._zombies: list[Any] = []  # MRs/MWs whose release the device refused for now
        self._null_buf = 0
        self._pumping = False
        self.closed = False

    # -- introspection --------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        return {"pid": self.pid, "device": self.device, "port": self.port, "address": self.address,
                "transport": "iwarp" if self.iwarp else "ib", "mtu": self.mtu, "mw_mode": self.mw_mode,
                "device_has_mw2": self.device_has_mw2, "max_sge": self.max_sge, "max_sge_rd": self.max_sge_rd,
                "max_rd_atomic": self.max_rd_atomic, "atomic_cap": self.atomic_cap,
                "max_sockets": self.max_sockets, "enums": e.SOURCE}

    # -- teardown -------------------------------------------------------------------------------

    def reset(self) -> None:
        """Close every socket (releasing its registrations); buffers stay. The host forgets every socket
        and operation at a reset, so their records go too (this process may serve a whole session)."""
        for sid in list(self._sockets):
            self.close_socket(sid)
        self._ops.clear()
        self._closed_sockets.clear()
        self._retry_zombies()

    def _check_open(self) -> None:
        if self.closed:
            raise SanError(WsaError.WSAENOTSOCK, f"pid {self.pid} has shut down")

    def close(self) -> None:
        """Release everything explicitly (the kernel would when the process dies)."""
        if self.closed:
            return
        self.reset()
        self._retry_zombies()
        for address in list(self._maps):
            mapping = self._maps.pop(address)
            libc.munmap(address, mapping.size)
        self._bases = []
        for obj in (self.cq, self.ctx):
            with contextlib.suppress(Exception):
                obj.close()
        self.closed = True


def _node_type(device: str) -> str:
    """The device's node type as sysfs says it ("1: CA" for IB/RoCE, "4: RNIC" for iWARP)."""
    try:
        with open(os.path.join(SYSFS, device, "node_type")) as f:
            return f.read().strip()
    except OSError:
        return ""


__all__ = ["SanError", "VerbsProcess", "WsaError"]
