"""A process's connections through the RDMA connection manager (librdmacm, pyverbs' ``cmid``).

The controller relays an address and a port, never QP numbers or GIDs: CM resolves GIDs, paths and
the QP attributes of every transport (RoCE, InfiniBand, iWARP, which connects only through CM).

* ``socket_listen``: a new socket whose listening CMID is bound to this device's address and a
  free port; the child accepts the first connect request for it **by itself** (``pump``, called from
  the child's request loop whenever the socket's channel is readable, and from every wait here), so
  the active end's ``socket_connect`` can wait for the connection while the passive child is idle:
  no controller round trip sits between the two ends, and none can deadlock;
* ``socket_connect``: a new socket connected to a listener (resolve address, route; connect);
  returns once the connection is established;
* each socket has its own event channel, so its events are its own (pyverbs' CMEvent names no
  CMID): ESTABLISHED, and DISCONNECTED when the peer closed or its process died (the socket reports
  the peer's close as ``socket_peer_closed``: pending operations complete CONNECTION_RESET).

The QP is the engine's own (a pyverbs QP, in the socket's PD): CM gives its attributes
(``init_qp_attr``) and carries its number; on iWARP the kernel moves it to RTS itself.
Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import select
import sys
import time
from typing import Any

from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam  # type: ignore[import-not-found]

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.state import ProcessState, Socket
from pytest_san.contract import (
    SanError,
    Status,
    WsaError,
)

# QP parameters (RC over IB/RoCE; iWARP has TCP's): local ACK timeout 4.096 us * 2^16 ~ 268 ms and 6
# retries, so a dead peer is reported as RETRY_EXC_ERR = CONNECTION_RESET within about two seconds. Not 7:
# rxe (rxe_comp.c) treats retry_cnt 7 like rnr_retry 7, as "retry forever", and an RDMA write to a closed
# peer would then never complete. RNR retry 7 = forever, so a send waits for the peer's receive as the
# contract's message model does.
ACK_TIMEOUT = 16
RETRY_COUNT = 6
RNR_RETRY = 7
MIN_RNR_TIMER = 12
RD_ATOMIC = 4  # RDMA reads in flight each way, at most (the device may allow fewer)

RESOLVE_MS = 5000  # address and route resolution, each (CM's own timeout: an ADDR/ROUTE_ERROR event)
CONNECT_WAIT = 60.0  # seconds for the peer's answer (TCG guests are slow)
ESTABLISHED_WAIT = 20.0  # seconds an accepted connection may wait for its ESTABLISHED
PORTS = (20000, 60000)  # listeners bind a random free port here (iWARP shares it with TCP)
RDMA_CM = "/dev/infiniband/rdma_cm"
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE

_EVENT_NAMES = {getattr(e, n): n[len("RDMA_CM_EVENT_"):] for n in dir(e) if n.startswith("RDMA_CM_EVENT_")}


def event_name(kind: int) -> str:
    return _EVENT_NAMES.get(kind, f"event {kind}")


def _rdma_cm_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == RDMA_CM:
                fds.add(int(name))
    return fds


def new_channel() -> tuple[Any, int]:
    """A CMEventChannel and its file descriptor (the one rdma_cm descriptor it opened: pyverbs does not
    say), so that a select() tells when it holds an event and reading one never blocks."""
    before = _rdma_cm_fds()
    channel = CMEventChannel()
    opened = _rdma_cm_fds() - before
    if len(opened) != 1:
        channel.close()
        raise SanError(WsaError.WSAENOBUFS, f"cannot tell the event channel's descriptor: {sorted(opened)} opened")
    return channel, opened.pop()


class ConnectionsMixin(ProcessState):
    """Connections through the RDMA connection manager: listen, accept, connect, and CM events."""

    # -- the passive end -----------------------------------------------------------------------

    def socket_listen(self) -> dict[str, Any]:
        """A new socket listening on this device's address and a free port: {"socket", "address", "port"}.
        Its first connect request is accepted by ``pump``; any further one is rejected."""
        sock = self._new_socket()
        try:
            sock.channel, sock.fd = new_channel()
            port = self._bind_listener(sock)
            sock.listener.listen(1)
        except BaseException as exc:
            self._discard(sock)
            if isinstance(exc, SanError):
                raise
            raise SanError(WsaError.WSAENOBUFS, f"cannot listen on {self.address}: {exc}") from None
        sock.state = "listening"
        return {"socket": sock.id, "address": self.address, "port": port}

    def _bind_listener(self, sock: Socket) -> int:
        for _ in range(64):
            port = random.randrange(*PORTS)
            listener = CMID(creator=sock.channel, port_space=e.RDMA_PS_TCP)
            try:
                listener.bind_addr(AddrInfo(src=self.address, src_service=str(port), port_space=e.RDMA_PS_TCP,
                                            flags=e.RAI_PASSIVE))
            except Exception as exc:
                listener.close()
                if getattr(exc, "error_code", None) == errno.EADDRINUSE:
                    continue
                raise
            sock.listener = listener
            self._check_device(listener)
            return port
        raise SanError(WsaError.WSAENOBUFS, f"no free port on {self.address} in {PORTS[0]}..{PORTS[1]}")

    def _check_device(self, cmid: Any) -> None:
        """CM chose the device by address: it must be ours (another device on the same netdev wins
        otherwise: rxe and siw on one NIC)."""
        name = cmid.dev_name
        if name != self.device:
            raise SanError(WsaError.WSAEINVAL, f"the connection manager bound {self.address} to {name}, not "
                           f"{self.device}: give each RDMA device its own netdev")

    def _accept(self, sock: Socket, child: Any) -> None:
        """A connect request (``child``, its CMID) for a listening socket: the socket's QP takes CM's
        attributes, and the request is accepted."""
        sock.cmid = child
        try:
            self._qp_to(sock, child, e.IBV_QPS_INIT)
            if not self.iwarp:  # iWARP: the kernel moves the QP to RTS when the connection is up
                self._qp_to(sock, child, e.IBV_QPS_RTR)
                self._qp_to(sock, child, e.IBV_QPS_RTS)
            child.accept(self._conn_param(sock))
        except Exception as exc:
            sock.state = "error"
            with contextlib.suppress(Exception):
                child.reject()
            self._note(sock, f"accepting failed: {exc}")
            return
        sock.state = "accepted"
        listener, sock.listener = sock.listener, None  # one connection per socket: the port is free again
        with contextlib.suppress(Exception):
            listener.close()

    def _await_established(self, sock: Socket, timeout: float = ESTABLISHED_WAIT) -> None:
        """An accepted connection becomes connected on its ESTABLISHED (the active end sends it on)."""
        if self._pumping:  # inside an event's handling: its own events come later
            return
        deadline = time.monotonic() + timeout
        while sock.state == "accepted" and time.monotonic() < deadline:
            self._pump(min(0.05, max(0.0, deadline - time.monotonic())))
        if sock.state == "accepted":
            sock.state = "error"
            self._to_error(sock)

    # -- the active end ------------------------------------------------------------------------

    def socket_connect(self, peer: dict[str, Any]) -> dict[str, Any]:
        """A new socket connected to the listener at ``peer`` ({"address", "port"}): {"socket"}."""
        try:
            address, port = str(peer["address"]), int(peer["port"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SanError(WsaError.WSAEINVAL, f"bad peer {peer!r:.120}: {exc}") from None
        sock = self._new_socket()
        sock.state = "connecting"
        try:
            sock.channel, sock.fd = new_channel()
            cmid = sock.cmid = CMID(creator=sock.channel, port_space=e.RDMA_PS_TCP)
            cmid.resolve_addr(AddrInfo(src=self.address, dst=address, dst_service=str(port),
                                       port_space=e.RDMA_PS_TCP), RESOLVE_MS)
            self._expect(sock, e.RDMA_CM_EVENT_ADDR_RESOLVED)
            self._check_device(cmid)
            cmid.resolve_route(RESOLVE_MS)
            self._expect(sock, e.RDMA_CM_EVENT_ROUTE_RESOLVED)
            self._qp_to(sock, cmid, e.IBV_QPS_INIT)
            cmid.connect(self._conn_param(sock))
            if self._expect(sock, e.RDMA_CM_EVENT_CONNECT_RESPONSE, e.RDMA_CM_EVENT_ESTABLISHED) \
                    == e.RDMA_CM_EVENT_CONNECT_RESPONSE:
                # IB/RoCE with the engine's own QP: RTR and RTS from CM's attributes, then the RTU.
                self._qp_to(sock, cmid, e.IBV_QPS_RTR)
                self._qp_to(sock, cmid, e.IBV_QPS_RTS)
                cmid.establish()
        except BaseException as exc:
            self._discard(sock)
            if isinstance(exc, SanError):
                raise
            raise SanError(WsaError.WSAEINVAL, f"cannot connect to {address}:{port}: {exc}") from None
        sock.state = "connected"
        return {"socket": sock.id}

    def _expect(self, sock: Socket, *wanted: int) -> int:
        """The socket's next CM event, which must be one of ``wanted``; else WSAEINVAL naming it."""
        deadline = time.monotonic() + CONNECT_WAIT
        while not sock.events:
            if time.monotonic() >= deadline:
                raise SanError(WsaError.WSAEINVAL, f"no answer from the connection manager within {CONNECT_WAIT} s "
                               f"(waiting for {', '.join(map(event_name, wanted))})")
            self._pump(0.05)
        kind = sock.events.pop(0)
        if kind not in wanted:
            raise SanError(WsaError.WSAEINVAL, f"the connection manager said {event_name(kind)}, "
                           f"not {' or '.join(map(event_name, wanted))}")
        return kind

    # -- both ends -----------------------------------------------------------------------------

    def _conn_param(self, sock: Socket) -> Any:
        return ConnParam(resources=self.max_rd_atomic, depth=self.max_rd_atomic, retry=RETRY_COUNT,
                         rnr_retry=RNR_RETRY, qp_num=int(sock.qp.qp_num))

    def _qp_to(self, sock: Socket, cmid: Any, state: int) -> None:
        """Move the socket's QP to ``state`` with the attributes CM gives, and the engine's own access,
        timeouts and retries where the transition takes them."""
        attr, mask = cmid.init_qp_attr(state)
        if state == e.IBV_QPS_INIT or mask & e.IBV_QP_ACCESS_FLAGS:
            attr.qp_access_flags = ACCESS  # CM leaves remote access off on an active iWARP/IB QP in INIT
            mask |= e.IBV_QP_ACCESS_FLAGS
        if state == e.IBV_QPS_RTR and not self.iwarp:
            attr.min_rnr_timer = MIN_RNR_TIMER
            mask |= e.IBV_QP_MIN_RNR_TIMER
        if state == e.IBV_QPS_RTS and not self.iwarp:
            attr.timeout, attr.retry_cnt, attr.rnr_retry = ACK_TIMEOUT, RETRY_COUNT, RNR_RETRY
            mask |= e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
        sock.qp.modify(attr, mask)

    def _discard(self, sock: Socket) -> None:
        """A socket whose listen or connect failed: everything it held goes, it was never the caller's."""
        self._close_socket_verbs(sock)
        self._sockets.pop(sock.id, None)

    def _note(self, sock: Socket, text: str) -> None:
        print(f"pid {self.pid} socket {sock.id}: {text}", file=sys.stderr, flush=True)

    # -- events --------------------------------------------------------------------------------

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
                self._on_event(by_fd[fd])
        finally:
            self._pumping = False
        return len(ready)

    def _on_event(self, sock: Socket) -> None:
        event = CMEvent(sock.channel)
        kind = int(event.event_type)
        request = None
        try:
            if kind == e.RDMA_CM_EVENT_CONNECT_REQUEST and sock.listener is not None:
                request = CMID(creator=event, listen_id=sock.listener)
        finally:
            # Acked before anything else: destroying a CMID waits until its events are acked.
            with contextlib.suppress(Exception):
                event.ack_cm_event()
        if kind == e.RDMA_CM_EVENT_CONNECT_REQUEST:
            if request is not None and sock.state == "listening":
                self._accept(sock, request)
            elif request is not None:  # one connection per socket
                with contextlib.suppress(Exception):
                    request.reject()
                request.close()
            return
        if kind == e.RDMA_CM_EVENT_TIMEWAIT_EXIT:
            return
        if kind in (e.RDMA_CM_EVENT_DISCONNECTED, e.RDMA_CM_EVENT_DEVICE_REMOVAL) and sock.state != "connecting":
            self.socket_peer_closed(sock.id, Status.CONNECTION_RESET.value)
            return
        if sock.state == "accepted":
            if kind == e.RDMA_CM_EVENT_ESTABLISHED:
                sock.state = "connected"
            else:  # the active end gave up (CONNECT_ERROR, UNREACHABLE, REJECTED)
                sock.state = "error"
                self._to_error(sock)
                self._note(sock, f"accepted connection failed: {event_name(kind)}")
            return
        if sock.state == "connecting":
            sock.events.append(kind)
