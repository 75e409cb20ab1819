"""A process's sockets: one RC QP each, its setup, connection and state, its options and its close.

Two-phase setup: ``socket_create`` leaves the QP in INIT and returns the info the peer needs;
``socket_connect`` with the peer's info moves it INIT -> RTR -> RTS. ``close_socket`` moves it to
ERR, lets the flush complete what is pending, releases every registration and destroys it (R11).
Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

from pyverbs.addr import GID, AHAttr, GlobalRoute  # type: ignore[import-not-found]
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr  # type: ignore[import-not-found]

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.state import INTERNAL_SLOTS, ProcessState, Socket
from pytest_san.contract import (
    MAX_RDMA_SIZE,
    QUEUE_DEPTH,
    RDMA_THRESHOLD,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    SanError,
    Status,
    WsaError,
    is_int,
)

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


class SocketsMixin(ProcessState):
    """Sockets: QP creation, connection, state (as the QP reports it), options and close."""

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


def _gid_hex(gid: Any) -> str:
    """A GID as 32 hex digits (the wire form)."""
    return str(gid.gid if hasattr(gid, "gid") else gid).replace(":", "").lower()


def _gid_text(hex32: str) -> str:
    """32 hex digits -> the colon form pyverbs' GID() parses."""
    digits = hex32.replace(":", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"a GID is 32 hex digits, got {hex32!r}")
    return ":".join(digits[i:i + 4] for i in range(0, 32, 4))
