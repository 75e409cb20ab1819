"""A process's sockets: a protection domain and an RC QP each, their state, options and close.

``_new_socket`` gives a socket its own PD (so its registrations are reachable through its QP only)
and a QP in RESET; connections.py connects it through the RDMA connection manager. ``close_socket``
disconnects, moves the QP to ERR, lets the flush complete what is pending, releases every
registration and destroys the QP, the CM ids and the PD (R11). Standard library + pyverbs, Python 3.9
compatible.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pyverbs.pd import PD  # type: ignore[import-not-found]
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


class SocketsMixin(ProcessState):
    """Sockets: PD and QP creation, state (as the QP and the CM report it), options and close."""

    def _new_socket(self) -> Socket:
        """A socket with its own PD and an RC QP in RESET, on the process's one CQ."""
        self._check_open()
        if len(self._sockets) >= self.max_sockets:
            raise SanError(WsaError.WSAENOBUFS, f"pid {self.pid} already has {len(self._sockets)} sockets "
                           f"(the CQ holds {self.cq_size} entries)")
        try:
            pd = PD(self.ctx)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"cannot allocate a protection domain: {exc}") from None
        # QPCap() defaults to ONE send WR: size both queues explicitly.
        # iWARP: an RDMA write takes two send-queue entries, with its fence read (operations.py).
        cap = QPCap(max_send_wr=QUEUE_DEPTH * (2 if self.iwarp else 1) + INTERNAL_SLOTS, max_recv_wr=QUEUE_DEPTH,
                    max_send_sge=self.max_sge, max_recv_sge=self.max_sge)
        init_attr = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        try:
            qp = QP(pd, init_attr)
        except Exception as exc:
            with contextlib.suppress(Exception):
                pd.close()
            raise SanError(WsaError.WSAENOBUFS, f"cannot create an RC QP: {exc}") from None
        sid = self._next_socket
        self._next_socket += 1
        sock = Socket(sid, pd, qp)
        self._sockets[sid] = sock
        return sock

    def socket_state(self, socket: int) -> str:
        if socket in self._closed_sockets:
            return "closed"
        sock = self._socket(socket)
        self._refresh(sock)
        return sock.state

    def socket_peer_closed(self, socket: int, status: int = Status.CONNECTION_RESET.value) -> None:
        """The peer closed or died (CM's DISCONNECTED event, or the controller's relay when its host
        vanished): the connection is gone for this end.

        The QP goes to ERR; its pending operations complete with ``status`` (CONNECTION_RESET, as
        the emulator's disconnect) instead of ABORTED; the socket stays open for its owner to close.
        """
        sock = self._socket(socket)
        self._poll()  # an error completion already here decides what the flush means
        if sock.state in ("connected", "accepted", "connecting", "listening", "error", "created"):
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
        """Learn whether the QP went to ERR behind our back (e.g. as responder of a violation), and what
        the connection manager said (an accepted connection's ESTABLISHED, a peer's DISCONNECTED)."""
        self._poll()
        if sock.state == "accepted":
            self._await_established(sock)
        # siw (kernel 6.1) reports every QP as RESET to a query; an iWARP QP's error ends its connection,
        # which CM reports (DISCONNECTED) and its completions show: the query is for IB/RoCE only.
        if sock.state == "connected" and not self.iwarp:
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
        """Pending operations complete ABORTED; every registration is released; the QP, CM ids and PD
        are destroyed (R11). The peer learns it from CM (DISCONNECTED), or from the controller."""
        sock = self._socket(socket)
        if sock.cmid is not None and sock.state in ("connected", "accepted"):
            with contextlib.suppress(Exception):
                sock.cmid.disconnect()
        if sock.state in ("connected", "accepted", "connecting", "listening", "created"):
            sock.state = "error"
        self._to_error(sock)
        self._drain(sock, 10.0)
        for reg in list(sock.handles.values()) + list(sock.windows.values()):
            self._release(sock, reg, force=True)
        self._close_socket_verbs(sock)
        sock.state = "closed"
        del self._sockets[sock.id]
        self._closed_sockets.add(sock.id)  # completed operation records stay until the next reset

    def _close_socket_verbs(self, sock: Socket) -> None:
        """The socket's verbs and CM objects, each closed once: null MR, QP, CM ids, channel, PD."""
        if sock.null_mr is not None:
            self._close_verbs(sock.null_mr)
            sock.null_mr = None
        if sock.qp is not None:
            try:
                sock.qp.close()
            except Exception:
                self._zombies.append(sock.qp)
            sock.qp = None
        for name in ("cmid", "listener", "channel"):
            obj = getattr(sock, name)
            setattr(sock, name, None)
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()
        sock.fd = -1
        if sock.pd is not None:
            try:
                sock.pd.close()
            except Exception:
                self._zombies.append(sock.pd)
            sock.pd = None
