"""The reference model: what a provider must answer to each step, written from CONTRACT.md, not from a provider.

``Model.apply(step)`` returns what it expects (state.Expect: an error code at the call, or the call's
result and the operations that complete, with statuses and byte counts) and moves the model on, as
if the backend answered so; ``bind`` tells it the key a register call returned. The model knows the
live registrations with their reference counts and users (R3, R11-R13), every socket's state (R4),
the pending operations and every byte of every buffer, so a checker compares all of it after a step.

Where the contract leaves the choice open (a call with several faults) the model accepts any of the
codes, or, of a backend that declares ``reference_order``, the first fault's in pytest_san.spi.checks.ORDER;
where a backend takes a documented alternative (alternatives.py) it expects that instead.
"""

from __future__ import annotations

from ..spi.contract import SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE, VALID_ACCESS, Status
from . import alternatives as alt
from .kinds import kind_of, register_call
from .state import Expect, KeyValue, MReg, MSock, Traits
from .steps import (
    Close,
    Deregister,
    Getsockopt,
    Key,
    Plan,
    Reconnect,
    Register,
    Scribble,
    Step,
    initial_bytes,
    pattern,
)
from .transfers import TransferModel


class Model(TransferModel):
    """One sequence's expectations, on a backend with ``traits``."""

    def __init__(self, plan: Plan, traits: Traits) -> None:
        super().__init__(traits)
        self.plan = plan
        self.data = {(p, b): bytearray(initial_bytes(p, b)) for p in range(len(plan.nodes)) for b in range(2)}
        self.slots: list[tuple[MSock, MSock]] = [self._connect(i, (2 * i, 2 * i + 1)) for i in range(len(plan.slots))]

    def _connect(self, slot: int, ids: tuple[int, int]) -> tuple[MSock, MSock]:
        pa, pb = self.plan.slots[slot]
        a = MSock(ids[0], pa, self.plan.nodes[pa], slot)
        b = MSock(ids[1], pb, self.plan.nodes[pb], slot)
        a.peer, b.peer = b, a
        self.socks[a.id], self.socks[b.id] = a, b
        return a, b

    def value(self, key: object) -> KeyValue | None:
        """What ``key`` is in this run: the value its register step returned (malformed by ``cut``), or junk."""
        assert key is None or isinstance(key, Key)
        if key is None:
            return None
        if key.reg is None:
            return key.junk
        found = self.keys.get(key.reg)
        if found is None or not key.cut or not isinstance(found, bytes):
            return found
        return found[:-key.cut] if key.cut > 0 else found + b"\0" * -key.cut

    # -- a step --------------------------------------------------------------------------------

    def apply(self, step: Step) -> Expect:
        """What ``step`` must answer; the model moves on as if it did (the call's answer, given to ``answered``,
        may move it back: a refusal at the call the step allowed instead)."""
        self.exp = Expect()
        self._undo = None
        kind_of(step).apply(self, step)
        return self.exp

    # -- each type of step's transition (kinds.py dispatches to them) ------------------------------

    def scribble(self, step: Scribble) -> None:
        """The application writes its own memory: nothing for the provider to say."""
        pi, bi, off, n = step.view
        self.data[pi, bi][off:off + n] = pattern(step.seed, n)
        self.exp.touched.buffers.add((pi, bi))

    def close(self, step: Close) -> None:
        s = self.socks.get(step.sock)
        if s is None:
            self.exp.skip = "it names a socket no step of this sequence made"
        else:
            self._close(s)

    def getsockopt(self, step: Getsockopt) -> None:
        """Not an open socket of that provider (closed by it, or its peer's provider asked): WSAENOTSOCK; then an
        option that is not one of the two ints: WSAEINVAL; else an integer. It changes nothing."""
        s = self.socks.get(step.sock)
        if s is None:
            self.exp.skip = "it names a socket no step of this sequence made"
        elif s.state == "closed" or step.foreign:
            self.exp.raises = frozenset({"WSAENOTSOCK"})
        elif type(step.option) is not int or step.option not in (SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE):
            self.exp.raises = frozenset({"WSAEINVAL"})
        else:
            self.exp.returns = "value"

    def register(self, step: Register) -> None:
        ex = self.exp
        s = self.socks.get(step.sock)
        if s is None:
            ex.skip = "it names a socket no step of this sequence made"
            return
        ex.touched.registrations.add(s.id)
        faults = []
        if s.state == "closed":
            faults.append("socket")
        elif s.state != "connected":
            faults.append("connected")
        if step.view[0] != s.proc:  # R5: never another process's memory
            faults.append("buffer.owner")  # the ids of pytest_san.spi.checks.CHECKS
        if step.shape == "empty":
            faults.append("buffer.empty")
        elif step.shape != "range":  # one byte past its buffer, or unmapped
            faults.append("buffer.mapped")
        if step.access not in VALID_ACCESS:
            faults.append("access")
        if step.kind == "rdma" and step.size is not None and step.size < self.traits.desc_size:
            faults.append("descriptor_size.small")  # the descriptor-size probe (R14)
        if faults:
            ex.raises = self._refusal(register_call(step.kind), faults)
            return
        ex.returns = "handle" if step.kind == "memory" else "descriptor"
        same = s.same(step.kind, step.view, step.access)
        if same:  # R13: the same registration, one more reference (or a new key: see bind)
            reg = same[0]
            reg.refs += 1
            reg.calls += 1
            ex.same = reg
            ex.touched.nodes.add(s.node)  # R12: the proxy may pin again for this call
            assert reg.key is not None
            self.keys[step.reg] = reg.key
        else:
            reg = MReg(step.kind, step.view, step.access, s, step.reg)
            s.regs[step.reg] = reg
            ex.fresh = reg
            ex.touched.nodes.add(s.node)  # R12: the proxy pins one more allocation
        self.regs[step.reg] = reg

    def bind(self, step: Register, key: KeyValue) -> None:
        """A register call returned ``key``: later steps naming ``step.reg`` use it.

        R13 lets a provider answer a registration of a range already registered with the same key (one more
        reference) or a new one: then it is a registration of its own, released by its own deregistration."""
        reg = self.regs[step.reg]
        if reg.key is None:
            reg.key = key
        elif reg.key != key:
            s = reg.sock
            reg.refs -= 1
            reg.calls -= 1
            other = next((r for r in s.same(reg.kind, reg.view, reg.access) if r.key == key), None)
            if other is None:
                other = MReg(reg.kind, reg.view, reg.access, s, step.reg, key=key)
                s.regs[step.reg] = other
                self.exp.touched.nodes.add(s.node)  # it may pin again, or share the pages (live_registrations)
            else:
                other.refs += 1
                other.calls += 1
            self.regs[step.reg] = reg = other
        self.keys[step.reg] = key

    def deregister(self, step: Deregister) -> None:
        ex = self.exp
        s = self.socks.get(step.sock)
        value = self.value(step.key)
        if s is None or value is None:
            ex.skip = "it names a socket or handle no step of this sequence made"
            return
        owner = self.regs[step.key.reg].sock if step.key.reg is not None else s
        ex.touched.registrations |= {s.id, owner.id}  # another socket's key must not touch that socket (R1)
        if s.state == "closed":
            ex.raises = frozenset({"WSAENOTSOCK"})
            return
        reg = s.live(step.kind, value)
        if reg is None or reg.users:  # R3, R13: unknown, or in use by a pending operation
            ex.raises = frozenset({"WSAEINVAL"})
            return
        reg.refs -= 1
        ex.touched.nodes.add(s.node)  # R12: the proxy frees its pins (or, pinned per call, this call's)
        if not reg.refs:
            reg.live = False
            del s.regs[reg.rid]
            if reg.kind == "rdma" and isinstance(reg.key, bytes):
                s.released.add(reg.key)  # R3: never handed out again on this connection

    def _close(self, s: MSock) -> None:
        ex = self.exp
        assert s.peer is not None
        ex.touched.registrations.add(s.id)
        if s.state == "closed":
            ex.raises = frozenset({"WSAENOTSOCK"})
            return
        if s.regs:
            ex.touched.nodes.add(s.node)
        if s.sq and s.sq[0].kind == "send" and self._on(alt.RNR_BOUNDED):
            # It may have given up waiting a moment before the close: the same end either way.
            self._complete(s.sq.pop(0), {Status.ABORTED, Status.CONNECTION_RESET})
        self._flush(s, {Status.ABORTED})  # R11: pending operations complete ABORTED
        peer = s.peer
        if peer.state in ("connected", "error"):
            if peer.state == "connected" and peer.sq and peer.sq[0].kind == "send" and self._on(alt.RNR_BOUNDED):
                # The peer's waiting send may give up just before it learns of the close: CONNECTION_RESET
                # either way, but then its other operations flush as its own error's (ABORTED).
                self._complete(peer.sq.pop(0), {Status.CONNECTION_RESET})
                for op in peer.pending():
                    self._complete(op, {Status.CONNECTION_RESET, Status.ABORTED})
                peer.recvs.clear()
                peer.sq.clear()
            peer.state = "disconnected"
            ex.touched.states.add(peer.id)
            self._flush(peer, {Status.CONNECTION_RESET})
        s.state = "closed"
        ex.touched.states.add(s.id)
        for reg in s.regs.values():  # R11: the provider released every registration
            reg.live = False
        s.regs.clear()

    def reconnect(self, step: Reconnect) -> None:
        if any(i in self.socks for i in step.socks):
            self.exp.skip = "its sockets exist already"
            return
        for s in self.slots[step.slot]:
            if s.state != "closed":
                self._close(s)
        self.slots[step.slot] = self._connect(step.slot, step.socks)
        self.exp.touched.states |= set(step.socks)

    def gave_up(self, sock: int) -> Expect:
        """The send waiting at the head of ``sock``'s queue ended CONNECTION_RESET on its own (rxe's
        retransmission timer ran out during RNR retries): only this end goes to error."""
        self.exp = Expect()
        self._undo = None  # the step before can no longer be undone: its refusal at the call is a divergence
        s = self.socks[sock]
        self.exp.alternatives.add(alt.RNR_BOUNDED)
        self._complete(s.sq.pop(0), {Status.CONNECTION_RESET})
        self._break(s, local=True)
        return self.exp

    def waiting_sends(self) -> list[tuple[int, int]]:
        """(socket, op) of each send waiting for the peer's receive at the head of a connected socket's queue."""
        return [(s.id, s.sq[0].id) for s in self.socks.values()
                if s.state == "connected" and s.sq and s.sq[0].kind == "send"]

    # -- what a checker compares -----------------------------------------------------------------

    def closes(self, step: Reconnect) -> list[int]:
        """The sockets a Reconnect step closes (call before ``apply``)."""
        return [s.id for s in self.slots[step.slot] if s.state != "closed"]

    def live_registrations(self, node: int) -> tuple[int, int]:
        """R12: the pins the proxy may hold for the live registrations: (at least, at most). At least one per
        live distinct range (none missing while one is live); at most one per register call each live
        registration answered (a provider may pin once per call, or once per distinct registration, or share
        the pages of a range it answered with two keys); none for a registration released (no pin outlives the
        last registration that needed it)."""
        socks = [s for s in self.socks.values() if s.node == node]
        ranges = sum(len({(r.kind, r.view, r.access) for r in s.regs.values()}) for s in socks)
        return ranges, sum(r.calls for s in socks for r in s.regs.values())

    def open_sockets(self) -> list[MSock]:
        return [s for s in self.socks.values() if s.state != "closed"]

    def close_all(self) -> list[tuple[int, Expect]]:
        """Close every socket still open (the end of a sequence), node by node (a lab makes each node's closes in
        one round trip): (socket, expectation) for each."""
        out = []
        for s in sorted(self.open_sockets(), key=lambda sock: (sock.node, sock.id)):
            self.exp = Expect()
            self._close(s)
            out.append((s.id, self.exp))
        return out
