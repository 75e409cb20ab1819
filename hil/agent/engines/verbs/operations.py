"""Posting a process's operations: RDMA write/read, send, receive, and bursts of RDMA transfers.

Each operation checks its socket and scatter list, gathers the SGEs (local access and bounds of
the socket's own handles checked in software; an unknown handle goes to the NIC as the lkey it
claims to be) and posts one work request. A burst posts the same RDMA work request ``count`` times,
up to ``depth`` in flight, reposting as each completes (completions.py). Standard library +
pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyverbs.wr import SGE, RecvWR, SendWR  # type: ignore[import-not-found]

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.state import FENCED, U64, Burst, Operation, ProcessState, Socket, unpack_descriptor
from pytest_san.contract import (
    DESCRIPTOR_SIZE,
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
    after that there are none (found by the SPI fuzz on siw: a send of an empty scatter list)."""
    if sges:
        return kind(num_sge=len(sges), sg=sges, **fields)
    wr = kind(num_sge=1, sg=[SGE(0, 0, 0)], **fields)
    wr.num_sge = 0
    return wr

class OperationsMixin(ProcessState):
    """Data transfer: checks, scatter lists, and the work requests posted for each operation."""

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
        NIC as the lkey it claims to be when the entry is a source (send, RdmaWrite) posted on an idle
        send queue: the NIC refuses a foreign one (R1) before anything leaves. Refused here instead
        (found by pytest_san.model on rxe): a sink's (receive, RdmaRead), since the NIC checks a sink's
        lkeys only as data lands, after it wrote the entries before it, and a rejected operation moves
        no byte; and a source queued behind another operation, since rxe then never retries a send
        waiting for the peer's receive (RNR) and the whole queue hangs.
        """
        sges = []
        total = 0
        queued = len(sock.send_ops - {op.id}) > 0
        for address, length, handle in buffers:
            reg = sock.handles.get(handle) if is_int(handle) else None
            if reg is None:
                if not is_int(handle) or need & Access.WRITE or queued:
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
        if self.iwarp:
            # Never a zero-length SGE (it moves nothing): siw (kernel 6.1) dereferences a NULL memory object for
            # one in a send or an RDMA write, an oops that hangs the device. A send of no SGE at all is fine
            # there (``work_request``); a receive gets the null page's zero-length one (``recv``).
            return [sge for sge in sges if sge.length]
        if not sges:
            sges.append(self._null_sge(sock))
        return sges

    def _known_elsewhere(self, sock: Socket, handle: int) -> bool:
        """An lkey of this process that is not one of the socket's handles: refused here (another socket's
        lies in another PD and would fail on the NIC too; the socket's null page would pass)."""
        if any(s.null_mr is not None and handle == s.null_mr.lkey for s in self._sockets.values()):
            return True
        return any(handle in other.handles for other in self._sockets.values() if other is not sock)

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
        moving = [b for b in buffers if b[1] != 0]  # a zero-length entry moves nothing (and is not posted on iWARP)
        if kind == "rdma_read" and len(moving if self.iwarp else buffers) > self.max_sge_rd:
            # The device scatters a read into at most max_sge_rd entries (siw: 1): too many buffers for it.
            raise SanError(WsaError.WSAEINVAL, f"{len(buffers)} buffers for an RDMA read, the device reads into "
                           f"at most {self.max_sge_rd}")
        if not isinstance(descriptor, (bytes, bytearray)) or len(descriptor) != DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {descriptor!r}")
        if not is_int(offset):
            raise SanError(WsaError.WSAEINVAL, f"offset {offset!r} is not an integer")
        address, window_length, rkey, stated = unpack_descriptor(bytes(descriptor))
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
        if self.iwarp and (not 0 <= offset <= window_length - op.nbytes
                           or not stated & (Access.WRITE if kind == "rdma_write" else Access.READ)):
            # siw checks a tagged write's bounds segment by segment, placing the first segments of an over-long
            # one, and serves a read of an MR without REMOTE_READ: the range and access the descriptor states are
            # checked here first (a rejected transfer moves no byte).
            return self._refuse(op, Status.ACCESS_VIOLATION.value)
        opcode = e.IBV_WR_RDMA_WRITE if kind == "rdma_write" else e.IBV_WR_RDMA_READ
        wr = SendWR(wr_id=op.id, opcode=opcode, num_sge=len(sges), sg=sges, send_flags=e.IBV_SEND_SIGNALED)
        # The responder's NIC checks the window: its QP (R2), validity (R3), access (R6/R7), bounds (R8).
        wr.set_wr_rdma(rkey, (address + offset) & U64)
        if burst is None and self._fences(op):
            # Unsignaled (an error still completes, FENCED in its wr_id): the fence read behind it completes op.
            wr = SendWR(wr_id=op.id | FENCED, opcode=opcode, num_sge=len(sges), sg=sges, send_flags=0)
            wr.set_wr_rdma(rkey, (address + offset) & U64)
            self._post_send_wr(op, wr)
            return self._post_send_wr(op, self._fence_wr(op, rkey, (address + offset) & U64))
        if burst is None:
            return self._post_send_wr(op, wr)
        count, depth = burst
        # The send queue's free room bounds what is in flight (_post_checks left at least one slot).
        op.burst = Burst(wr, count, min(depth, count, QUEUE_DEPTH - self._send_queue_used(sock) + 1),
                         (rkey, (address + offset) & U64))
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
            if burst.error is None and not burst.fenced and self._fences(op):
                burst.fenced = True  # every write completed where it was sent: the fence tells if they landed
                try:
                    op.sock.qp.post_send(self._fence_wr(op, *burst.target))
                    burst.in_flight = 1
                    return
                except Exception:
                    burst.error = op.sock.flush_status
            self._finish(op, Status.SUCCESS.value if burst.error is None else burst.error, burst.ok_bytes)

    def _fences(self, op: Operation) -> bool:
        """iWARP completes an RDMA write or a send once it is sent, not once the responder placed it: a
        refused one would complete SUCCESS. Its fence, a zero-length RDMA read behind it on the same QP, is
        answered only after what was sent before it was placed (the responder serves a stream in order; a
        refusal ends the stream instead), so the write or send completes with its fence."""
        return self.iwarp and op.kind in ("rdma_write", "send")

    def _fence_wr(self, op: Operation, rkey: int, remote_addr: int) -> Any:
        # A zero-length read checks no key (siw skips it), so a WRITE-only target does not fail its fence.
        wr = SendWR(wr_id=op.id, opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[self._null_sge(op.sock)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rkey, remote_addr)
        return wr

    def _fence_status(self, sock: Socket, wc_status: int) -> int:
        """A fence read that failed: its write was refused (the responder ended the connection: a flush while
        this end still looked connected) or the connection went down for another reason."""
        if wc_status == e.IBV_WC_WR_FLUSH_ERR and sock.state == "connected":
            self._error_status(sock, wc_status)
            return Status.ACCESS_VIOLATION.value
        return self._error_status(sock, wc_status)

    def send(self, socket: int, buffers: Sequence[Sequence[int]]) -> int:
        sock = self._post_checks(socket, buffers, "send")
        op = self._new_op(sock, "send")
        sges = self._gather(sock, op, buffers, Access.READ)  # R7: a WRITE-only handle is no send source
        if sges is None:
            return self._refuse(op)
        if self._fences(op):  # as an RDMA write (_rdma): the receiver's refusal ends the connection instead
            self._post_send_wr(op, work_request(SendWR, sges, wr_id=op.id | FENCED, opcode=e.IBV_WR_SEND,
                                                send_flags=0))
            return self._post_send_wr(op, self._fence_wr(op, 0, 0))
        wr = work_request(SendWR, sges, wr_id=op.id, opcode=e.IBV_WR_SEND, send_flags=e.IBV_SEND_SIGNALED)
        return self._post_send_wr(op, wr)

    def recv(self, socket: int, buffers: Sequence[Sequence[int]]) -> int:
        sock = self._post_checks(socket, buffers, "recv")
        op = self._new_op(sock, "recv")
        sges = self._gather(sock, op, buffers, Access.WRITE)  # R6: a READ-only handle is no receive buffer
        if sges is None:
            return self._refuse(op)
        if not sges:  # iWARP: libsiw refuses a receive of no SGE; siw's receive path skips a zero-length one
            sges = [self._null_sge(sock)]
        wr = work_request(RecvWR, sges, wr_id=op.id)
        try:
            sock.qp.post_recv(wr)
        except Exception as exc:
            self._unpost(op)
            raise SanError(WsaError.WSAENETDOWN, f"ibv_post_recv on socket {sock.id} failed: {exc}") from None
        return op.id
