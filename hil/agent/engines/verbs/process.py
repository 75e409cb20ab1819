"""One modelled process = one real OS process: its own pyverbs Context, PD and CQ.

Everything a SAN provider keeps for the sockets of one process lives here, on real verbs objects:

* buffers: anonymous mmap'd memory at real virtual addresses (ctypes), each followed by a
  PROT_NONE guard page so no range can run from one buffer into the next;
* per socket an RC QP (two-phase setup: ``socket_create`` -> info for the peer, ``socket_connect``
  with the peer's info moves it INIT -> RTR -> RTS);
* register_memory: one MR per registration (access 0 for READ, LOCAL_WRITE for WRITE/READWRITE);
  the handle IS the MR's lkey, so a handle from another process reaches the NIC and fails there
  with LOC_PROT_ERR (R1: another Context, another PD). The READ/WRITE split for local use is kept
  in software too (R6 local half, R7), as is "only on its socket" (an lkey of this process that is
  registered on another socket would pass the NIC, so it is refused here);
* register_rdma_memory: an MR with LOCAL_WRITE|MW_BIND and a type-2 memory window bound on the
  socket's QP with IBV_WR_BIND_MW (REMOTE_READ / REMOTE_WRITE / both); the descriptor packs
  {address, length, window rkey}. The responder's NIC checks the window: bound to this QP (R2),
  still valid (R3), access (R6, R7) and bounds (R8);
* deregistration: IBV_WR_LOCAL_INV on the window rkey, dealloc the MW, dereg the MR;
* data transfer: posted work requests; completions are polled from the one CQ and their
  ibv_wc_status numbers are the contract's Status values (unknown ones become REMOTE_OPERATION);
* close_socket: the QP goes to ERR, the flush completes pending operations ABORTED, every
  registration of the socket is released and the QP destroyed (R11).

Errors are ``pytest_san.contract.SanError`` with the contract's Winsock codes. Standard library + pyverbs,
Python 3.9 compatible.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from pyverbs.addr import GID, AHAttr, GlobalRoute  # type: ignore[import-not-found]
from pyverbs.cq import CQ  # type: ignore[import-not-found]
from pyverbs.device import Context  # type: ignore[import-not-found]
from pyverbs.mr import MR, MW, MWBindInfo  # type: ignore[import-not-found]
from pyverbs.pd import PD  # type: ignore[import-not-found]
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr  # type: ignore[import-not-found]
from pyverbs.wr import SGE, RecvWR, SendWR  # type: ignore[import-not-found]

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.libc import PROT_NONE, libc, map_anonymous
from pytest_san.contract import (
    DESCRIPTOR,
    DESCRIPTOR_SIZE,
    MAX_RDMA_SIZE,
    MAX_SGE,
    PAGE_SIZE,
    QUEUE_DEPTH,
    RDMA_THRESHOLD,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    VALID_ACCESS,
    Access,
    SanError,
    Status,
    WsaError,
    is_int,
)

INTERNAL = 1 << 62  # wr_id bit of the engine's own work requests (bind, local invalidate)
INTERNAL_SLOTS = 8  # send-queue room kept for them on top of QUEUE_DEPTH
CQ_PER_SOCKET = 2 * QUEUE_DEPTH + INTERNAL_SLOTS
U64 = (1 << 64) - 1

# Connection parameters (RC): local ACK timeout 4.096 us * 2^16 ~ 268 ms and 6 retries, so a dead peer
# is reported as RETRY_EXC_ERR = CONNECTION_RESET within about two seconds. Not 7: rxe (rxe_comp.c)
# treats retry_cnt 7 like rnr_retry 7, as "retry forever", and an RDMA write to a closed peer would
# then never complete. RNR retry 7 = forever, so a send waits for the peer's receive as the
# contract's message model does.
ACK_TIMEOUT = 16
RETRY_COUNT = 6
RNR_RETRY = 7
MIN_RNR_TIMER = 12
RD_ATOMIC = 4

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

    __slots__ = ("count", "depth", "error", "in_flight", "ok_bytes", "posted", "wr")

    def __init__(self, wr: Any, count: int, depth: int) -> None:
        self.wr = wr
        self.count = count
        self.depth = depth
        self.posted = 0
        self.in_flight = 0
        self.ok_bytes = 0
        self.error: int | None = None  # the first failure's status: nothing more is posted


class Operation:
    """A pending operation; ``wr_id`` is its id (every work request of a burst carries it). Completes once."""

    __slots__ = ("burst", "id", "kind", "nbytes", "nbytes_done", "regs", "sock", "status", "wc_status")

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

    @property
    def on_send_queue(self) -> bool:
        return self.kind != "recv"

    def result(self) -> dict[str, Any]:
        assert self.status is not None
        return {"status": self.status, "bytes": self.nbytes_done, "wc_status": self.wc_status}


class Socket:
    """A SAN socket: an RC QP plus the provider's tables for it."""

    def __init__(self, sid: int, qp: Any, psn: int) -> None:
        self.id = sid
        self.qp = qp
        self.psn = psn
        self.state = "created"  # created -> connected -> error | disconnected -> closed
        self.peer: dict[str, Any] | None = None
        self.handles: dict[int, Registration] = {}  # lkey -> register_memory registration
        self.windows: dict[int, Registration] = {}  # rkey -> register_rdma_memory registration
        self.by_range: dict[tuple[str, int, int, int], Registration] = {}  # reference counting (R13)
        self.send_ops: set[int] = set()  # operation ids outstanding on the send queue
        self.recv_ops: set[int] = set()  # ... and on the receive queue
        self.internal: set[int] = set()  # engine work requests (bind, invalidate) not yet completed
        self.flush_status = Status.ABORTED.value  # what a WR_FLUSH_ERR means for this socket's operations


