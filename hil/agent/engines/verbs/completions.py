"""A process's operations and completions: the table of pending operations, the one CQ's poll, waits,
and the engine's own work requests.

Completions' ibv_wc_status numbers are the contract's Status values (unknown ones become
REMOTE_OPERATION; a flush is the socket's flush status). ``op_wait``/``op_done`` poll until an
operation completes; the engine's own work requests (window bind, local invalidate) are posted and
awaited by ``run_internal``; ``drain`` waits for a QP's flush. Standard library + pyverbs,
Python 3.9 compatible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.context import DeviceContext
from hil.agent.engines.verbs.records import FENCED, INTERNAL, Operation, Socket
from pytest_san.spi.contract import (
    SanError,
    Status,
    WsaError,
    is_int,
)


class Completions:
    """Owns the process's operations (by id) and the engine's own work requests, and polls the CQ for both.

    ``pump`` handles the connection manager's events; every poll runs it first, so a wait also sees a
    peer's disconnect (and a listening socket of this process still accepts meanwhile)."""

    def __init__(self, device: DeviceContext, pid: int, pump: Callable[[], object]) -> None:
        self._cq = device.cq
        self._iwarp = device.iwarp
        self._pid = pid
        self._pump = pump
        self._ops: dict[int, Operation] = {}
        self._next_op = 1
        self._internal: dict[int, int] = {}  # internal wr_id -> wc status, once completed
        self._internal_socks: dict[int, Socket] = {}  # internal wr_id -> its socket, until it completes
        self._next_internal = INTERNAL | 1

    # -- operations ------------------------------------------------------------------------------

    def new_op(self, sock: Socket, kind: str) -> Operation:
        """A pending operation on ``sock``'s send or receive queue; on iWARP a write or send is fenced."""
        op = Operation(self._next_op, sock, kind, fences=self._iwarp and kind in ("rdma_write", "send"))
        self._next_op += 1
        self._ops[op.id] = op
        (sock.recv_ops if kind == "recv" else sock.send_ops).add(op.id)
        return op

    def unpost(self, op: Operation) -> None:
        """An operation the QP refused to post: as if it had never been made."""
        for reg in op.regs:
            reg.in_use -= 1
        op.regs = []
        op.sock.send_ops.discard(op.id)
        op.sock.recv_ops.discard(op.id)
        del self._ops[op.id]

    def finish(self, op: Operation, status: int, nbytes: int) -> None:
        if op.status is not None:
            return
        op.status = status
        op.nbytes_done = nbytes
        for reg in op.regs:
            reg.in_use -= 1
        op.regs = []
        op.sock.send_ops.discard(op.id)
        op.sock.recv_ops.discard(op.id)

    def read_outstanding(self, sock: Socket) -> bool:
        """Whether an RDMA read on ``sock``'s send queue has not completed yet."""
        return any(self._ops[op_id].kind == "rdma_read" for op_id in sock.send_ops)

    def send_queue_used(self, sock: Socket) -> int:
        """Work requests on the send queue: one per operation, ``in_flight`` for a burst."""
        used = len(sock.send_ops)
        for op_id in sock.send_ops:
            burst = self._ops[op_id].burst
            if burst is not None and burst.in_flight > 1:
                used += burst.in_flight - 1
        return used

    def op(self, op_id: int) -> Operation:
        op = self._ops.get(op_id) if is_int(op_id) else None
        if op is None:
            raise SanError(WsaError.WSAEINVAL, f"no operation {op_id!r} in pid {self._pid}")
        return op

    def op_done(self, op_id: int) -> bool:
        op = self.op(op_id)
        if op.status is None:
            self.poll()
        return op.status is not None

    def op_wait(self, op_id: int, timeout: float | None = 10.0) -> dict[str, Any]:
        """Poll the CQ until the operation completes: {"status", "bytes"}; TimeoutError after ``timeout``."""
        op = self.op(op_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0002
        while op.status is None:
            if self.poll():
                pause = 0.0002
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{op.kind} {op.id} on socket {op.sock.id} still pending after {timeout} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return op.result()

    def clear(self) -> None:
        """Forget every operation record (the host forgot them at a reset)."""
        self._ops.clear()

    # -- the CQ ----------------------------------------------------------------------------------

    def poll(self) -> int:
        """Take every completion the CQ holds (and the connection manager's events); returns how many."""
        self._pump()
        total = 0
        while True:
            n, wcs = self._cq.poll(32)
            for wc in wcs:
                self._on_completion(int(wc.wr_id), int(wc.status), int(wc.byte_len))
            total += int(n)
            if n < 32:
                return total

    def _on_completion(self, wr_id: int, wc_status: int, byte_len: int) -> None:
        if wr_id & INTERNAL:
            self._internal[wr_id] = wc_status
            sock = self._internal_socks.pop(wr_id, None)
            if sock is not None and wc_status != e.IBV_WC_SUCCESS and sock.state == "connected":
                sock.state = "error"
            return
        if wr_id & FENCED:  # the write of a fenced write failed by itself; its fence completes (flushed) after it
            op = self._ops.get(wr_id & ~FENCED)
            if op is not None and op.status is None and op.fence_error is None:
                op.wc_status = wc_status
                op.fence_error = self.error_status(op.sock, wc_status)
            return
        op = self._ops.get(wr_id)
        if op is None or op.status is not None:
            return
        if op.burst is not None:
            self._on_burst_completion(op, wc_status)
            return
        if op.fence_error is not None:
            self.finish(op, op.fence_error, 0)
            return
        op.wc_status = wc_status
        if wc_status == e.IBV_WC_SUCCESS:
            self.finish(op, Status.SUCCESS.value, byte_len if op.kind == "recv" else op.nbytes)
            return
        self.finish(op, (self.fence_status if op.fences else self.error_status)(op.sock, wc_status), 0)

    def error_status(self, sock: Socket, wc_status: int) -> int:
        """The contract's status for an error completion; the socket goes to error, as its QP has."""
        if wc_status == e.IBV_WC_WR_FLUSH_ERR and sock.state == "connected" and self._iwarp:
            # Nothing of ours moved the QP to ERR: the kernel did as the connection ended (iWARP: the peer
            # closed, died or refused a transfer). CM's DISCONNECTED may come after the flush.
            sock.flush_status = Status.CONNECTION_RESET.value
        if sock.state == "connected":
            sock.state = "error"  # every error completion leaves the QP in ERR
        return sock.flush_status if wc_status == e.IBV_WC_WR_FLUSH_ERR else Status.from_verbs(wc_status).value

    def fence_status(self, sock: Socket, wc_status: int) -> int:
        """A fence read that failed: its write was refused (the responder ended the connection: a flush while
        this end still looked connected) or the connection went down for another reason."""
        if wc_status == e.IBV_WC_WR_FLUSH_ERR and sock.state == "connected":
            self.error_status(sock, wc_status)
            return Status.ACCESS_VIOLATION.value
        return self.error_status(sock, wc_status)

    def _on_burst_completion(self, op: Operation, wc_status: int) -> None:
        burst = op.burst
        assert burst is not None
        burst.in_flight -= 1
        if wc_status == e.IBV_WC_SUCCESS:
            if not burst.fenced:  # a fence (iWARP, after the last write) moves no byte
                burst.ok_bytes += op.nbytes
        elif burst.error is None:
            op.wc_status = wc_status
            burst.error = (self.fence_status if burst.fenced else self.error_status)(op.sock, wc_status)
            if burst.fenced:
                burst.ok_bytes = 0  # the responder refused a write: what it placed before is not known
        self.refill(op)

    def refill(self, op: Operation) -> None:
        """Repost a burst while it can; finish it once it is over."""
        assert op.burst is not None
        over = op.burst.refill(op)
        if over is not None:
            self.finish(op, *over)

    # -- the engine's own work requests, flushes ---------------------------------------------------

    def internal_id(self) -> int:
        wr_id = self._next_internal
        self._next_internal += 1
        return wr_id

    def run_internal(self, sock: Socket, wr: Any, timeout: float = 20.0) -> int | None:
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
        self._internal_socks[wr_id] = sock
        behind = bool(sock.send_ops)
        deadline = time.monotonic() + (min(timeout, 2.0) if behind else timeout)
        pause = 0.0002
        while wr_id not in self._internal:
            if self.poll():
                continue
            if time.monotonic() >= deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return self._internal.pop(wr_id)

    def drain(self, sock: Socket, timeout: float) -> None:
        """Wait for the flush of a QP in ERR; whatever does not come completes in software."""
        deadline = time.monotonic() + timeout
        while (sock.send_ops or sock.recv_ops) and time.monotonic() < deadline:
            if not self.poll():
                time.sleep(0.001)
        for op_id in list(sock.send_ops) + list(sock.recv_ops):
            op = self._ops[op_id]
            self.finish(op, sock.flush_status, op.burst.ok_bytes if op.burst is not None else 0)
