"""A process's connections through the RDMA connection manager (librdmacm, pyverbs' ``cmid``).

The controller relays an address and a port, never QP numbers or GIDs: CM resolves GIDs, paths and
the QP attributes of every transport (RoCE, InfiniBand, iWARP, which connects only through CM).

* ``listen``: a socket's listening CMID, bound to this device's address and a free port; the child
  accepts the first connect request for it **by itself** (``on_event``, run by the sockets' pump, which
  the child's request loop calls whenever a socket's channel is readable, and every wait), so the
  active end's ``connect`` can wait for the connection while the passive child is idle: no controller
  round trip sits between the two ends, and none can deadlock;
* ``connect``: a socket connected to a listener (resolve address, route; connect); returns once the
  connection is established;
* each socket has its own event channel, so its events are its own (pyverbs' CMEvent names no
  CMID): ESTABLISHED, and DISCONNECTED when the peer closed or its process died (``on_event`` tells the
  sockets, which report the peer's close: pending operations complete CONNECTION_RESET).

The QP is the engine's own (a pyverbs QP, in the socket's PD): CM gives its attributes
(``init_qp_attr``) and carries its number; on iWARP the kernel moves it to RTS itself.
Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam
from pyverbs.qp import QPAttr

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.context import DeviceContext
from hil.agent.engines.verbs.records import Socket
from pytest_san.spi.contract import (
    SanError,
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


def qp_to_error(sock: Socket) -> None:
    """Move the socket's QP to ERR (its pending work requests flush)."""
    with contextlib.suppress(Exception):
        sock.qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)


class Connections:
    """The connection manager's procedures on one socket: listen, accept, connect, and its events.

    Owns nothing but what it is given: the device (its address, transport, limits) and ``pump``, the
    sockets' wait for connection manager events (``Sockets._pump``), which a connect runs while it waits
    for its own events."""

    def __init__(self, device: DeviceContext, pid: int, pump: Callable[[float], int]) -> None:
        self._device = device
        self._pid = pid
        self._pump = pump

    # -- the passive end -----------------------------------------------------------------------

    def listen(self, sock: Socket) -> int:
        """Bind the socket's listening CMID to this device's address and a free port: the port. Its first
        connect request is accepted by ``on_event``; any further one is rejected."""
        address = self._device.address
        try:
            sock.channel, sock.fd = new_channel()
            port = self._bind_listener(sock)
            sock.listener.listen(1)
        except SanError:
            raise
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"cannot listen on {address}: {exc}") from None
        sock.state = "listening"
        return port

    def _bind_listener(self, sock: Socket) -> int:
        address = self._device.address
        for _ in range(64):
            port = random.randrange(*PORTS)
            listener = CMID(creator=sock.channel, port_space=e.RDMA_PS_TCP)
            try:
                listener.bind_addr(AddrInfo(src=address, src_service=str(port), port_space=e.RDMA_PS_TCP,
                                            flags=e.RAI_PASSIVE))
            except Exception as exc:
                listener.close()
                if getattr(exc, "error_code", None) == errno.EADDRINUSE:
                    continue
                raise
            sock.listener = listener
            self._check_device(listener)
            return port
        raise SanError(WsaError.WSAENOBUFS, f"no free port on {address} in {PORTS[0]}..{PORTS[1]}")

    def _check_device(self, cmid: Any) -> None:
        """CM chose the device by address: it must be ours (another device on the same netdev wins
        otherwise: rxe and siw on one NIC)."""
        name, device = cmid.dev_name, self._device
        if name != device.device:
            raise SanError(WsaError.WSAEINVAL, f"the connection manager bound {device.address} to {name}, not "
                           f"{device.device}: give each RDMA device its own netdev")

    def _accept(self, sock: Socket, child: Any) -> None:
        """A connect request (``child``, its CMID) for a listening socket: the socket's QP takes CM's
        attributes, and the request is accepted."""
        sock.cmid = child
        try:
            self._qp_to(sock, child, e.IBV_QPS_INIT)
            if not self._device.iwarp:  # iWARP: the kernel moves the QP to RTS when the connection is up
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

    # -- the active end ------------------------------------------------------------------------

    def connect(self, sock: Socket, address: str, port: int) -> None:
        """Connect the socket to the listener at ``address``:``port``; returns once the connection is up."""
        sock.state = "connecting"
        try:
            sock.channel, sock.fd = new_channel()
            cmid = sock.cmid = CMID(creator=sock.channel, port_space=e.RDMA_PS_TCP)
            cmid.resolve_addr(AddrInfo(src=self._device.address, dst=address, dst_service=str(port),
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
        except SanError:
            raise
        except Exception as exc:
            raise SanError(WsaError.WSAEINVAL, f"cannot connect to {address}:{port}: {exc}") from None
        sock.state = "connected"

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
        reads = self._device.max_rd_atomic
        return ConnParam(resources=reads, depth=reads, retry=RETRY_COUNT, rnr_retry=RNR_RETRY,
                         qp_num=int(sock.qp.qp_num))

    def _qp_to(self, sock: Socket, cmid: Any, state: int) -> None:
        """Move the socket's QP to ``state`` with the attributes CM gives, and the engine's own access,
        timeouts and retries where the transition takes them."""
        iwarp = self._device.iwarp
        attr, mask = cmid.init_qp_attr(state)
        if state == e.IBV_QPS_INIT or mask & e.IBV_QP_ACCESS_FLAGS:
            attr.qp_access_flags = ACCESS  # CM leaves remote access off on an active iWARP/IB QP in INIT
            mask |= e.IBV_QP_ACCESS_FLAGS
        if state == e.IBV_QPS_RTR and not iwarp:
            attr.min_rnr_timer = MIN_RNR_TIMER
            mask |= e.IBV_QP_MIN_RNR_TIMER
        if state == e.IBV_QPS_RTS and not iwarp:
            attr.timeout, attr.retry_cnt, attr.rnr_retry = ACK_TIMEOUT, RETRY_COUNT, RNR_RETRY
            mask |= e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
        sock.qp.modify(attr, mask)

    def _note(self, sock: Socket, text: str) -> None:
        print(f"pid {self._pid} socket {sock.id}: {text}", file=sys.stderr, flush=True)

    # -- events --------------------------------------------------------------------------------

    def on_event(self, sock: Socket) -> bool:
        """Handle the event waiting on the socket's channel; True when it says the peer is gone (the
        caller reports the peer's close)."""
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
            return False
        if kind == e.RDMA_CM_EVENT_TIMEWAIT_EXIT:
            return False
        if kind in (e.RDMA_CM_EVENT_DISCONNECTED, e.RDMA_CM_EVENT_DEVICE_REMOVAL) and sock.state != "connecting":
            return True
        if sock.state == "accepted":
            if kind == e.RDMA_CM_EVENT_ESTABLISHED:
                sock.state = "connected"
            else:  # the active end gave up (CONNECT_ERROR, UNREACHABLE, REJECTED)
                sock.state = "error"
                qp_to_error(sock)
                self._note(sock, f"accepted connection failed: {event_name(kind)}")
            return False
        if sock.state == "connecting":
            sock.events.append(kind)
        return False
