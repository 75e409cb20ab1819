"""Stateful property test of the emulated provider against an independent reference model.

Hypothesis drives random sequences of SPI calls on a few raw connected socket pairs
(``backend.connect_sockets``, no switch): register_memory / register_rdma_memory (sub-ranges of a
few buffers; empty, overrunning, unmapped and other-process ranges; valid and invalid access
flags; the descriptor-size probe), deregistration (live, stale, foreign, junk, malformed, in
use), rdma_write / rdma_read (in and out of bounds, wrong access, descriptors of other
connections, our own or stale descriptors, malformed descriptors, too many buffers), send/recv
pairs (including a receive too small), scribbles by the application on its own memory, and
close_socket (with operations pending, and twice).

The model below is written from CONTRACT.md (R1-R8, R11-R14) and the emulator's documented
semantics, not from its code. It knows which registrations are live with which reference count
and how many pending operations use them, the state of every socket (connected / error /
disconnected / closed), the operations still pending, the expected outcome of every call (an
error code at the call, or the completion status and byte count) and the expected bytes of
every application buffer, so the guard bytes around every target are checked after every step.
A send waiting for its receive reads its source when it is delivered, as an RC QP re-reads it
on RNR retry. Where the contract leaves the choice between several error codes open (a call
with several faults), any of them is accepted.

Invariants after every step: ``registrations(socket)`` equals the model (kind, range, access,
refs), the proxy's live allocation count equals the live distinct registrations of its node
(R12), every buffer holds exactly the model's bytes, pending operations are still pending.
At teardown every socket is closed and ``backend.leaks() == []`` (R11).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pytest_san import Access, SanError, Status, WsaError
from pytest_san.emulator import EmulatorBackend
from pytest_san.emulator.provider import MAX_SGE
from tests.support.fuzz_spi import weighted

E = WsaError
BUFFER_SIZES = (64, 40)  # every process gets one buffer of each size
# Processes: (node index, a second process spawned on that node?)
PROCESSES = ((0, False), (0, True), (1, False), (2, False))
# Connection slots: (process index, process index). Slots 0 and 1 join the same two processes
# (R2: another socket between the same hosts); slot 2 joins another process to a third host.
SLOTS = ((0, 2), (0, 2), (1, 3))
R, W, RW = int(Access.READ), int(Access.WRITE), int(Access.READWRITE)  # plain ints: the model is hot
VALID_ACCESS = (R, W, RW)
INVALID_ACCESS = (0, 4, 7, -1)
JUNK_HANDLES = (0, 1, 0x7FFF_FFFF)

# Every choice inside a rule comes from one seeded Random per step: a single Hypothesis choice
# (the seed) instead of a dozen ``data.draw`` calls, which would make the run 2-3x slower.
# Hypothesis still shrinks the sequence of steps (and the seeds); a failure prints the seeds,
# and the assertion messages say what was called with what.
RND = st.randoms(use_true_random=True)
# The other rule arguments also order the rules: Hypothesis favours the first rule (fewest
# arguments, then name), which should be register or transfer (taking ``rnd`` alone), not close.
KEY_SOURCES = st.sampled_from(["live", "live", "seen", "junk"])
TRANSFERS = ("rdma_write", "rdma_read", "send", "recv")
QUIET_STEPS = 8  # close waits this many steps after the last one
SGE_COUNTS = (1, 1, 1, 1, 2, 2, 2, 3, MAX_SGE, MAX_SGE + 1)

View = tuple[int, int, int, int]  # (process index, buffer index, offset, length)


@dataclasses.dataclass(eq=False)
class MReg:
    """A live registration in the model."""

    kind: str  # "memory" | "rdma"
    view: View
    access: int
    key: Any  # the handle (int) or descriptor (bytes) the provider returned
    refs: int = 1
    users: int = 0  # pending operations using it


@dataclasses.dataclass(eq=False)
class MSock:
    name: str
    sock: Any
    proc: int
    node: int
    provider: Any
    state: str = "connected"  # connected | error | disconnected | closed
    peer: MSock | None = None
    regs: dict[tuple[str, View, int], MReg] = dataclasses.field(default_factory=dict)
    recvs: list[MOp] = dataclasses.field(default_factory=list)  # posted receives not yet matched
    sends: list[MOp] = dataclasses.field(default_factory=list)  # sends waiting for a peer receive

    def live(self, kind: str, key: Any) -> MReg | None:
        for reg in self.regs.values():
            if reg.kind == kind and type(reg.key) is type(key) and reg.key == key:
                return reg
        return None

    def has(self, kind: str, need: int) -> bool:
        return any(r.kind == kind and r.access & need for r in self.regs.values())

    def __repr__(self) -> str:
        return f"{self.name}({self.state})"


@dataclasses.dataclass(eq=False)
class MOp:
    kind: str
    op: Any
    sock: MSock
    views: list[View]
    regs: list[MReg]

    @property
    def nbytes(self) -> int:
        return sum(v[3] for v in self.views)


def _pattern(seed: int, n: int) -> bytes:
    """Distinct, never-zero bytes, so a zero fill or a misplaced copy shows."""
    return bytes((seed * 37 + i * 7) % 251 + 1 for i in range(n))


def _mostly(rnd: random.Random, p: float = 0.9) -> bool:
    return rnd.random() < p




# What a connected socket needs for an operation to be able to succeed.
USEFUL: dict[str, Callable[[MSock], bool]] = {
    # At most a few operations left waiting for the other side, so that most of them meet.
    "send": lambda s: s.has("memory", R) and len(s.sends) < 3,
    "recv": lambda s: s.has("memory", W) and len(s.recvs) < 3,
    "rdma_write": lambda s: s.has("memory", R) and s.peer is not None and s.peer.has("rdma", W),
    "rdma_read": lambda s: s.has("memory", W) and s.peer is not None and s.peer.has("rdma", R),
    "register": lambda s: True,
}


class SanMachine(RuleBasedStateMachine):
    """Random SPI sequences on the emulator, checked against the model after every step."""

    make_backend: Callable[[], Any] = EmulatorBackend

    def __init__(self) -> None:
        super().__init__()
        self.backend = type(self).make_backend()
        nodes = self.backend.nodes
        self.procs = [nodes[n].spawn_process() if spawn else nodes[n].default_process for n, spawn in PROCESSES]
        self.nodes = [n for n, _ in PROCESSES]
        self.bufs = [[p.alloc(size) for size in BUFFER_SIZES] for p in self.procs]
        self.model: dict[tuple[int, int], bytearray] = {}
        for pi, bufs in enumerate(self.bufs):
            for bi, buf in enumerate(bufs):
                data = _pattern(pi * 2 + bi, buf.length)
                buf.write(data)
                self.model[pi, bi] = bytearray(data)
        self.socks: list[MSock] = []  # every socket ever opened, closed ones included
        self.slots: list[tuple[MSock, MSock]] = [self._connect(i) for i in range(len(SLOTS))]
        self.handles: list[int] = list(JUNK_HANDLES)  # every handle seen, plus junk
        self.descs: list[bytes] = []  # every descriptor seen
        self.quiet = 0  # steps since the last close: connections live a while
        self.moved = False  # bytes moved since the last scribble
        # The descriptor-size probe (R14) tells the model how big a descriptor is.
        a = self.slots[0][0]
        with pytest.raises(SanError) as info:
            a.provider.register_rdma_memory(a.sock, self.bufs[a.proc][0], Access.READ, descriptor_size=0)
        assert info.value.code is E.WSAEFAULT, info.value
        assert isinstance(info.value.required_size, int) and info.value.required_size > 0, info.value
        self.desc_size: int = info.value.required_size

    # -- helpers ------------------------------------------------------------------------------

    def _connect(self, slot: int) -> tuple[MSock, MSock]:
        pa, pb = SLOTS[slot]
        sa, sb = self.backend.connect_sockets(self.procs[pa], self.procs[pb])
        n = len(self.socks)
        a = MSock(f"s{n}", sa, pa, self.nodes[pa], self.procs[pa].node.provider)
        b = MSock(f"s{n + 1}", sb, pb, self.nodes[pb], self.procs[pb].node.provider)
        a.peer, b.peer = b, a
        self.socks += [a, b]
        return a, b

    def _current(self) -> list[MSock]:
        return [s for pair in self.slots for s in pair]

    def _useful(self, op: str) -> list[MSock]:
        """Connected sockets on which ``op`` can succeed (the rules' preconditions)."""
        fit = USEFUL[op]
        return [s for s in self._current() if s.state == "connected" and fit(s)]

    def _pick_socket(self, rnd: random.Random, fit: list[MSock],
                     prefer: Callable[[MSock], bool] | None = None) -> MSock:
        """Mostly one of ``fit`` (``prefer``-ed ones first), sometimes any socket at all.

        Slot 0 gets most of the traffic, so that one connection gathers the registrations on both
        ends that transfers need; the other slots mostly lend their handles and descriptors.
        """
        if fit and _mostly(rnd, 0.95):
            best = [s for s in fit if prefer(s)] if prefer else []
            fit = best if best and _mostly(rnd, 0.7) else fit
            return weighted(rnd, fit, [8 if s in self.slots[0] else 1 for s in fit])
        return rnd.choice(self._current())

    def _buffer(self, view: View) -> Any:
        pi, bi, off, n = view
        return self.bufs[pi][bi].view(off, n)

    def _address(self, view: View) -> int:
        return int(self.bufs[view[0]][view[1]].address) + view[2]

    @staticmethod
    def _sub_view(rnd: random.Random, within: View, budget: int | None = None, large: bool = False) -> View:
        """A non-empty view inside ``within``, at most ``budget`` long; ``large``: mostly all of it."""
        pi, bi, off, n = within
        if budget is not None and budget < n:
            n = max(1, budget)
        if large and _mostly(rnd, 0.7):
            return pi, bi, off, n
        o = rnd.randrange(n)
        return pi, bi, off + o, rnd.randint(1, n - o)

    def _any_view(self, rnd: random.Random, proc: int) -> View:
        """A non-empty view of one of the buffers, mostly of process ``proc``."""
        pi = proc if _mostly(rnd, 0.95) else rnd.randrange(len(self.procs))
        bi = rnd.randrange(len(BUFFER_SIZES))
        return self._sub_view(rnd, (pi, bi, 0, BUFFER_SIZES[bi]))

    def _complete(self, mop: MOp, status: Status, nbytes: int | None = None) -> None:
        for reg in mop.regs:
            reg.users -= 1
        mop.regs = []
        assert mop.op.done(), f"{mop.kind} on {mop.sock.name} should have completed {status.name}"
        done = mop.op.wait(0)
        assert done.status is status, f"{mop.kind} on {mop.sock.name}: {done}, expected {status.name}"
        if nbytes is not None:
            assert done.bytes == nbytes, f"{mop.kind} on {mop.sock.name}: {done}, expected {nbytes} bytes"

    def _flush(self, s: MSock, status: Status) -> None:
        for mop in [*s.recvs, *s.sends]:
            self._complete(mop, status)
        s.recvs.clear()
        s.sends.clear()

    def _break(self, s: MSock) -> None:
        """An error completion moved the connection to error: both ends flushed (ABORTED)."""
        for end in (s, s.peer):
            assert end is not None
            if end.state == "connected":
                end.state = "error"
                self._flush(end, Status.ABORTED)

    def _gather(self, views: Sequence[View]) -> bytes:
        return b"".join(bytes(self.model[v[0], v[1]][v[2]:v[2] + v[3]]) for v in views)

    def _scatter(self, views: Sequence[View], payload: bytes) -> None:
        pos = 0
        for pi, bi, off, n in views:
            n = min(n, len(payload) - pos)
            if n <= 0:
                break
            self.model[pi, bi][off:off + n] = payload[pos:pos + n]
            pos += n

    def _local_ok(self, s: MSock, pairs: Sequence[tuple[View, int]], need: int) -> list[MReg] | None:
        """The registrations a (view, handle) list uses, or None when an HCA would refuse it (R1, R3, R6-R8)."""
        regs = []
        for (pi, bi, off, n), handle in pairs:
            reg = s.live("memory", handle)
            if reg is None or not reg.access & need or pi != s.proc:
                return None
            rpi, rbi, roff, rn = reg.view
            if (pi, bi) != (rpi, rbi) or off < roff or off + n > roff + rn:
                return None
            regs.append(reg)
        return regs

    def _pick_pairs(self, rnd: random.Random, s: MSock, count: int, need: int, *, budget: int | None = None,
                    large: bool = False) -> list[tuple[View, int]]:
        """``count`` (view, handle) pairs: mostly inside a registration of ``s`` with ``need`` access."""
        mine = [r for r in s.regs.values() if r.kind == "memory"]
        fit = [r for r in mine if r.access & need]
        pairs = []
        for _ in range(count):
            if fit and _mostly(rnd, 0.97):
                reg = rnd.choice(fit)
                pairs.append((self._sub_view(rnd, reg.view, budget, large), reg.key))
            elif mine and _mostly(rnd, 0.5):  # wrong access (R6, R7) or outside the range (R8)
                reg = rnd.choice(mine)
                pairs.append((self._any_view(rnd, s.proc) if _mostly(rnd, 0.5) else reg.view, reg.key))
            else:  # another socket's or process's handle, a stale or junk one (R1, R3)
                pairs.append((self._any_view(rnd, s.proc), rnd.choice(self.handles)))
            if budget is not None:
                budget = max(1, budget - pairs[-1][0][3])
        return pairs

    def _post_errors(self, s: MSock, count: int) -> set[WsaError]:
        errors: set[WsaError] = set()
        if s.state == "closed":
            errors |= {E.WSAENOTSOCK, E.WSAENOTCONN}
        elif s.state != "connected":
            errors.add(E.WSAENOTCONN)
        if count > MAX_SGE:
            errors.add(E.WSAEINVAL)
        return errors

    @staticmethod
    def _expect_raise(errors: set[WsaError], call: Callable[[], Any], what: str) -> SanError:
        try:
            result = call()
        except SanError as exc:
            assert exc.code in errors, f"{what}: {exc}, expected one of {sorted(e.name for e in errors)}"
            return exc
        raise AssertionError(f"{what}: returned {result!r}, expected one of {sorted(e.name for e in errors)}")

    # -- rules: registration ------------------------------------------------------------------

    @rule(rnd=RND, kind=st.sampled_from(["memory", "rdma"]))
    def register(self, rnd: random.Random, kind: str) -> None:
        """register_memory or register_rdma_memory."""
        self._register(rnd, kind)

    def _register(self, rnd: random.Random, kind: str) -> None:
        s = self._pick_socket(rnd, self._useful("register"))
        access = rnd.choice(VALID_ACCESS if _mostly(rnd, 0.93) else INVALID_ACCESS)
        view = self._any_view(rnd, s.proc)
        pi, bi, off, _ = view
        base = self.bufs[pi][bi]
        shape = "range" if _mostly(rnd, 0.95) else rnd.choice(["empty", "overrun", "unmapped"])
        if shape == "range":
            buffer = self._buffer(view)
        elif shape == "empty":
            buffer = base.view(off, 0)
        elif shape == "overrun":
            buffer = self.procs[pi].buffer_at(base.address + off, base.length - off + 1)
        else:  # inside the guard page after the mapping
            buffer = self.procs[pi].buffer_at(base.address + base.length + 4096, 16)
        size = None
        if kind == "rdma" and not _mostly(rnd, 0.8):
            size = rnd.choice([self.desc_size, self.desc_size + 8, 0, self.desc_size - 1])
        errors: set[WsaError] = set()
        if s.state == "closed":
            errors |= {E.WSAENOTSOCK, E.WSAENOTCONN}
        elif s.state != "connected":
            errors.add(E.WSAENOTCONN)
        if access not in VALID_ACCESS:
            errors.add(E.WSAEINVAL)
        small = size is not None and size < self.desc_size
        if small:
            errors.add(E.WSAEFAULT)
        if shape != "range" or pi != s.proc:  # R5: never another process's memory
            errors.add(E.WSAEFAULT)
        flags = Access(access) if access in VALID_ACCESS else access
        what = f"register {kind} {view} {shape} access={access} size={size} on {s}"
        if kind == "memory":
            def call() -> Any:
                return s.provider.register_memory(s.sock, buffer, flags)
        else:
            def call() -> Any:
                return s.provider.register_rdma_memory(s.sock, buffer, flags, size)
        if errors:
            exc = self._expect_raise(errors, call, what)
            if small and errors == {E.WSAEFAULT} and shape == "range" and pi == s.proc:
                assert exc.required_size == self.desc_size, f"{what}: {exc} (R14 probe)"
            return
        key = call()
        if kind == "rdma":
            assert isinstance(key, bytes) and 0 < len(key) <= self.desc_size, f"{what}: descriptor {key!r}"
            self.descs.append(key)
        else:
            self.handles.append(key)
        reg = s.regs.get((kind, view, access))
        if reg is not None:  # R13: the same handle, one more reference
            assert key == reg.key, f"{what}: {key!r}, but the same registration is live as {reg.key!r}"
            reg.refs += 1
        else:
            clash = [r for r in s.regs.values() if r.kind == kind and r.key == key]
            assert not clash, f"{what}: {key!r} is already the handle of {clash[0].view}"
            s.regs[kind, view, access] = MReg(kind, view, access, key)

    @precondition(lambda self: len(self.handles) > len(JUNK_HANDLES) or self.descs)
    @rule(rnd=RND, kind=st.sampled_from(["memory", "rdma"]), source=KEY_SOURCES)
    def deregister(self, rnd: random.Random, kind: str, source: str) -> None:
        """deregister_memory or deregister_rdma_memory: a live handle, a stale or foreign one, junk."""
        if not (self.descs if kind == "rdma" else len(self.handles) > len(JUNK_HANDLES)):
            kind = "memory" if kind == "rdma" else "rdma"
        self._deregister(rnd, kind, source)

    def _deregister(self, rnd: random.Random, kind: str, source: str) -> None:
        # Deregistering is fine on a broken or disconnected connection, only not once closed.
        s = self._pick_socket(rnd, [s for s in self._current() if any(r.kind == kind for r in s.regs.values())])
        mine = [r for r in s.regs.values() if r.kind == kind]
        idle = [r for r in mine if not r.users]
        key: Any
        if mine and source == "live":
            key = rnd.choice(idle if idle and _mostly(rnd, 0.8) else mine).key
        elif kind == "memory":  # stale, another socket's, junk -- or live after all
            key = rnd.choice(self.handles if source == "seen" else JUNK_HANDLES)
        else:
            key = rnd.choice(self.descs)
            if source == "junk":
                key = rnd.choice([key[:-1], key + b"\0", b"", b"\xff" * len(key)])
        reg = s.live(kind, key)
        if s.state == "closed":
            errors = {E.WSAENOTSOCK, E.WSAEINVAL}
        elif reg is None or reg.users:  # R3, R13: unknown, or in use by a pending operation
            errors = {E.WSAEINVAL}
        else:
            errors = set()
        what = f"deregister {kind} {key!r} on {s} (model: {reg})"
        if kind == "memory":
            def call() -> Any:
                return s.provider.deregister_memory(s.sock, key)
        else:
            def call() -> Any:
                return s.provider.deregister_rdma_memory(s.sock, key)
        if errors:
            self._expect_raise(errors, call, what)
            return
        assert reg is not None
        call()
        reg.refs -= 1
        if not reg.refs:
            del s.regs[kind, reg.view, reg.access]

    # -- rules: data transfer -----------------------------------------------------------------

    @precondition(lambda self: any(self._useful(op) for op in TRANSFERS))
    @rule(rnd=RND)
    def transfer(self, rnd: random.Random) -> None:
        """rdma_write, rdma_read, send or recv: one that can succeed somewhere (it may still not)."""
        useful = {op: self._useful(op) for op in TRANSFERS}
        waiting = {"send": any(s.peer and s.peer.recvs for s in useful["send"]),
                   "recv": any(s.peer and s.peer.sends for s in useful["recv"])}
        kinds = [op for op in TRANSFERS if useful[op]]
        weights = [3 if op.startswith("rdma") or waiting.get(op) else 1 for op in kinds]
        kind = weighted(rnd, kinds, weights)
        count = rnd.choice(SGE_COUNTS)
        if kind.startswith("rdma"):
            self._rdma(rnd, kind, count)
        else:
            self._message(rnd, kind, count)

    def _rdma(self, rnd: random.Random, kind: str, count: int) -> None:
        write = kind == "rdma_write"
        need = W if write else R  # at the responder
        local_need = R if write else W
        s = self._pick_socket(rnd, self._useful(kind))
        peer = s.peer
        assert peer is not None
        windows = [r for r in peer.regs.values() if r.kind == "rdma"]
        fit = [r for r in windows if r.access & need]
        win: MReg | None = None
        choice = rnd.random()
        if fit and choice < 0.93:
            win = rnd.choice(fit)
        elif windows and choice < 0.95:  # R6, R7: the wrong access
            win = rnd.choice(windows)
        if win is not None:
            desc = win.key
        elif self.descs and choice < 0.99:  # another connection's, our own, or stale (R2, R3)
            desc = rnd.choice(self.descs)
        else:
            desc = rnd.choice([b"", b"\0" * 4, b"\x01" * (self.desc_size + 1), b"\x01" * (self.desc_size - 1)])
        pairs = self._pick_pairs(rnd, s, count, local_need, budget=win.view[3] if win else None, large=not write)
        total = sum(v[3] for v, _ in pairs)
        if win is not None and _mostly(rnd, 0.95):
            offset = rnd.randint(0, max(0, win.view[3] - total))
        else:  # R8: maybe out of bounds
            offset = rnd.randint(-2, 70)
        errors = self._post_errors(s, len(pairs))
        if len(desc) != self.desc_size:
            errors.add(E.WSAEINVAL)
        args = (s.sock, [(self._buffer(v), h) for v, h in pairs], desc, offset)
        what = f"{kind} {pairs} desc={desc!r} offset={offset} on {s}"
        call = getattr(s.provider, kind)
        if errors:
            self._expect_raise(errors, lambda: call(*args), what)
            return
        local = self._local_ok(s, pairs, local_need)
        target = peer.live("rdma", desc)
        remote_ok = (target is not None and target.access & need and offset >= 0
                     and offset + total <= target.view[3])
        if local is not None and not remote_ok and offset < 0:
            try:  # a negative offset may also be refused at the call
                op = call(*args)
            except SanError as exc:
                assert exc.code is E.WSAEINVAL, f"{what}: {exc}"
                return
        else:
            op = call(*args)
        mop = MOp(kind, op, s, [v for v, _ in pairs], [])
        if local is None:  # R1, R3, R6, R7, R8 on the local side
            self._complete(mop, Status.LOCAL_PROTECTION)
            self._break(s)
        elif not remote_ok:  # R2, R3, R6, R7, R8 at the responder
            self._complete(mop, Status.ACCESS_VIOLATION)
            self._break(s)
        else:
            assert target is not None
            pi, bi, off, _ = target.view
            remote = (pi, bi, off + offset, total)
            if write:
                self._scatter([remote], self._gather(mop.views))
            else:
                self._scatter(mop.views, self._gather([remote]))
            self._complete(mop, Status.SUCCESS, total)
            self.moved = True

    def _deliver(self, send: MOp, recv: MOp) -> None:
        if send.nbytes > recv.nbytes:
            self._complete(recv, Status.LOCAL_LENGTH)
            self._complete(send, Status.REMOTE_OPERATION)
            self._break(recv.sock)
            return
        self._scatter(recv.views, self._gather(send.views))
        self._complete(recv, Status.SUCCESS, send.nbytes)
        self._complete(send, Status.SUCCESS, send.nbytes)
        self.moved = True

    def _message(self, rnd: random.Random, kind: str, count: int) -> None:
        # Mostly where a send meets a posted receive, or a receive meets a waiting send.
        if kind == "send":
            s = self._pick_socket(rnd, self._useful(kind), lambda s: s.peer is not None and bool(s.peer.recvs))
        else:
            s = self._pick_socket(rnd, self._useful(kind), lambda s: s.peer is not None and bool(s.peer.sends))
        peer = s.peer
        assert peer is not None
        need = R if kind == "send" else W
        pairs = self._pick_pairs(rnd, s, count, need, budget=16 if kind == "send" else None,
                                 large=kind == "recv")
        errors = self._post_errors(s, len(pairs))
        call = getattr(s.provider, kind)
        args = (s.sock, [(self._buffer(v), h) for v, h in pairs])
        if errors:
            self._expect_raise(errors, lambda: call(*args), f"{kind} {pairs} on {s}")
            return
        op = call(*args)
        local = self._local_ok(s, pairs, need)
        mop = MOp(kind, op, s, [v for v, _ in pairs], [])
        if local is None:  # R6 (READ handle as receive buffer), R7 (WRITE handle as send source), R1, R3
            self._complete(mop, Status.LOCAL_PROTECTION)
            self._break(s)
            return
        mop.regs = local
        for reg in local:
            reg.users += 1
        if kind == "send":
            if peer.recvs:
                self._deliver(mop, peer.recvs.pop(0))
            else:
                s.sends.append(mop)
        elif peer.sends:
            self._deliver(peer.sends.pop(0), mop)
        else:
            s.recvs.append(mop)

    def _busy(self, view: View) -> bool:
        pi, bi, off, n = view
        for s in self._current():
            for mop in (*s.recvs, *s.sends):
                for vpi, vbi, voff, vn in mop.views:
                    if (vpi, vbi) == (pi, bi) and voff < off + n and off < voff + vn:
                        return True
        return False

    @precondition(lambda self: self.moved)
    @rule(rnd=RND, seed=st.integers(0, 250))
    def scribble(self, rnd: random.Random, seed: int) -> None:
        """The application writes its own memory (never under a pending operation)."""
        self.moved = False
        view = self._any_view(rnd, rnd.randrange(len(self.procs)))
        if self._busy(view):
            return
        pi, bi, off, n = view
        payload = _pattern(seed, n)
        self.bufs[pi][bi].write(payload, off)
        self.model[pi, bi][off:off + n] = payload

    # -- rules: teardown ----------------------------------------------------------------------

    def _close(self, s: MSock) -> None:
        if s.state == "closed":
            self._expect_raise({E.WSAENOTSOCK}, lambda: s.provider.close_socket(s.sock), f"close {s} again")
            return
        s.provider.close_socket(s.sock)
        self._flush(s, Status.ABORTED)  # R11: pending operations complete ABORTED
        peer = s.peer
        assert peer is not None
        if peer.state in ("connected", "error"):
            peer.state = "disconnected"
            self._flush(peer, Status.CONNECTION_RESET)
        s.state = "closed"
        s.regs.clear()  # R11: the provider released every registration

    @precondition(lambda self: self.quiet > QUIET_STEPS and any(s.state != "closed" for s in self._current()))
    @rule(rnd=RND, again=st.integers(0, 9))
    def close(self, rnd: random.Random, again: int) -> None:
        self.quiet = 0
        current = self._current()
        open_ = [s for s in current if s.state != "closed"]
        self._close(rnd.choice(current if again == 9 else open_))

    @precondition(lambda self: any("connected" not in (a.state, b.state) for a, b in self.slots))
    @rule(rnd=RND)
    def reconnect(self, rnd: random.Random) -> None:
        """The application gives up a broken or closed connection: closes what is left, connects anew."""
        slot = rnd.choice([i for i, (a, b) in enumerate(self.slots) if "connected" not in (a.state, b.state)])
        for s in self.slots[slot]:
            if s.state != "closed":
                self._close(s)
        self.slots[slot] = self._connect(slot)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def tick(self) -> None:  # runs after every step (not a check)
        self.quiet += 1

    @invariant()
    def registrations_agree(self) -> None:
        for s in self.socks:
            try:
                regs = s.provider.registrations(s.sock)
            except SanError as exc:
                assert s.state == "closed" and exc.code is E.WSAENOTSOCK, exc
                regs = []
            real = sorted((r.kind, r.address, r.length, int(r.access), r.refs) for r in regs)
            want = sorted((r.kind, self._address(r.view), r.view[3], r.access, r.refs) for r in s.regs.values())
            assert real == want, f"registrations of {s}: provider {real}, model {want}"
            assert s.sock.closed == (s.state == "closed"), f"{s}: closed={s.sock.closed}"
            assert s.sock.connected == (s.state == "connected"), f"{s}: connected={s.sock.connected}"

    @invariant()
    def proxy_balanced(self) -> None:  # R12
        for i, node in enumerate(self.backend.nodes):
            want = sum(len(s.regs) for s in self.socks if s.node == i)
            live = node.base_proxy.live_allocations()
            assert live == want, f"proxy of {node.name}: {live} live allocations, {want} live registrations"

    @invariant()
    def bytes_agree(self) -> None:  # no byte outside a successful transfer's target ever changes
        for (pi, bi), want in self.model.items():
            real = self.bufs[pi][bi].read()
            if real != want:
                diff = [i for i in range(len(want)) if real[i] != want[i]]
                raise AssertionError(f"buffer {bi} of process {pi}: bytes {diff} differ from the model: "
                                     f"{real.hex()} != {bytes(want).hex()}")

    @invariant()
    def pending_still_pending(self) -> None:
        for s in self.socks:
            for mop in (*s.recvs, *s.sends):
                assert not mop.op.done(), f"{mop.kind} on {s} completed early: {mop.op.wait(0)}"

    def teardown(self) -> None:
        for s in self.socks:
            if s.state != "closed":
                self._close(s)
        self.registrations_agree()
        assert self.backend.leaks() == []  # R11
        for node in self.backend.nodes:
            assert node.base_proxy.live_allocations() == 0, node.base_proxy


SETTINGS = settings(max_examples=120, deadline=None, stateful_step_count=40, database=None, print_blob=True)

TestSanMachine = SanMachine.TestCase
TestSanMachine.settings = SETTINGS


# -- the model has teeth: providers that break a rule are caught ---------------------------------

class _Wrapped:
    def __init__(self, base: Any) -> None:
        self._base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _IgnoresAccess(_Wrapped):
    """Registers everything READWRITE: R6/R7 broken."""

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        return self._base.register_memory(socket, buffer, Access.READWRITE if access in VALID_ACCESS else access)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: Any = None) -> Any:
        access = Access.READWRITE if access in VALID_ACCESS else access
        return self._base.register_rdma_memory(socket, buffer, access, descriptor_size)


class _KeepsMemory(_Wrapped):
    """A deregistration that releases nothing: R3/R12 broken."""

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        if not any(r.kind == "memory" and r.handle == handle for r in self._base.registrations(socket)):
            self._base.deregister_memory(socket, handle)


class _IgnoresOffset(_Wrapped):
    """RDMA writes land at the start of the target window, whatever the offset: bytes misplaced."""

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: bytes, offset: int = 0) -> Any:
        return self._base.rdma_write(socket, local_buffers, target_descriptor, min(offset, 0))


@pytest.mark.parametrize("wrapper", [_IgnoresAccess, _KeepsMemory, _IgnoresOffset])
def test_model_catches_broken_provider(wrapper: Callable[[Any], Any]) -> None:
    class Broken(SanMachine):
        @staticmethod
        def make_backend() -> Any:
            return EmulatorBackend(wrap_provider=lambda node, base: wrapper(base))

    # Derandomized, no shrinking: the same few examples every run, so this stays fast and stable.
    quick = settings(SETTINGS, max_examples=100, derandomize=True, phases=[Phase.generate], print_blob=False)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(Broken, settings=quick)
