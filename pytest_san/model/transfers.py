"""The reference model's data transfers: RDMA, messages, the send queue, and what an error breaks.

Written from the contract (pytest_san/CONTRACT.md: R1-R8, R11, R14) and the verbs semantics the
emulator follows: a handle is checked like an lkey in its socket's table, a descriptor names a window
of the peer's socket, an error completion moves the connection to error and flushes its pending
operations (ABORTED). A send waits for the peer's receive and reads its source when it is delivered,
as an RC QP re-reads it on RNR retry. Where a backend takes a documented alternative
(alternatives.py), ``self.traits.alts`` holds its id."""

from __future__ import annotations

import copy
from typing import TypeVar

from ..spi import checks
from ..spi.contract import MAX_SGE, Access, SanError, Status
from . import alternatives as alt
from .state import Expect, KeyValue, MOp, MReg, MSock, Traits
from .steps import Transfer, View

R, W = int(Access.READ), int(Access.WRITE)
S = Status
T = TypeVar("T", bound="TransferModel")
BAD_ENTRY_CODES = frozenset({"WSAEFAULT", "WSAEINVAL"})
"""What a provider may raise at the call for a scatter entry it refuses (CONTRACT.md section 4)."""


class TransferModel:
    """The state every part of the model shares, the transfer rules, and what completes and breaks."""

    def __init__(self, traits: Traits) -> None:
        self.traits = traits
        self.data: dict[tuple[int, int], bytearray] = {}
        self.socks: dict[int, MSock] = {}
        self.keys: dict[int, KeyValue] = {}  # register step id -> the key it returned
        self.regs: dict[int, MReg] = {}  # register step id -> the registration it made (or referenced)
        self.ops: dict[int, MOp] = {}  # pending operations by step op id
        self.exp = Expect()
        # The model as it was before the step's call moved it on, while the call may still turn out to have
        # been refused instead (Expect.instead), the alternatives the step expected by then, and its op id.
        self._undo: tuple[TransferModel, set[str], int] | None = None
        # op id -> the code of each transfer the backend refused at the call instead: a replay of the steps
        # (the rules of a divergence, rules.py) follows the backend's choice.
        self.refused_at_call: dict[int, str] = {}

    # -- a refusal at the call instead -----------------------------------------------------------

    def _may_refuse(self, why: str, codes: frozenset[str], op: int) -> None:
        """The call may raise one of ``codes`` (the documented alternative ``why``) instead of what the step
        goes on to expect; then it changes nothing. Call before the step changes anything but ``self.exp``."""
        ex = self.exp
        if self._undo is None:
            self.exp = Expect()  # not part of the state to go back to: the step's expectation stays
            self._undo = (copy.deepcopy(self), set(ex.alternatives), op)
            self.exp = ex
        ex.instead[why] = ex.instead.get(why, frozenset()) | codes

    def answered(self, ex: Expect, result: object) -> bool:
        """The call of the step last applied (its expectation ``ex``) answered ``result`` (what it returned or
        raised). A refusal the step allowed instead (``Expect.instead``) moves the model back to before the
        call, and the expectation becomes that refusal: True then."""
        if ex is not self.exp or not isinstance(result, SanError):
            self._undo = None
            return False
        return self._take_refusal(result.code.name)

    def _take_refusal(self, code: str) -> bool:
        ex, undo = self.exp, self._undo
        self._undo = None
        why = {alt_id for alt_id, codes in ex.instead.items() if code in codes}
        if undo is None or not why:
            return False
        before, alternatives, op = undo
        refused = self.refused_at_call
        self.restore(before)
        self.exp, self.refused_at_call = ex, refused
        refused[op] = code
        ex.raises, ex.returns, ex.done = frozenset({code}), "none", {}
        ex.alternatives = alternatives | why
        return True

    def snapshot(self: T) -> T:
        """A deep copy, to go back to (``restore``)."""
        return copy.deepcopy(self)

    def restore(self, before: TransferModel) -> None:
        """Go back to ``before`` (a deep copy of this model made earlier), in place: the generator and the
        engine hold this model."""
        vars(self).update(vars(before))

    # -- helpers -------------------------------------------------------------------------------

    def _on(self, name: str) -> bool:
        return name in self.traits.alts

    def _refusal(self, call: str, faults: list[str]) -> frozenset[str]:
        """The codes a call with ``faults`` (pytest_san.spi.checks' ids) may raise: any of theirs (the contract), or
        the first one's in the reference order where the backend follows it."""
        if self.traits.reference_order:
            return frozenset({checks.answer(call, checks.first(call, faults))})
        return frozenset(checks.answer(call, fault) for fault in faults)

    def _gather(self, views: list[View]) -> bytes:
        return b"".join(bytes(self.data[v[0], v[1]][v[2]:v[2] + v[3]]) for v in views)

    def _scatter(self, views: list[View], payload: bytes) -> None:
        pos = 0
        for pi, bi, off, n in views:
            if pos >= len(payload):
                break
            n = min(n, len(payload) - pos)
            if n <= 0:  # a zero-length entry takes nothing: the next one goes on where it was
                continue
            self.data[pi, bi][off:off + n] = payload[pos:pos + n]
            self.exp.touched.buffers.add((pi, bi))
            pos += n

    def _complete(self, op: MOp, statuses: set[Status], nbytes: int = 0) -> None:
        for reg in op.regs:
            reg.users -= 1
        op.regs = []
        self.ops.pop(op.id, None)
        self.exp.done[op.id] = (frozenset(statuses), nbytes)

    def _flush(self, s: MSock, statuses: set[Status]) -> None:
        for op in s.pending():
            self._complete(op, statuses)
        s.recvs.clear()
        s.sq.clear()

    def _fail(self, s: MSock) -> None:
        """``s`` goes to error: what is pending on it is flushed."""
        if s.state == "connected":
            s.state = "error"
            self.exp.touched.states.add(s.id)
            self._flush(s, {S.ABORTED})

    def _refused(self, status: Status) -> set[Status]:
        """The statuses of an operation its responder refused: ``status``, or on iWARP what ends it there."""
        if self._on(alt.ERROR_ENDS_CONNECTION):
            return {S.ACCESS_VIOLATION, S.ABORTED, S.CONNECTION_RESET}
        return {status}

    def _break(self, s: MSock, *, local: bool = False) -> None:
        """An error completion on ``s``: both ends go to error, or (``local``, on verbs) only this one."""
        if self._on(alt.ERROR_ENDS_CONNECTION):  # the connection ends: each end learns it its own way
            self.exp.alternatives.add(alt.ERROR_ENDS_CONNECTION)
            for end in (s, s.peer):
                assert end is not None
                if end.state == "connected":
                    end.state = "error"
                    self.exp.touched.states.add(end.id)
                    self._flush(end, {S.ABORTED, S.CONNECTION_RESET})
            return
        self._fail(s)
        peer = s.peer
        assert peer is not None
        if not local:
            self._fail(peer)
        elif peer.state == "connected":
            self.exp.alternatives.add(alt.LOCAL_BREAK)
            if peer.sq:  # a send waiting for our receive: the transport's retries run out
                self._complete(peer.sq.pop(0), {S.CONNECTION_RESET})
                self._fail(peer)
            else:
                peer.dead_peer = True

    def _known_in_process(self, s: MSock, value: KeyValue) -> bool:
        """A handle of another open socket of the same process (the verbs provider refuses it itself)."""
        return any(t.live("memory", value) is not None for t in self.socks.values()
                   if t.proc == s.proc and t is not s and t.state != "closed")

    def _local(self, s: MSock, entries: list[tuple[View, KeyValue]], need: int) -> tuple[str, list[MReg]]:
        """"ok", "refused" (the provider refuses the entries at once: R1, R3, R6-R8) or "nic" (a source's
        handle unknown to the process, on an idle send queue: only the NIC checks it), and the registrations
        the good entries use."""
        regs: list[MReg] = []
        nic = False
        for (pi, bi, off, n), value in entries:
            reg = s.live("memory", value)
            if pi != s.proc:
                return "refused", []
            if reg is None:
                if need == R and not s.sq and self._on(alt.LKEY_STATUS) and not self._known_in_process(s, value):
                    nic = True
                    continue
                return "refused", []
            rpi, rbi, roff, rn = reg.view
            if not reg.access & need or (pi, bi) != (rpi, rbi) or off < roff or off + n > roff + rn:
                return "refused", []
            regs.append(reg)
        return ("nic" if nic else "ok"), regs

    def _window_buffer(self, desc: bytes) -> tuple[int, int] | None:
        for reg in self.regs.values():
            if reg.kind == "rdma" and reg.key == desc:
                return reg.view[0], reg.view[1]
        return None

    # -- a transfer step --------------------------------------------------------------------------

    def transfer(self, step: Transfer) -> None:
        ex = self.exp
        s = self.socks.get(step.sock)
        entries = [(view, self.value(key)) for view, key in step.entries]
        rdma = step.kind.startswith("rdma")
        desc = self.value(step.desc) if step.desc is not None else b""
        if s is None or desc is None or any(value is None for _, value in entries):
            ex.skip = "it names a socket, handle or descriptor no step of this sequence made"
            return
        pairs = [(view, value) for view, value in entries if value is not None]
        assert s.peer is not None and isinstance(desc, bytes)
        ex.touched.pending |= {s.id, s.peer.id}
        views = [view for view, _ in pairs]
        if step.kind == "rdma_write":
            window = self._window_buffer(desc)
            ex.touched.buffers |= {window} if window else set()
        elif step.kind != "send":
            ex.touched.buffers |= {(v[0], v[1]) for v in views}
        faults = []
        if s.state == "closed":
            faults.append("socket")
        elif s.state != "connected":
            faults.append("connected")
        if len(pairs) > MAX_SGE:
            faults.append("list.count")
        if rdma and len(desc) != self.traits.desc_size:
            faults.append("descriptor")
        if s.state != "closed" and any(v[0] != s.proc for v in views):  # R5: another process's memory
            faults.append("entry.owner")
        if step.kind == "rdma_read" and s.node in self.traits.no_read:  # optional (section 2): refused, whatever else
            faults.append("read")
        # A read into several buffers where the device may take one (rdma-read-one-buffer): one more fault where
        # the call has others (a provider outside the reference order may answer any of them), the answer of a
        # provider that follows the reference order, else a refusal the call may make instead (below).
        many = step.kind == "rdma_read" and self._on(alt.READ_ONE_BUFFER) and sum(1 for v in views if v[3]) > 1
        # One buffer and zero-length entries beside it: a device that counts entries refuses it, one that drops
        # the empty ones (they move nothing) reads into the one; both are legal.
        loose = step.kind == "rdma_read" and self._on(alt.READ_ONE_BUFFER) and not many and len(views) > 1
        if many and "read" not in faults and (self.traits.reference_order or set(faults) - {"list.count"}):
            if not faults:
                ex.alternatives.add(alt.READ_ONE_BUFFER)
            faults.append("device")
        if faults == ["list.count"] and not self.traits.reference_order:
            # How many entries a provider takes is its own (section 4): only the reference order fixes MAX_SGE.
            ex.skip = f"more than {MAX_SGE} entries, which a provider outside the reference order may take"
            return
        if faults:
            ex.raises = self._refusal(step.kind, faults)
            if ("socket" not in faults and not self.traits.reference_order and self._on(alt.REFUSED_AT_CALL)
                    and self._local(s, pairs, R if step.kind in ("rdma_write", "send") else W)[0] != "ok"):
                # A provider that checks the entries itself may find their fault first: section 4 leaves the
                # order to it (only a socket it does not hold comes before everything).
                ex.raises |= BAD_ENTRY_CODES
            return
        if step.kind == "send" and not self.traits.sends_wait and s.peer.state == "connected" and not s.peer.recvs:
            # Without send_waits (iWARP: no receiver-not-ready flow control) such a send ends the connection,
            # racing the next step; a WSD switch never sends without a credit for a posted receive. Both
            # sides of a differential run skip it (the sequence goes on without it).
            ex.skip = "a send the peer has posted no receive for, on a backend without send_waits"
            return
        ex.returns = "op"
        op = MOp(step.op, step.kind, s, views, [], desc=desc, offset=step.offset)
        write_like = step.kind in ("rdma_write", "send")
        verdict, regs = self._local(s, pairs, R if write_like else W)
        if many or loose:
            self._may_refuse(alt.READ_ONE_BUFFER, frozenset({"WSAEINVAL"}), step.op)  # its device reads into one buffer
        if verdict != "ok" and self._on(alt.REFUSED_AT_CALL):
            self._may_refuse(alt.REFUSED_AT_CALL, BAD_ENTRY_CODES, step.op)  # its provider checks the entries itself
        if ex.instead and step.op in self.refused_at_call:  # a replay: as the backend answered
            self._take_refusal(self.refused_at_call[step.op])
            return
        if rdma and not pairs and self._on(alt.ZERO_RDMA):
            self._zero_rdma(op)
        elif verdict == "refused":  # R1, R3, R6, R7, R8 on the local side
            self._complete(op, {S.LOCAL_PROTECTION})
            self._break(s, local=self._on(alt.LOCAL_BREAK))
        else:
            op.nic_bad, op.regs = verdict == "nic", regs
            for reg in regs:
                reg.users += 1
            self._post(op)

    def _zero_rdma(self, op: MOp) -> None:
        """Nothing to move: the verbs provider completes it at once, checked against the stated range."""
        self.exp.alternatives.add(alt.ZERO_RDMA)
        stated = next((r.view[3] for r in self.regs.values() if r.kind == "rdma" and r.key == op.desc), None)
        if stated is not None and 0 <= op.offset <= stated:
            self._complete(op, {S.SUCCESS})
        else:
            self._complete(op, {S.ACCESS_VIOLATION})  # refused by the initiator's provider itself
            self._break(op.sock, local=True)

    def _post(self, op: MOp) -> None:
        s = op.sock
        if op.kind == "recv":
            s.recvs.append(op)
            self.ops[op.id] = op
            assert s.peer is not None
            self._drain(s.peer)
            return
        if op.kind != "send" and not (s.sq and self._on(alt.RC_QUEUE_ORDER)):
            self._run_rdma(op)
            return
        if op.kind != "send":
            self.exp.alternatives.add(alt.RC_QUEUE_ORDER)
        s.sq.append(op)
        self.ops[op.id] = op
        self._drain(s)

    def _drain(self, s: MSock) -> None:
        """Run ``s``'s send queue from its head while it can: a send needs a receive of the peer."""
        while s.sq and s.state == "connected":
            head = s.sq[0]
            if head.kind != "send":
                self._run_rdma(s.sq.pop(0))
                continue
            if s.dead_peer:
                s.sq.pop(0)
                self._complete(head, {S.LOCAL_PROTECTION, S.REMOTE_OPERATION} if head.nic_bad
                               else {S.CONNECTION_RESET})
                self._fail(s)
                return
            if head.nic_bad:  # the NIC fails to read the source
                s.sq.pop(0)
                self.exp.alternatives.add(alt.LKEY_STATUS)
                self._complete(head, {S.LOCAL_PROTECTION, S.REMOTE_OPERATION})
                self._break(s, local=self._on(alt.LOCAL_BREAK))
                return
            peer = s.peer
            assert peer is not None
            if not peer.recvs or peer.state != "connected":
                return
            s.sq.pop(0)
            self._deliver(head, peer.recvs.pop(0))

    def _run_rdma(self, op: MOp) -> None:
        s, peer = op.sock, op.sock.peer
        assert peer is not None
        self.ops.pop(op.id, None)
        write = op.kind == "rdma_write"
        if s.dead_peer:  # the request goes out to a QP in error: no answer, the retries run out
            self._complete(op, {S.LOCAL_PROTECTION, S.REMOTE_OPERATION} if op.nic_bad else {S.CONNECTION_RESET})
            self._fail(s)
            return
        # The responder checks the window: bound to this connection (R2), registered (R3), the right
        # access (R6, R7) and in bounds (R8).
        win = peer.live("rdma", op.desc)
        remote_ok = (win is not None and bool(win.access & (W if write else R)) and op.offset >= 0
                     and op.offset + op.nbytes <= win.view[3])
        if op.nic_bad and self._on(alt.STATED_FIRST) and not self._within_stated(op):
            self.exp.alternatives.add(alt.STATED_FIRST)  # the provider's own check, before the NIC's
            self._complete(op, {S.ACCESS_VIOLATION})
            self._break(s)
            return
        if op.nic_bad:  # the NIC fails to read the source before anything leaves
            self.exp.alternatives.add(alt.LKEY_STATUS)
            self._complete(op, {S.LOCAL_PROTECTION, S.REMOTE_OPERATION})
            self._break(s, local=self._on(alt.LOCAL_BREAK))
            return
        if not remote_ok:
            self._complete(op, self._refused(S.ACCESS_VIOLATION))
            self._break(s)
            return
        assert win is not None
        pi, bi, off, _ = win.view
        remote = [(pi, bi, off + op.offset, op.nbytes)]
        if write:
            self._scatter(remote, self._gather(op.views))
        else:
            self._scatter(op.views, self._gather(remote))
        self._complete(op, {S.SUCCESS}, op.nbytes)

    def _within_stated(self, op: MOp) -> bool:
        """``op`` lies inside the range and has the access that its descriptor states (whatever became of it)."""
        need = W if op.kind == "rdma_write" else R
        return any(r.kind == "rdma" and r.key == op.desc and r.access & need
                   and 0 <= op.offset <= r.view[3] - op.nbytes for r in self.regs.values())

    def _deliver(self, send: MOp, recv: MOp) -> None:
        self.ops.pop(send.id, None)
        self.ops.pop(recv.id, None)
        self.exp.touched.buffers |= {(v[0], v[1]) for v in recv.views}
        if send.nbytes > recv.nbytes:
            statuses = {S.LOCAL_LENGTH}
            if self._on(alt.SHORT_RECEIVE):
                self.exp.alternatives.add(alt.SHORT_RECEIVE)
                statuses.add(S.REMOTE_OPERATION)
            self._complete(recv, statuses)
            self._complete(send, self._refused(S.REMOTE_OPERATION))
            self._break(recv.sock)
            return
        self._scatter(recv.views, self._gather(send.views))
        self._complete(recv, {S.SUCCESS}, send.nbytes)
        self._complete(send, {S.SUCCESS}, send.nbytes)

    def value(self, key: object) -> KeyValue | None:
        """Defined by the model (reference.py): a Key's value in this run, None if no step made it."""
        raise NotImplementedError
