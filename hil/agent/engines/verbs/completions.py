"""A process's completions: polling the one CQ, finishing operations, and the engine's own work requests.

Completions' ibv_wc_status numbers are the contract's Status values (unknown ones become
REMOTE_OPERATION; a flush is the socket's flush status). ``op_wait``/``op_done`` poll until an
operation completes; the engine's own work requests (window bind, local invalidate) are posted and
awaited by ``_run_internal``; ``_drain`` waits for a QP's flush. Standard library + pyverbs,
Python 3.9 compatible.
"""

from __future__ import annotations

import time
from typing import Any

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.state import FENCED, INTERNAL, Operation, ProcessState, Socket
from pytest_san.contract import (
    SanError,
    Status,
    WsaError,
    is_int,
)


class CompletionsMixin(ProcessState):
    """Completions: the CQ poll, operation results and waits, engine work requests, flushes."""

    def _poll(self) -> int:
        """Take every completion the CQ holds (and the connection manager's events); returns how many."""
        self._pump()
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
        if wr_id & FENCED:  # the write of a fenced write failed by itself; its fence completes (flushed) after it
            op = self._ops.get(wr_id & ~FENCED)
            if op is not None and op.status is None and op.fence_error is None:
                op.wc_status = wc_status
                op.fence_error = self._error_status(op.sock, wc_status)
            return
        op = self._ops.get(wr_id)
        if op is None or op.status is not None:
            return
        if op.burst is not None:
            self._on_burst_completion(op, wc_status)
            return
        if op.fence_error is not None:
            self._finish(op, op.fence_error, 0)
            return
        op.wc_status = wc_status
        if wc_status == e.IBV_WC_SUCCESS:
            self._finish(op, Status.SUCCESS.value, byte_len if op.kind == "recv" else op.nbytes)
            return
        self._finish(op, (self._fence_status if self._fences(op) else self._error_status)(op.sock, wc_status), 0)

    def _error_status(self, sock: Socket, wc_status: int) -> int:
        """The contract's status for an error completion; the socket goes to error, as its QP has."""
        if wc_status == e.IBV_WC_WR_FLUSH_ERR and sock.state == "connected" and self.iwarp:
            # Nothing of ours moved the QP to ERR: the kernel did as the connection ended (iWARP: the peer
            # closed, died or refused a transfer). CM's DISCONNECTED may come after the flush.
            sock.flush_status = Status.CONNECTION_RESET.value
        if sock.state == "connected":
            sock.state = "error"  # every error completion leaves the QP in ERR
        return sock.flush_status if wc_status == e.IBV_WC_WR_FLUSH_ERR else Status.from_verbs(wc_status).value

    def _on_burst_completion(self, op: Operation, wc_status: int) -> None:
        burst = op.burst
        assert burst is not None
        burst.in_flight -= 1
        if wc_status == e.IBV_WC_SUCCESS:
            if not burst.fenced:  # a fence (iWARP, after the last write) moves no byte
                burst.ok_bytes += op.nbytes
        elif burst.error is None:
            op.wc_status = wc_status
            burst.error = (self._fence_status if burst.fenced else self._error_status)(op.sock, wc_status)
            if burst.fenced:
                burst.ok_bytes = 0  # the responder refused a write: what it placed before is not known
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
