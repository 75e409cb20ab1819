"""A process's sockets: a protection domain and an RC QP each, their connections, state, options and close.

``Sockets`` gives a socket its own PD (so its registrations are reachable through its QP only) and a
QP in RESET, connects it through the RDMA connection manager (``connections.py``), follows its state
as the QP and the connection manager report it, and at close disconnects, moves the QP to ERR, lets
the flush complete what is pending and destroys the QP, the CM ids and the PD (R11; the process
releases the socket's registrations in between). Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

import contextlib
import select
import time
from typing import Any

from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.completions import Completions
from hil.agent.engines.verbs.connections import ESTABLISHED_WAIT, Connections, qp_to_error
from hil.agent.engines.verbs.context import DeviceContext
from hil.agent.engines.verbs.memory import NullPage
from hil.agent.engines.verbs.records import INTERNAL_SLOTS, Socket
from hil.agent.engines.verbs.releases import Releases
from pytest_san.spi import checks
from pytest_san.spi.contract import (
    MAX_RDMA_SIZE,
    QUEUE_DEPTH,
    RDMA_THRESHOLD,
    SO_MAX_RDMA_SIZE,
    SanError,
    Status,
    WsaError,
    is_int,
)


class Sockets:
    """Owns the process's sockets (by id), their PDs, QPs and connection manager objects.

    Gets the device, the process's completions (a socket's state is learnt by polling them; a close waits
    for their flush), the null page (whose MR in a socket's PD goes with the PD) and the releases."""

    def __init__(self, device: DeviceContext, pid: int, completions: Completions, null_page: NullPage,
                 releases: Releases) -> None:
        self._device = device
        self._pid = pid
        self._completions = completions
        self._null_page = null_page
        self._releases = releases
        self._cm = Connections(device, pid, self._pump)
        self._sockets: dict[int, Socket] = {}
        self._closed: set[int] = set()  # ids of closed sockets: their state is "closed" until the next reset
        self._next = 1
        self._pumping = False  # handling CM events (they are not handled again from inside)

    def open(self) -> list[Socket]:
        return list(self._sockets.values())

    @property
    def made(self) -> int:
        """Sockets this process ever made (each through the connection manager)."""
        return self._next - 1

    def get(self, socket: Any) -> Socket:
        """The open socket ``socket`` names, or WSAENOTSOCK."""
        return checks.socket(self._sockets.get(socket) if is_int(socket) else None, socket, f"pid {self._pid}")

    def is_closed(self, socket: Any) -> bool:
        return socket in self._closed

    # -- making one ----------------------------------------------------------------------------

    def _new(self) -> Socket:
        """A socket with its own PD and an RC QP in RESET, on the process's one CQ."""
        device = self._device
        if len(self._sockets) >= device.max_sockets:
            raise SanError(WsaError.WSAENOBUFS, f"pid {self._pid} already has {len(self._sockets)} sockets "
                           f"(the CQ holds {device.cq_size} entries)")
        try:
            pd = PD(device.ctx)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"cannot allocate a protection domain: {exc}") from None
        # QPCap() defaults to ONE send WR: size both queues explicitly.
        # iWARP: an RDMA write takes two send-queue entries, with its fence read (posting.py).
        cap = QPCap(max_send_wr=QUEUE_DEPTH * (2 if device.iwarp else 1) + INTERNAL_SLOTS,
                    max_recv_wr=QUEUE_DEPTH, max_send_sge=device.max_sge, max_recv_sge=device.max_sge)
        init_attr = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=device.cq, rcq=device.cq, cap=cap, sq_sig_all=0)
        try:
            qp = QP(pd, init_attr)
        except Exception as exc:
            with contextlib.suppress(Exception):
                pd.close()
            raise SanError(WsaError.WSAENOBUFS, f"cannot create an RC QP: {exc}") from None
        sock = Socket(self._next, pd, qp)
        self._next += 1
        self._sockets[sock.id] = sock
        return sock

    def listen(self) -> dict[str, Any]:
        """A new socket listening on this device's address and a free port: {"socket", "address", "port"}."""
        sock = self._new()
        try:
            port = self._cm.listen(sock)
        except BaseException:
            self._discard(sock)
            raise
        return {"socket": sock.id, "address": self._device.address, "port": port}

    def connect(self, peer: dict[str, Any]) -> dict[str, Any]:
        """A new socket connected to the listener at ``peer`` ({"address", "port"}): {"socket"}."""
        try:
            address, port = str(peer["address"]), int(peer["port"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SanError(WsaError.WSAEINVAL, f"bad peer {peer!r:.120}: {exc}") from None
        sock = self._new()
        try:
            self._cm.connect(sock, address, port)
        except BaseException:
            self._discard(sock)
            raise
        return {"socket": sock.id}

    def _discard(self, sock: Socket) -> None:
        """A socket whose listen or connect failed: everything it held goes, it was never the caller's."""
        self.destroy(sock)
        self._sockets.pop(sock.id, None)

    # -- state -----------------------------------------------------------------------------------

    def state(self, socket: int) -> str:
        if socket in self._closed:
            return "closed"
        sock = self.get(socket)
        self.refresh(sock)
        return sock.state

    def refresh(self, sock: Socket) -> None:
        """Learn whether the QP went to ERR behind our back (e.g. as responder of a violation), and what
        the connection manager said (an accepted connection's ESTABLISHED, a peer's DISCONNECTED)."""
        self._completions.poll()
        if sock.state == "accepted":
            self._await_established(sock)
        # siw (kernel 6.1) reports every QP as RESET to a query; an iWARP QP's error ends its connection,
        # which CM reports (DISCONNECTED) and its completions show: the query is for IB/RoCE only.
        if sock.state == "connected" and not self._device.iwarp:
            try:
                state = int(sock.qp.query(e.IBV_QP_STATE)[0].qp_state)
            except Exception:
                return
            if state not in (e.IBV_QPS_RTS,):
                sock.state = "error"

    def connected(self, socket: Any) -> Socket:
        """The open socket ``socket`` names, connected: else WSAENOTSOCK or WSAENOTCONN."""
        sock = self.get(socket)
        self.refresh(sock)
        if sock.state != "connected":
            raise SanError(WsaError.WSAENOTCONN, f"socket {sock.id} is {sock.state}, not connected")
        return sock

    def _await_established(self, sock: Socket, timeout: float = ESTABLISHED_WAIT) -> None:
        """An accepted connection becomes connected on its ESTABLISHED (the active end sends it on)."""
        if self._pumping:  # inside an event's handling: its own events come later
            return
        deadline = time.monotonic() + timeout
        while sock.state == "accepted" and time.monotonic() < deadline:
            self._pump(min(0.05, max(0.0, deadline - time.monotonic())))
        if sock.state == "accepted":
            sock.state = "error"
            qp_to_error(sock)

    def peer_closed(self, socket: int, status: int = Status.CONNECTION_RESET.value) -> None:
        """The peer closed or died (CM's DISCONNECTED event, or the controller's relay when its host
        vanished): the connection is gone for this end.

        The QP goes to ERR; its pending operations complete with ``status`` (CONNECTION_RESET, as
        the emulator's disconnect) instead of ABORTED; the socket stays open for its owner to close.
        """
        sock = self.get(socket)
        self._completions.poll()  # an error completion already here decides what the flush means
        if sock.state in ("connected", "accepted", "connecting", "listening", "error", "created"):
            if sock.state != "error":  # after an error the flush already means ABORTED
                sock.flush_status = status
            sock.state = "disconnected"
            qp_to_error(sock)
            self._completions.drain(sock, 10.0)

    def getsockopt(self, socket: int, option: int) -> int:
        self.get(socket)
        if checks.option(option) == SO_MAX_RDMA_SIZE:
            largest = self._device.max_msg_sz
            return min(MAX_RDMA_SIZE, largest) if largest else MAX_RDMA_SIZE
        return RDMA_THRESHOLD

    # -- connection manager events -----------------------------------------------------------------

    def cm_fds(self) -> list[int]:
        """The event channels' descriptors: the child's request loop polls them with its stdin."""
        return [s.fd for s in self._sockets.values() if s.fd >= 0]

    def pump(self) -> int:
        """Handle the CM events already waiting (never blocks): how many."""
        return self._pump(0.0)

    def _pump(self, timeout: float = 0.0) -> int:
        """Handle one waiting event of each socket whose channel is readable within ``timeout`` seconds."""
        if self._pumping:
            return 0
        by_fd = {s.fd: s for s in self._sockets.values() if s.fd >= 0 and s.channel is not None}
        if not by_fd:
            if timeout:
                time.sleep(timeout)
            return 0
        ready, _, _ = select.select(list(by_fd), [], [], timeout)
        self._pumping = True
        try:
            for fd in ready:
                sock = by_fd[fd]
                if self._cm.on_event(sock):
                    self.peer_closed(sock.id, Status.CONNECTION_RESET.value)
        finally:
            self._pumping = False
        return len(ready)

    # -- closing -----------------------------------------------------------------------------------

    def shut(self, sock: Socket) -> None:
        """The first half of a close: CM disconnects (the peer's DISCONNECTED tells it), the QP goes to ERR,
        and the flush completes what is pending ABORTED."""
        if sock.cmid is not None and sock.state in ("connected", "accepted"):
            with contextlib.suppress(Exception):
                sock.cmid.disconnect()
        if sock.state in ("connected", "accepted", "connecting", "listening", "created"):
            sock.state = "error"
        qp_to_error(sock)
        self._completions.drain(sock, 10.0)

    def remove(self, sock: Socket) -> None:
        """The second half, once its registrations are released: its verbs objects go, the socket is closed
        (completed operation records stay until the next reset)."""
        self.destroy(sock)
        sock.state = "closed"
        del self._sockets[sock.id]
        self._closed.add(sock.id)

    def destroy(self, sock: Socket) -> None:
        """The socket's verbs and CM objects, each closed once: null page MR, QP, CM ids, channel, PD."""
        self._null_page.release(sock, self._releases)
        if sock.qp is not None:
            self._releases.close_once(sock.qp)
            sock.qp = None
        for name in ("cmid", "listener", "channel"):
            obj = getattr(sock, name)
            setattr(sock, name, None)
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()
        sock.fd = -1
        if sock.pd is not None:
            self._releases.close_once(sock.pd)
            sock.pd = None

    def forget_closed(self) -> None:
        """The host forgot every socket at a reset."""
        self._closed.clear()