class VerbsProcess:
    """The provider side of one process: buffers, sockets, registrations and operations on real verbs.

    ``mw_mode`` is ``"mw2"`` (type-2 memory windows, the contract's mechanism) or ``"mr"``: the
    honest fallback for a device without type-2 windows (one MR per RDMA registration with remote
    access flags: no per-connection binding, so R2 is not kept and "memory_windows" is not claimed).
    ``"auto"`` picks mw2 when the device advertises type-2 windows.
    """

    def __init__(self, device: str, port: int = 1, gid_index: int = 0, mw_mode: str = "auto",
                 cq_size: int = 4096) -> None:
        self.device = device
        self.port = port
        self.gid_index = gid_index
        self.ctx = Context(name=device)
        try:
            attr = self.ctx.query_device()
            self.max_sge = min(MAX_SGE, int(attr.max_sge))
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
            self.lid = int(port_attr.lid)
            self.max_msg_sz = int(port_attr.max_msg_sz)
            self.gid = self.ctx.query_gid(port, gid_index)
            self.pd = PD(self.ctx)
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
        self._null_mr: Any = None  # one registered page for zero-length scatter lists
        self._null_buf = 0
        self.closed = False

    # -- introspection --------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        return {"pid": self.pid, "device": self.device, "port": self.port, "gid_index": self.gid_index,
                "gid": _gid_hex(self.gid), "mtu": self.mtu, "lid": self.lid, "mw_mode": self.mw_mode,
                "device_has_mw2": self.device_has_mw2, "max_sge": self.max_sge,
                "max_sockets": self.max_sockets, "enums": e.SOURCE}

    # -- buffers --------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> dict[str, int]:
        if not is_int(nbytes) or nbytes <= 0:
            raise ValueError(f"alloc needs a positive size, got {nbytes!r}")
        usable = -(-nbytes // PAGE_SIZE) * PAGE_SIZE
        size = usable + PAGE_SIZE  # + a guard page
        address = map_anonymous(size)
        if address is None:
            raise SanError(WsaError.WSAENOBUFS, f"mmap of {size} bytes failed: {os.strerror(ctypes.get_errno())}")
        if libc.mprotect(address + usable, PAGE_SIZE, PROT_NONE) != 0:
            libc.munmap(address, size)
            raise SanError(WsaError.WSAENOBUFS, f"mprotect of the guard page failed: {os.strerror(ctypes.get_errno())}")
        self._maps[address] = Mapping(address, nbytes, size)
        bisect.insort(self._bases, address)
        return {"address": address, "length": nbytes}

    def free(self, address: int) -> None:
        mapping = self._maps.get(address) if is_int(address) else None
        if mapping is None:
            raise SanError(WsaError.WSAEINVAL, f"no buffer starts at {address:#x} in pid {self.pid}")
        end = address + mapping.length
        for sock in self._sockets.values():
            for reg in list(sock.handles.values()) + list(sock.windows.values()):
                if reg.address < end and address < reg.address + reg.length:
                    raise SanError(WsaError.WSAEINVAL, f"buffer {address:#x} is still registered ({reg!r})")
        del self._maps[address]
        self._bases.remove(address)
        libc.munmap(address, mapping.size)

    def _mapping_of(self, address: int, length: int) -> Mapping | None:
        """The buffer wholly holding [address, address+length), or None."""
        if not is_int(address) or not is_int(length) or length <= 0 or address < 0:
            return None
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        mapping = self._maps[self._bases[i]]
        if address + length > mapping.address + mapping.length:
            return None
        return mapping

    def read(self, address: int, length: int) -> bytes:
        if length == 0 and is_int(length):
            return b""
        if self._mapping_of(address, length) is None:
            raise SanError(WsaError.WSAEFAULT,
                           f"{length} bytes at {address:#x} are not inside a buffer of pid {self.pid}")
        return ctypes.string_at(address, length)

    def write(self, address: int, data: bytes) -> None:
        data = bytes(data)
        if not data:
            return
        if self._mapping_of(address, len(data)) is None:
            raise SanError(WsaError.WSAEFAULT, f"{len(data)} bytes at {address:#x} are not inside "
                           f"a buffer of pid {self.pid}")
        ctypes.memmove(address, data, len(data))

    # -- sockets --------------------------------------------------------------------------------

    def socket_create(self) -> dict[str, Any]:
        """A new socket (an RC QP left in INIT) and the info its peer needs to connect to it."""
        self._check_open()
        if len(self._sockets) >= self.max_sockets:
            raise SanError(WsaError.WSAENOBUFS, f"pid {self.pid} already has {len(self._sockets)} sockets "
                           f"(the CQ holds {self.cq_size} entries)")
        # QPCap() defaults to ONE send WR: size both queues explicitly.
        cap = QPCap(max_send_wr=QUEUE_DEPTH + INTERNAL_SLOTS, max_recv_wr=QUEUE_DEPTH,
                    max_send_sge=self.max_sge, max_recv_sge=self.max_sge)
        init_attr = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        attr.port_num = self.port
        attr.pkey_index = 0
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
        try:
            qp = QP(self.pd, init_attr, attr)  # an RC QP created with a qp_attr is left in INIT
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"cannot create an RC QP: {exc}") from None
        sid = self._next_socket
        self._next_socket += 1
        sock = Socket(sid, qp, random.getrandbits(24))
        self._sockets[sid] = sock
        return {"socket": sid, "info": self._info(sock)}

    def _info(self, sock: Socket) -> dict[str, Any]:
        return {"qpn": int(sock.qp.qp_num), "psn": sock.psn, "gid": _gid_hex(self.gid), "gid_index": self.gid_index,
                "lid": self.lid, "mtu": self.mtu}

    def socket_connect(self, socket: int, peer: dict[str, Any]) -> None:
        """Move the socket's QP INIT -> RTR -> RTS towards the peer described by ``peer``."""
        sock = self._socket(socket)
        if sock.state != "created":
            raise SanError(WsaError.WSAEINVAL, f"socket {sock.id} is {sock.state}, not waiting to connect")
        try:
            qpn, psn = int(peer["qpn"]), int(peer["psn"])
            gid_hex = str(peer["gid"])
            mtu = min(self.mtu, int(peer.get("mtu", self.mtu)))
            lid = int(peer.get("lid", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise SanError(WsaError.WSAEINVAL, f"bad peer info {peer!r}: {exc}") from None
        try:
            gid = GID(_gid_text(gid_hex))
            is_global = 1 if int(gid_hex.replace(":", ""), 16) else 0
            if is_global:
                ah = AHAttr(port_num=self.port, is_global=1, dlid=lid,
                            gr=GlobalRoute(dgid=gid, sgid_index=self.gid_index, hop_limit=64))
            else:
                ah = AHAttr(port_num=self.port, is_global=0, dlid=lid)
            attr = QPAttr(qp_state=e.IBV_QPS_RTR, cur_qp_state=e.IBV_QPS_INIT)
            attr.path_mtu = mtu
            attr.dest_qp_num = qpn
            attr.rq_psn = psn
            attr.max_dest_rd_atomic = RD_ATOMIC
            attr.min_rnr_timer = MIN_RNR_TIMER
            attr.ah_attr = ah
            sock.qp.to_rtr(attr)
            attr.sq_psn = sock.psn
            attr.timeout = ACK_TIMEOUT
            attr.retry_cnt = RETRY_COUNT
            attr.rnr_retry = RNR_RETRY
            attr.max_rd_atomic = RD_ATOMIC
            sock.qp.to_rts(attr)
        except SanError:
            raise
        except Exception as exc:
            raise SanError(WsaError.WSAEINVAL, f"cannot connect socket {sock.id} to {peer!r}: {exc}") from None
        sock.peer = dict(peer)
        sock.state = "connected"

    def socket_state(self, socket: int) -> str:
        if socket in self._closed_sockets:
            return "closed"
        sock = self._socket(socket)
        self._refresh(sock)
        return sock.state

    def socket_peer_closed(self, socket: int, status: int = Status.CONNECTION_RESET.value) -> None:
        """The controller relays that the peer closed or died: the connection is gone for this end.

        The QP goes to ERR; its pending operations complete with ``status`` (CONNECTION_RESET, as
        the emulator's disconnect) instead of ABORTED; the socket stays open for its owner to close.
        """
        sock = self._socket(socket)
        if sock.state in ("connected", "error", "created"):
            if sock.state != "error":  # after an error the flush already means ABORTED
                sock.flush_status = status
            sock.state = "disconnected"
            self._to_error(sock)
            self._drain(sock, 10.0)

    def _socket(self, socket: Any) -> Socket:
        sock = self._sockets.get(socket) if is_int(socket) else None
        if sock is None:
            raise SanError(WsaError.WSAENOTSOCK, f"{socket!r} is not an open socket of pid {self.pid}")
        return sock

    def _refresh(self, sock: Socket) -> None:
        """Learn whether the QP went to ERR behind our back (e.g. as responder of a violation)."""
        self._poll()
        if sock.state == "connected":
            try:
                state = int(sock.qp.query(e.IBV_QP_STATE)[0].qp_state)
            except Exception:
                return
            if state not in (e.IBV_QPS_RTS,):
                sock.state = "error"

    def _connected(self, socket: Any) -> Socket:
        sock = self._socket(socket)
        self._refresh(sock)
        if sock.state != "connected":
            raise SanError(WsaError.WSAENOTCONN, f"socket {sock.id} is {sock.state}, not connected")
        return sock

    def _to_error(self, sock: Socket) -> None:
        with contextlib.suppress(Exception):
            sock.qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)

    # -- registration ---------------------------------------------------------------------------

    def _check_register(self, sock: Socket, address: int, length: int, access: int) -> None:
        if not is_int(access) or access not in VALID_ACCESS:
            raise SanError(WsaError.WSAEINVAL, f"access flags {access!r} are not READ, WRITE or READWRITE")
        if not is_int(address) or not is_int(length) or length < 0:
            raise SanError(WsaError.WSAEINVAL, f"a buffer's address and length are integers, the length not negative: "
                           f"got {address!r}, {length!r}")
        self._refresh(sock)
        if sock.state != "connected":
            raise SanError(WsaError.WSAENOTCONN, f"socket {sock.id} is {sock.state}, not connected")
        if self._mapping_of(address, length) is None:
            raise SanError(WsaError.WSAEFAULT, f"{length!r} bytes at {address!r} are not wholly inside "
                           f"the address space of pid {self.pid}")

    def register_memory(self, socket: int, address: int, length: int, access: int) -> int:
        sock = self._socket(socket)
        self._check_register(sock, address, length, access)
        key = ("memory", address, length, access)
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1  # R13: the same handle, reference counted
            return reg.key
        flags = 0 if access == Access.READ else e.IBV_ACCESS_LOCAL_WRITE
        try:
            mr = MR(self.pd, length, flags, address=address)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"ibv_reg_mr of {length} bytes at {address:#x} failed: {exc}") from None
        reg = Registration("memory", int(mr.lkey), address, length, access, mr, None)
        sock.handles[reg.key] = reg
        sock.by_range[key] = reg
        return reg.key

    def deregister_memory(self, socket: int, handle: int) -> None:
        sock = self._socket(socket)
        reg = sock.handles.get(handle) if is_int(handle) else None
        if reg is None:
            raise SanError(WsaError.WSAEINVAL, f"handle {handle!r} is not registered on socket {sock.id}")
        self._release(sock, reg)

    def register_rdma_memory(self, socket: int, address: int, length: int, access: int,
                             descriptor_size: int | None = None) -> bytes:
        sock = self._socket(socket)
        if descriptor_size is not None and not is_int(descriptor_size):
            raise SanError(WsaError.WSAEINVAL, f"descriptor_size is an integer or None, got {descriptor_size!r}")
        if descriptor_size is not None and descriptor_size < DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {DESCRIPTOR_SIZE} bytes, {descriptor_size} offered",
                           required_size=DESCRIPTOR_SIZE)
        self._check_register(sock, address, length, access)
        key = ("rdma", address, length, access)
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1
            return DESCRIPTOR.pack(reg.address, reg.length, reg.key)
        remote = (e.IBV_ACCESS_REMOTE_READ if access & Access.READ else 0) | \
                 (e.IBV_ACCESS_REMOTE_WRITE if access & Access.WRITE else 0)
        if self.mw_mode == "mr":
            reg = self._register_rdma_mr(address, length, access, remote)
        else:
            reg = self._register_rdma_window(sock, address, length, access, remote)
        sock.windows[reg.key] = reg
        sock.by_range[key] = reg
        return DESCRIPTOR.pack(reg.address, reg.length, reg.key)

    def _register_rdma_mr(self, address: int, length: int, access: int, remote: int) -> Registration:
        """Fallback without type-2 windows: the MR itself carries the remote rights (not per connection)."""
        try:
            mr = MR(self.pd, length, e.IBV_ACCESS_LOCAL_WRITE | remote, address=address)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"ibv_reg_mr of {length} bytes at {address:#x} failed: {exc}") from None
        return Registration("rdma", int(mr.rkey), address, length, access, mr, None)

    def _register_rdma_window(self, sock: Socket, address: int, length: int, access: int,
                              remote: int) -> Registration:
        try:
            mr = MR(self.pd, length, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND, address=address)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"ibv_reg_mr of {length} bytes at {address:#x} failed: {exc}") from None
        try:
            mw = MW(self.pd, e.IBV_MW_TYPE_2)
        except Exception as exc:
            self._close_verbs(mr)
            raise SanError(WsaError.WSAENOBUFS, f"ibv_alloc_mw(TYPE_2) failed: {exc}") from None
        wr = SendWR(wr_id=self._internal_id(), opcode=e.IBV_WR_BIND_MW, num_sge=0, send_flags=e.IBV_SEND_SIGNALED)
        # set_bind_wr puts inc_rkey(mw.rkey) into bind_mw.rkey: that new key (wr.rkey) is the window's
        # rkey once bound; pyverbs' MW.rkey keeps showing the key from ibv_alloc_mw.
        wr.set_bind_wr(mw, MWBindInfo(mr, address, length, remote))
        rkey = int(wr.rkey)
        status = self._run_internal(sock, wr)
        if status is not None and status != Status.SUCCESS.value:
            self._close_verbs(mw)
            self._close_verbs(mr)
            self._refresh(sock)
            if sock.state != "connected":
                raise SanError(WsaError.WSAENOTCONN, f"socket {sock.id} went to {sock.state} while binding "
                               f"a window (wc status {status})")
            raise SanError(WsaError.WSAENOBUFS, f"binding a type-2 window failed with wc status {status}")
        return Registration("rdma", rkey, address, length, access, mr, mw)

    def _window_of(self, sock: Socket, descriptor: Any) -> Registration | None:
        if not isinstance(descriptor, (bytes, bytearray)) or len(descriptor) != DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {descriptor!r}")
        return sock.windows.get(DESCRIPTOR.unpack(bytes(descriptor))[2])

    def deregister_rdma_memory(self, socket: int, descriptor: bytes) -> None:
        sock = self._socket(socket)
        reg = self._window_of(sock, descriptor)
        if reg is None:
            raise SanError(WsaError.WSAEINVAL,
                           f"descriptor {bytes(descriptor).hex()} is not registered on socket {sock.id}")
        self._release(sock, reg)

    def _release(self, sock: Socket, reg: Registration, force: bool = False) -> None:
        if not force:
            if reg.in_use:
                raise SanError(WsaError.WSAEINVAL, f"{reg!r} is in use by {reg.in_use} pending operation(s)")
            reg.refs -= 1
            if reg.refs:
                return
        table = sock.handles if reg.kind == "memory" else sock.windows
        del table[reg.key]
        del sock.by_range[(reg.kind, reg.address, reg.length, reg.access)]
        if reg.mw is not None:
            # R3: invalidate the window on its QP, then free it (dealloc alone also revokes the rkey).
            if not force and sock.state == "connected":
                wr = SendWR(wr_id=self._internal_id(), opcode=e.IBV_WR_LOCAL_INV, num_sge=0,
                            send_flags=e.IBV_SEND_SIGNALED, imm_data=reg.key)  # imm_data shares invalidate_rkey
                self._run_internal(sock, wr)
            self._close_verbs(reg.mw)
        self._close_verbs(reg.mr)
        reg.mr = reg.mw = None

    def _close_verbs(self, obj: Any) -> None:
        """Close an MR or MW; an MR the device still holds (a window on it) is retried later."""
        for _ in range(50):
            try:
                obj.close()
                return
            except Exception:
                time.sleep(0.01)
        self._zombies.append(obj)

    def registrations(self, socket: int) -> list[dict[str, Any]]:
        if socket in self._closed_sockets:
            return []
        sock = self._socket(socket)
        return [reg.describe() for reg in list(sock.handles.values()) + list(sock.windows.values())]

    def leaks(self) -> list[str]:
        """Registrations still alive on open sockets, and verbs objects the device would not release."""
        out = []
        for sock in self._sockets.values():
            for reg in list(sock.handles.values()) + list(sock.windows.values()):
                out.append(f"pid {self.pid} socket {sock.id}: {reg!r}")
        self._retry_zombies()
        out += [f"pid {self.pid}: unreleased {type(z).__name__}" for z in self._zombies]
        return out

    def _retry_zombies(self) -> None:
        keep = []
        for obj in self._zombies:
            try:
                obj.close()
            except Exception:
                keep.append(obj)
        self._zombies = keep

    def getsockopt(self, socket: int, option: int) -> int:
        self._socket(socket)
        if not is_int(option):  # 28685.0 == SO_MAX_RDMA_SIZE, but it is no option
            raise SanError(WsaError.WSAEINVAL, f"unknown socket option {option!r:.80}")
        if option == SO_MAX_RDMA_SIZE:
            return min(MAX_RDMA_SIZE, self.max_msg_sz) if self.max_msg_sz else MAX_RDMA_SIZE
        if option == SO_RDMA_THRESHOLD_SIZE:
            return RDMA_THRESHOLD
        raise SanError(WsaError.WSAEINVAL, f"unknown socket option {option!r}")

    @staticmethod
    def supports_rdma_read() -> bool:
        return True

    # -- data transfer --------------------------------------------------------------------------

    def _post_checks(self, socket: int, buffers: Sequence[Sequence[int]], kind: str) -> Socket:
        sock = self._connected(socket)
        if not isinstance(buffers, (list, tuple)):
            raise SanError(WsaError.WSAEINVAL,
                           f"the buffers are a list of [address, length, handle], got {buffers!r:.80}")
        if len(buffers) > self.max_sge:
            raise SanError(WsaError.WSAEINVAL, f"{len(buffers)} buffers, at most {self.max_sge}")
        queued = len(sock.recv_ops) if kind == "recv" else self._send_queue_used(sock)
        if queued >= QUEUE_DEPTH:
            raise SanError(WsaError.WSAENETDOWN, f"{kind} queue of socket {sock.id} is full ({QUEUE_DEPTH})")
        for item in buffers:
            # A handle of the wrong type is only an unknown handle: refused like one, by _gather (as the emulator).
            if not isinstance(item, (list, tuple)) or len(item) != 3 or not (is_int(item[0]) and is_int(item[1])):
                raise SanError(WsaError.WSAEINVAL, f"a buffer is [address, length, handle], got {item!r:.80}")
            if item[1] < 0:
                raise SanError(WsaError.WSAEINVAL, f"a buffer of negative length {item[1]} at {item[0]:#x}")
        return sock

    def _send_queue_used(self, sock: Socket) -> int:
        """Work requests on the send queue: one per operation, ``in_flight`` for a burst."""
        used = len(sock.send_ops)
        for op_id in sock.send_ops:
            burst = self._ops[op_id].burst
            if burst is not None and burst.in_flight > 1:
                used += burst.in_flight - 1
        return used

    def _gather(self, sock: Socket, op: Operation, buffers: Sequence[Sequence[int]],
                need: int) -> list[Any] | None:
        """SGEs for the (address, length, handle) triples, or None when the provider refuses them.

        A handle registered on this socket is checked in software (access: R6/R7, bounds, and it
        must be a handle of this socket). A handle this process does not know at all goes to the
        NIC as the lkey it claims to be: the NIC refuses a foreign one (R1, LOC_PROT_ERR).
        """
        sges = []
        total = 0
        for address, length, handle in buffers:
            reg = sock.handles.get(handle) if is_int(handle) else None
            if reg is None:
                if not is_int(handle):
                    return None
                # An lkey of this PD registered on another socket would pass the NIC; a zero-length or
                # over-long SGE might not be checked against its lkey at all: refused here.
                if (self._known_elsewhere(sock, handle) or not 0 <= handle <= 0xFFFFFFFF
                        or not 0 < length <= 0xFFFFFFFF):
                    return None
                sges.append(SGE(address & U64, length, handle))
                total += length
                continue
            if (not reg.access & need or address < reg.address or length < 0
                    or address + length > reg.address + reg.length):
                return None
            reg.in_use += 1
            op.regs.append(reg)
            sges.append(SGE(address, length, reg.key))
            total += length
        op.nbytes = total
        if not sges:
            sges.append(SGE(self._null_address(), 0, self._null_mr.lkey))
        return sges

    def _known_elsewhere(self, sock: Socket, handle: int) -> bool:
        """An lkey of this PD that is not the socket's own: the NIC would take it, so the provider refuses."""
        if self._null_mr is not None and handle == self._null_mr.lkey:
            return True
        return any(handle in other.handles for other in self._sockets.values() if other is not sock)

    def _null_address(self) -> int:
        if self._null_mr is None:
            self._null_buf = self.alloc(PAGE_SIZE)["address"]
            self._null_mr = MR(self.pd, PAGE_SIZE, e.IBV_ACCESS_LOCAL_WRITE, address=self._null_buf)
        return self._null_buf

    def _new_op(self, sock: Socket, kind: str) -> Operation:
        op = Operation(self._next_op, sock, kind)
        self._next_op += 1
        self._ops[op.id] = op
        (sock.recv_ops if kind == "recv" else sock.send_ops).add(op.id)
        return op

    def _refuse(self, op: Operation, status: int = Status.LOCAL_PROTECTION.value) -> int:
        """The provider refuses the operation (LOCAL_PROTECTION: its local buffers), and the connection
        breaks as on verbs."""
        self._finish(op, status, 0)
        op.sock.state = "error"
        self._to_error(op.sock)
        return op.id

    def _post_send_wr(self, op: Operation, wr: Any) -> int:
        try:
            op.sock.qp.post_send(wr)
        except Exception as exc:
            self._unpost(op)
            raise SanError(WsaError.WSAENETDOWN, f"ibv_post_send on socket {op.sock.id} failed: {exc}") from None
        return op.id

    def _unpost(self, op: Operation) -> None:
        for reg in op.regs:
            reg.in_use -= 1
        op.regs = []
        op.sock.send_ops.discard(op.id)
        op.sock.recv_ops.discard(op.id)
        del self._ops[op.id]

    def rdma_write(self, socket: int, buffers: Sequence[Sequence[int]], descriptor: bytes, offset: int = 0) -> int:
        return self._rdma(socket, buffers, descriptor, offset, "rdma_write")

    def rdma_read(self, socket: int, buffers: Sequence[Sequence[int]], descriptor: bytes, offset: int = 0) -> int:
        return self._rdma(socket, buffers, descriptor, offset, "rdma_read")

    def rdma_write_burst(self, socket: int, buffers: Sequence[Sequence[int]], descriptor: bytes, offset: int = 0,
                         count: int = 1, depth: int = 16) -> int:
        """``count`` identical RDMA writes, up to ``depth`` in flight, reposted here as each completes."""
        return self._rdma(socket, buffers, descriptor, offset, "rdma_write", (count, depth))

    def rdma_read_burst(self, socket: int, buffers: Sequence[Sequence[int]], descriptor: bytes, offset: int = 0,
                        count: int = 1, depth: int = 16) -> int:
        return self._rdma(socket, buffers, descriptor, offset, "rdma_read", (count, depth))

    def _rdma(self, socket: int, buffers: Sequence[Sequence[int]], descriptor: bytes, offset: int, kind: str,
              burst: tuple[int, int] | None = None) -> int:
        if burst is not None:
            for name, value in (("count", burst[0]), ("depth", burst[1])):
                if type(value) is not int or value < 1:
                    raise SanError(WsaError.WSAEINVAL, f"a burst's {name} is an integer >= 1, got {value!r}")
        sock = self._post_checks(socket, buffers, kind)
        if not isinstance(descriptor, (bytes, bytearray)) or len(descriptor) != DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {descriptor!r}")
        if not is_int(offset):
            raise SanError(WsaError.WSAEINVAL, f"offset {offset!r} is not an integer")
        address, window_length, rkey = DESCRIPTOR.unpack(bytes(descriptor))
        op = self._new_op(sock, kind)
        # Local side: an RdmaWrite source must be readable (R7), an RdmaRead sink writable (R6).
        sges = self._gather(sock, op, buffers, Access.READ if kind == "rdma_write" else Access.WRITE)
        if sges is None:
            return self._refuse(op)
        if not 0 <= address + offset <= U64 - op.nbytes:
            # No remote address the NIC could be given: wrapped modulo 2**64 it would name bytes inside the
            # window (offset 2**64 read the window's start). Past any window: what the responder answers.
            return self._refuse(op, Status.ACCESS_VIOLATION.value)
        if op.nbytes == 0:
            # Nothing to move: rxe (kernel 6.1) never completes a zero-length RDMA READ, and the IB spec lets
            # a NIC skip the rkey check of a zero-length transfer. Completed here, checked against the
            # window's range as the descriptor states it (whether it is still registered, and its access,
            # only the peer's NIC knows: a documented alternative).
            if 0 <= offset <= window_length:
                self._finish(op, Status.SUCCESS.value, 0)
                return op.id
            return self._refuse(op, Status.ACCESS_VIOLATION.value)
        opcode = e.IBV_WR_RDMA_WRITE if kind == "rdma_write" else e.IBV_WR_RDMA_READ
        wr = SendWR(wr_id=op.id, opcode=opcode, num_sge=len(sges), sg=sges, send_flags=e.IBV_SEND_SIGNALED)
        # The responder's NIC checks the window: its QP (R2), validity (R3), access (R6/R7), bounds (R8).
        wr.set_wr_rdma(rkey, (address + offset) & U64)
        if burst is None:
            return self._post_send_wr(op, wr)
        count, depth = burst
        # The send queue's free room bounds what is in flight (_post_checks left at least one slot).
        op.burst = Burst(wr, count, min(depth, count, QUEUE_DEPTH - self._send_queue_used(sock) + 1))
        self._post_send_wr(op, wr)  # the first post's failure is the call's error
        op.burst.posted = op.burst.in_flight = 1
        self._refill(op)
        return op.id

    def _refill(self, op: Operation) -> None:
        """Post a burst's next work requests while it has room, transfers left and no failure."""
        burst = op.burst
        assert burst is not None
        while (burst.error is None and burst.posted < burst.count and burst.in_flight < burst.depth
               and op.sock.state == "connected"):
            try:
                op.sock.qp.post_send(burst.wr)
            except Exception:
                burst.error = op.sock.flush_status  # the QP refused: it is in error already
                break
            burst.posted += 1
            burst.in_flight += 1
        if burst.in_flight == 0 and burst.error is None and burst.posted < burst.count:
            burst.error = op.sock.flush_status  # the socket left "connected" between two completions
        if burst.in_flight == 0 and (burst.error is not None or burst.posted == burst.count):
            self._finish(op, Status.SUCCESS.value if burst.error is None else burst.error, burst.ok_bytes)

    def send(self, socket: int, buffers: Sequence[Sequence[int]]) -> int:
        sock = self._post_checks(socket, buffers, "send")
        op = self._new_op(sock, "send")
        sges = self._gather(sock, op, buffers, Access.READ)  # R7: a WRITE-only handle is no send source
        if sges is None:
            return self._refuse(op)
        wr = SendWR(wr_id=op.id, opcode=e.IBV_WR_SEND, num_sge=len(sges), sg=sges, send_flags=e.IBV_SEND_SIGNALED)
        return self._post_send_wr(op, wr)

    def recv(self, socket: int, buffers: Sequence[Sequence[int]]) -> int:
        sock = self._post_checks(socket, buffers, "recv")
        op = self._new_op(sock, "recv")
        sges = self._gather(sock, op, buffers, Access.WRITE)  # R6: a READ-only handle is no receive buffer
        if sges is None:
            return self._refuse(op)
        wr = RecvWR(wr_id=op.id, num_sge=len(sges), sg=sges)
        try:
            sock.qp.post_recv(wr)
        except Exception as exc:
            self._unpost(op)
            raise SanError(WsaError.WSAENETDOWN, f"ibv_post_recv on socket {sock.id} failed: {exc}") from None
        return op.id

    # -- completions ----------------------------------------------------------------------------

    def _poll(self) -> int:
        """Take every completion the CQ holds; returns how many."""
        total = 0
        while True:
            n, wcs = self.cq.poll(32)
            for wc in wcs:
                self._on_completion(int(wc.wr_id), int(wc.status), int(wc.byte_len))
            total += int(n)
            if n < 32:
                return total

    def _on_completion(self, wr_id: int, wc_status: int, byte_len: int) -> None:
        if wr_id & INTERNAL:
            self._internal[wr_id] = wc_status
            for sock in self._sockets.values():
                if wr_id in sock.internal:
                    sock.internal.discard(wr_id)
                    if wc_status != e.IBV_WC_SUCCESS and sock.state == "connected":
                        sock.state = "error"
            return
        op = self._ops.get(wr_id)
        if op is None or op.status is not None:
            return
        if op.burst is not None:
            self._on_burst_completion(op, wc_status)
            return
        op.wc_status = wc_status
        if wc_status == e.IBV_WC_SUCCESS:
            self._finish(op, Status.SUCCESS.value, byte_len if op.kind == "recv" else op.nbytes)
            return
        self._finish(op, self._error_status(op.sock, wc_status), 0)

    @staticmethod
    def _error_status(sock: Socket, wc_status: int) -> int:
        """The contract's status for an error completion; the socket goes to error, as its QP has."""
        if sock.state == "connected":
            sock.state = "error"  # every error completion leaves the QP in ERR
        return sock.flush_status if wc_status == e.IBV_WC_WR_FLUSH_ERR else Status.from_verbs(wc_status).value

    def _on_burst_completion(self, op: Operation, wc_status: int) -> None:
        burst = op.burst
        assert burst is not None
        burst.in_flight -= 1
        if wc_status == e.IBV_WC_SUCCESS:
            burst.ok_bytes += op.nbytes
        elif burst.error is None:
            op.wc_status = wc_status
            burst.error = self._error_status(op.sock, wc_status)
        self._refill(op)

    def _finish(self, op: Operation, status: int, nbytes: int) -> None:
        if op.status is not None:
            return
        op.status = status
        op.nbytes_done = nbytes
        for reg in op.regs:
            reg.in_use -= 1
        op.regs = []
        op.sock.send_ops.discard(op.id)
        op.sock.recv_ops.discard(op.id)

    def _op(self, op_id: int) -> Operation:
        op = self._ops.get(op_id) if is_int(op_id) else None
        if op is None:
            raise SanError(WsaError.WSAEINVAL, f"no operation {op_id!r} in pid {self.pid}")
        return op

    def op_done(self, op_id: int) -> bool:
        op = self._op(op_id)
        if op.status is None:
            self._poll()
        return op.status is not None

    def op_wait(self, op_id: int, timeout: float | None = 10.0) -> dict[str, Any]:
        """Poll the CQ until the operation completes: {"status", "bytes"}; TimeoutError after ``timeout``."""
        op = self._op(op_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0002
        while op.status is None:
            if self._poll():
                pause = 0.0002
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{op.kind} {op.id} on socket {op.sock.id} still pending after {timeout} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return op.result()

    def _internal_id(self) -> int:
        wr_id = self._next_internal
        self._next_internal += 1
        return wr_id

    def _run_internal(self, sock: Socket, wr: Any, timeout: float = 20.0) -> int | None:
        """Post an engine work request (bind / invalidate) and wait for its completion.

        RC completions come in send-queue order: behind an operation that waits (a send for which
        the peer has posted no receive yet) the completion can be late although the NIC has already
        executed the request. Then, after a short wait, this returns None (outcome not seen yet); a
        later error completion still moves the socket to error.
        """
        wr_id = int(wr.wr_id)
        try:
            sock.qp.post_send(wr)
        except Exception as exc:
            raise SanError(WsaError.WSAENETDOWN, f"ibv_post_send of an engine request on socket {sock.id} "
                           f"failed: {exc}") from None
        sock.internal.add(wr_id)
        behind = bool(sock.send_ops)
        deadline = time.monotonic() + (min(timeout, 2.0) if behind else timeout)
        pause = 0.0002
        while wr_id not in self._internal:
            if self._poll():
                continue
            if time.monotonic() >= deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return self._internal.pop(wr_id)

    def _drain(self, sock: Socket, timeout: float) -> None:
        """Wait for the flush of a QP in ERR; whatever does not come completes in software."""
        deadline = time.monotonic() + timeout
        while (sock.send_ops or sock.recv_ops) and time.monotonic() < deadline:
            if not self._poll():
                time.sleep(0.001)
        for op_id in list(sock.send_ops) + list(sock.recv_ops):
            op = self._ops[op_id]
            self._finish(op, sock.flush_status, op.burst.ok_bytes if op.burst is not None else 0)

    # -- teardown -------------------------------------------------------------------------------

    def close_socket(self, socket: int) -> None:
        """Pending operations complete ABORTED; every registration is released; the QP is destroyed (R11)."""
        sock = self._socket(socket)
        if sock.state in ("connected", "created"):
            sock.state = "error"
        self._to_error(sock)
        self._drain(sock, 10.0)
        for reg in list(sock.handles.values()) + list(sock.windows.values()):
            self._release(sock, reg, force=True)
        try:
            sock.qp.close()
        except Exception:
            self._zombies.append(sock.qp)
        sock.state = "closed"
        del self._sockets[sock.id]
        self._closed_sockets.add(sock.id)  # completed operation records stay until the next reset

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
        if self._null_mr is not None:
            self._close_verbs(self._null_mr)
            self._null_mr = None
        self._retry_zombies()
        for address in list(self._maps):
            mapping = self._maps.pop(address)
            libc.munmap(address, mapping.size)
        self._bases = []
        for obj in (self.cq, self.pd, self.ctx):
            with contextlib.suppress(Exception):
                obj.close()
        self.closed = True


def _gid_hex(gid: Any) -> str:
    """A GID as 32 hex digits (the wire form)."""
    return str(gid.gid if hasattr(gid, "gid") else gid).replace(":", "").lower()


def _gid_text(hex32: str) -> str:
    """32 hex digits -> the colon form pyverbs' GID() parses."""
    digits = hex32.replace(":", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"a GID is 32 hex digits, got {hex32!r}")
    return ":".join(digits[i:i + 4] for i in range(0, 32, 4))


__all__ = ["SanError", "VerbsProcess", "WsaError"]
