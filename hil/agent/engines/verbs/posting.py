"""Posting a process's operations: RDMA write/read, send, receive, and bursts of RDMA transfers.

Each operation checks its socket and scatter list, gathers the SGEs (local access and bounds of
the socket's own handles checked in software; an unknown handle goes to the NIC as the lkey it
claims to be) and posts one work request. A burst posts the same RDMA work request ``count`` times,
up to ``depth`` in flight, reposting as each completes (bursts.py). Standard library +
pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyverbs.wr import SGE, RecvWR, SendWR

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.bursts import Burst
from hil.agent.engines.verbs.completions import Completions
from hil.agent.engines.verbs.connections import qp_to_error
from hil.agent.engines.verbs.context import DeviceContext
from hil.agent.engines.verbs.memory import NullPage
from hil.agent.engines.verbs.records import FENCED, U64, Operation, Socket, unpack_descriptor
from hil.agent.engines.verbs.sockets import Sockets
from pytest_san.spi import checks
from pytest_san.spi.contract import (
    QUEUE_DEPTH,
    Access,
    SanError,
    Status,
    WsaError,
    is_int,
)


def work_request(kind: Any, sges: list[Any], **fields: Any) -> Any:
    """A send or receive work request (pyverbs' ``kind``) of ``sges``, none at all allowed: verbs posts a WR
    of zero SGEs (a zero-byte message), but pyverbs' constructor wants one, so it is given one and told
    after that there are none (a send of an empty scatter list)."""
    if sges:
        return kind(num_sge=len(sges), sg=sges, **fields)
    wr = kind(num_sge=1, sg=[SGE(0, 0, 0)], **fields)
    wr.num_sge = 0
    return wr


def _triples(buffers: object) -> list[tuple[Any, Any, Any]]:
    """The scatter list as the agent sends it, [[address, length, handle], ...]; WSAEINVAL for anything else (a
    caller of the child itself: the agent's own checks made them so)."""
    if not isinstance(buffers, (list, tuple)) or not all(isinstance(e, (list, tuple)) and len(e) == 3
                                                          for e in buffers):
        raise SanError(WsaError.WSAEINVAL, f"the buffers are a list of [address, length, handle], got {buffers!r:.80}")
    return [(e[0], e[1], e[2]) for e in buffers]


class Posting:
    """Owns nothing of its own: an operation lives in the completions' table and its socket's queues; this
    part checks a transfer, gathers its scatter list and posts its work requests.

    Gets the device (its limits and transport), the sockets, the completions (which make and finish the
    operations) and the null page (the SGE of an empty scatter list, and of an iWARP fence read)."""

    def __init__(self, device: DeviceContext, sockets: Sockets, completions: Completions,
                 null_page: NullPage) -> None:
        self._device = device
        self._sockets = sockets
        self._completions = completions
        self._null_page = null_page

    def _checked(self, socket: int, buffers: object, kind: str, descriptor: object = None,
                 offset: object = 0) -> tuple[Socket, list[tuple[int, int, Any]]]:
        """The socket and the (address, length, handle) entries, once pytest_san.spi.checks' values and state stages
        passed (the agent ran the objects stage: the entries are the scatter list's, reduced to triples)."""
        sock = self._sockets.get(socket)
        entries = _triples(buffers)
        self._sockets.refresh(sock)
        if kind == "recv":
            full = len(sock.recv_ops) >= QUEUE_DEPTH
        else:
            full = self._completions.send_queue_used(sock) >= QUEUE_DEPTH
        return sock, checks.transfer_values(
            kind, entries, descriptor, offset,
            not_connected=None if sock.state == "connected" else f"socket {sock.id} is {sock.state}, not connected",
            device=self._device_refusal(kind, entries),
            queue_full=f"{kind} queue of socket {sock.id} is full ({QUEUE_DEPTH})" if full else None)

    def _device_refusal(self, kind: str, entries: list[tuple[Any, Any, Any]]) -> str | None:
        """Why the device cannot take this scatter list (its max_sge; an RDMA read: its max_sge_rd), or None."""
        device = self._device
        if len(entries) > device.max_sge:
            return f"{len(entries)} buffers, the device takes at most {device.max_sge}"
        moving = [entry for entry in entries if entry[1] != 0]  # a zero-length entry is not posted on iWARP
        if kind == "rdma_read" and len(moving if device.iwarp else entries) > device.max_sge_rd:
            # The device scatters a read into at most max_sge_rd entries (siw: 1): too many buffers for it.
            return f"{len(entries)} buffers for an RDMA read, the device reads into at most {device.max_sge_rd}"
        return None

    def _gather(self, sock: Socket, op: Operation, entries: list[tuple[int, int, Any]],
                need: int) -> list[Any] | None:
        """SGEs for the checked (address, length, handle) entries, or None when the provider refuses them.

        A handle registered on this socket is checked in software (access: R6/R7, bounds, and it
        must be a handle of this socket). A handle this process does not know at all goes to the
        NIC as the lkey it claims to be when the entry is a source (send, RdmaWrite) posted on an idle
        send queue: the NIC refuses a foreign one (R1) before anything leaves. Refused here instead: a
        sink's (receive, RdmaRead), since the NIC checks a sink's
        lkeys only as data lands, after it wrote the entries before it, and a rejected operation moves
        no byte; and a source queued behind another operation, since rxe then never retries a send
        waiting for the peer's receive (RNR) and the whole queue hangs.
        """
        sges = []
        total = 0
        queued = len(sock.send_ops - {op.id}) > 0
        for address, length, handle in entries:
            reg = sock.handles.get(handle) if is_int(handle) else None
            if reg is None:
                # (rxe from 6.12 flushes the request instead of reporting the lkey: quirks.py)
                if not is_int(handle) or need & Access.WRITE or queued or self._device.refuse_unknown_lkeys:
                    return None
                # An lkey of this PD registered on another socket would pass the NIC; a zero-length or
                # over-long SGE might not be checked against its lkey at all: refused here.
                if (self._known_elsewhere(sock, handle) or not 0 <= handle <= 0xFFFFFFFF
                        or not 0 < length <= 0xFFFFFFFF):
                    return None
                sges.append(SGE(address & U64, length, handle))
                total += length
                continue
            if not reg.access & need or address < reg.address or address + length > reg.address + reg.length:
                return None
            reg.in_use += 1
            op.regs.append(reg)
            sges.append(SGE(address, length, reg.key))
            total += length
        op.nbytes = total
        if self._device.skip_zero_sges:
            # Never a zero-length SGE (it moves nothing): siw dereferences a NULL memory object for one in a
            # send or an RDMA write, an oops that hangs the device (quirks.py: siw-zero-length-sge). A send of no
            # SGE at all is fine there (``work_request``); a receive gets the null page's zero-length one.
            return [sge for sge in sges if sge.length]
        if not sges:
            sges.append(self._null_page.sge(sock))
        return sges

    def _known_elsewhere(self, sock: Socket, handle: int) -> bool:
        """An lkey of this process that is not one of the socket's handles: refused here (another socket's
        lies in another PD and would fail on the NIC too; the socket's null page would pass)."""
        if self._null_page.is_lkey(handle):
            return True
        return any(handle in other.handles for other in self._sockets.open() if other is not sock)

    def _refuse(self, op: Operation, status: int = Status.LOCAL_PROTECTION.value) -> int:
        """The provider refuses the operation (LOCAL_PROTECTION: its local buffers), and the connection
        breaks as on verbs."""
        self._completions.finish(op, status, 0)
        op.sock.state = "error"
        qp_to_error(op.sock)
        return op.id

    def _source_flags(self, sock: Socket, flags: int) -> int:
        """``flags`` for a send or RDMA write, fenced behind an RDMA read still outstanding on ``sock``: an RC
        requester may gather a later request's source before the read's response data has landed in it
        (rxe on 6.12 does), and the contract runs a connection's operations in posting order."""
        return flags | e.IBV_SEND_FENCE if self._completions.read_outstanding(sock) else flags

    def _post_send_wr(self, op: Operation, wr: Any) -> int:
        try:
            op.sock.qp.post_send(wr)
        except Exception as exc:
            self._completions.unpost(op)
            raise SanError(WsaError.WSAENETDOWN, f"ibv_post_send on socket {op.sock.id} failed: {exc}") from None
        return op.id

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
            checks.burst(*burst)
        sock, entries = self._checked(socket, buffers, kind, descriptor, offset)
        address, window_length, rkey, stated = unpack_descriptor(bytes(descriptor))
        op = self._completions.new_op(sock, kind)
        # Local side: an RdmaWrite source must be readable (R7), an RdmaRead sink writable (R6).
        sges = self._gather(sock, op, entries, Access.READ if kind == "rdma_write" else Access.WRITE)
        if sges is None:
            return self._refuse(op)
        if not 0 <= address + offset <= U64 - op.nbytes:
            # No remote address the NIC could be given: wrapped modulo 2**64 it would name bytes inside the
            # window (offset 2**64 read the window's start). Past any window: what the responder answers.
            return self._refuse(op, Status.ACCESS_VIOLATION.value)
        if op.nbytes == 0 and self._device.complete_zero_rdma:
            # Nothing to move: the IB spec lets a NIC skip the rkey check of a zero-length transfer, and rxe
            # checks nothing of one (quirks.py: rxe-zero-length-read). Completed here, checked against the
            # window's range as the descriptor states it (whether it is still registered, and its access,
            # only the peer's NIC knows: a documented alternative).
            if 0 <= offset <= window_length:
                self._completions.finish(op, Status.SUCCESS.value, 0)
                return op.id
            return self._refuse(op, Status.ACCESS_VIOLATION.value)
        if self._device.check_stated and (not 0 <= offset <= window_length - op.nbytes
                                          or not stated & (Access.WRITE if kind == "rdma_write" else Access.READ)):
            # siw checks a tagged write's bounds segment by segment, placing the first segments of an over-long
            # one, and serves a read of an MR without REMOTE_READ: the range and access the descriptor states are
            # checked here first (a rejected transfer moves no byte).
            return self._refuse(op, Status.ACCESS_VIOLATION.value)
        opcode = e.IBV_WR_RDMA_WRITE if kind == "rdma_write" else e.IBV_WR_RDMA_READ
        flags = self._source_flags(sock, 0) if kind == "rdma_write" else 0
        sges = sges or [self._null_page.sge(sock)]  # zero bytes posted (a reproducer, its workaround off)
        wr = SendWR(wr_id=op.id, opcode=opcode, num_sge=len(sges), sg=sges, send_flags=flags | e.IBV_SEND_SIGNALED)
        # The responder's NIC checks the window: its QP (R2), validity (R3), access (R6/R7), bounds (R8).
        wr.set_wr_rdma(rkey, (address + offset) & U64)
        if burst is None and op.fences:
            # Unsignaled (an error still completes, FENCED in its wr_id): the fence read behind it completes op.
            wr = SendWR(wr_id=op.id | FENCED, opcode=opcode, num_sge=len(sges), sg=sges, send_flags=flags)
            wr.set_wr_rdma(rkey, (address + offset) & U64)
            self._post_send_wr(op, wr)
            return self._post_send_wr(op, self._fence_wr(op, rkey, (address + offset) & U64))
        if burst is None:
            return self._post_send_wr(op, wr)
        count, depth = burst
        target = (address + offset) & U64
        # The send queue's free room bounds what is in flight (_post_checks left at least one slot).
        op.burst = Burst(wr, count, min(depth, count, QUEUE_DEPTH - self._completions.send_queue_used(sock) + 1),
                         (lambda: self._fence_wr(op, rkey, target)) if op.fences else None)
        self._post_send_wr(op, wr)  # the first post's failure is the call's error
        op.burst.posted = op.burst.in_flight = 1
        self._completions.refill(op)
        return op.id

    def _fence_wr(self, op: Operation, rkey: int, remote_addr: int) -> Any:
        # A zero-length read checks no key (siw skips it), so a WRITE-only target does not fail its fence.
        wr = SendWR(wr_id=op.id, opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[self._null_page.sge(op.sock)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rkey, remote_addr)
        return wr

    def send(self, socket: int, buffers: Sequence[Sequence[int]]) -> int:
        sock, entries = self._checked(socket, buffers, "send")
        op = self._completions.new_op(sock, "send")
        sges = self._gather(sock, op, entries, Access.READ)  # R7: a WRITE-only handle is no send source
        if sges is None:
            return self._refuse(op)
        flags = self._source_flags(sock, 0)
        if op.fences:  # as an RDMA write (_rdma): the receiver's refusal ends the connection instead
            self._post_send_wr(op, work_request(SendWR, sges, wr_id=op.id | FENCED, opcode=e.IBV_WR_SEND,
                                                send_flags=flags))
            return self._post_send_wr(op, self._fence_wr(op, 0, 0))
        wr = work_request(SendWR, sges, wr_id=op.id, opcode=e.IBV_WR_SEND, send_flags=flags | e.IBV_SEND_SIGNALED)
        return self._post_send_wr(op, wr)

    def recv(self, socket: int, buffers: Sequence[Sequence[int]]) -> int:
        sock, entries = self._checked(socket, buffers, "recv")
        op = self._completions.new_op(sock, "recv")
        sges = self._gather(sock, op, entries, Access.WRITE)  # R6: a READ-only handle is no receive buffer
        if sges is None:
            return self._refuse(op)
        if not sges:  # iWARP: libsiw refuses a receive of no SGE; siw's receive path skips a zero-length one
            sges = [self._null_page.sge(sock)]
        wr = work_request(RecvWR, sges, wr_id=op.id)
        try:
            sock.qp.post_recv(wr)
        except Exception as exc:
            self._completions.unpost(op)
            raise SanError(WsaError.WSAENETDOWN, f"ibv_post_recv on socket {sock.id} failed: {exc}") from None
        return op.id
