"""A property-based fuzz of every SPI, proxy and switch entry point, through the public API only.

Any backend can be fuzzed: ``run_fuzz(make_backend, max_examples=..., steps=...)`` drives random
sequences of calls with arbitrary arguments -- types, signs and sizes of lengths and offsets
(bools, floats, strings, None for ints), buffers of other processes, other nodes and killed
processes, buffers of negative length, malformed scatter lists and descriptors, junk sockets,
handles, access flags, descriptor sizes, proxy sizes, cache types, DMA descriptions, and the switch's
``connect`` with arbitrary peers and options (and a refused proxy allocation in the middle).

After EVERY call:

* no exception but SanError, TypeError or ValueError escapes a call;
* a call refused at the call (one of those three) changed nothing: the registrations of every
  socket, every proxy's live allocations, every byte of every buffer (guards included), every
  socket's state and (on synchronous backends) every pending operation are as before;
* an error completion moved no byte and reported 0 bytes; registrations and proxy counts are as
  before; only its own connection may have gone to error;
* a call that succeeded changed only what it may: one registration (or one more reference) per
  register, one less per deregister, the proxy's live count in step with the distinct
  registrations of its node (R12); an RDMA transfer wrote exactly the window range at its offset
  (rdma_write) or its local entries (rdma_read) with exactly the source's bytes, and only when
  every local entry lies in a live registration of that socket with the right access and the
  descriptor is a live window of the peer with the right access and room at the offset;
* clear bad input (a negative length, an access that only equals a flag, a non-integer where an
  integer goes, a malformed scatter list, an empty or unmapped or foreign buffer) never succeeds;
  a malformed scatter list with no other fault is a TypeError, a too-small ``descriptor_size``
  alone is WSAEFAULT carrying the required size.

At the end every registration the fuzz knows of is deregistered one reference at a time (each must
succeed: nothing may be left marked in use by a refused call), every socket is closed, every
proxy object freed, and ``backend.leaks()`` must be empty -- the plugin's leak check (R11).

Usage::

    from tests.support.fuzz_spi import run_fuzz
    run_fuzz(lambda: EmulatorBackend(), max_examples=200, steps=40)
    run_fuzz(lambda: shared_hil_backend, max_examples=20, steps=25)  # reset() after each example

``make_backend`` is called once per example; the backend is ``reset()`` after each (pass
``reset=False`` to keep it as it is). ``extra_check(backend)`` runs after every step (the emulator's
test checks its internal in-use counts there). ``python tests/support/fuzz_spi.py --examples 5000`` runs a
long fuzz on the emulator.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from pytest_san import PAGE_SIZE, Access, CacheType, Completion, DeviceDescription, SanError, Status, Switch, WsaError
from pytest_san.plugin.fixtures import leak_message
from pytest_san.spi.contract import is_int as _is_int

ALLOWED = (SanError, TypeError, ValueError)
T = TypeVar("T")
E = WsaError
GUARD = 32
SIZES = (64, 200)  # every process gets a guarded buffer of each size
TIMEOUT = 30.0
MAX_SOCKETS = 16  # sockets tracked at once (closed ones beyond that are forgotten)
CLEAN = 0.6  # share of transfers and registrations made without any deliberate fault
MAX_SGE_TRIED = 6  # beyond any provider's limit sometimes: WSAEINVAL
RND = st.randoms(use_true_random=True)  # one draw per rule; every choice inside comes from it

Loc = tuple[int, int, int]  # (tracked buffer index, offset in its whole allocation, length)


def weighted(rnd: random.Random, items: Sequence[T], weights: Sequence[int]) -> T:
    """One of ``items``, drawn by ``weights``.

    Not rnd.choices: with use_true_random=False, Hypothesis' Random ignores the weights."""
    x = rnd.random() * sum(weights)
    for item, weight in zip(items, weights, strict=True):
        x -= weight
        if x < 0:
            return item
    return items[-1]


def _pattern(seed: int, n: int) -> bytes:
    return bytes((seed * 37 + i * 11) % 251 + 1 for i in range(n))



def _huge(rnd: random.Random) -> int:
    return rnd.choice([1, -1]) * (1 << rnd.choice([31, 32, 40, 62, 63, 64, 70]))


JUNK = [None, "x", "", b"", 1.5, float("nan"), True, False, [], {}, (), object(), -1, 0, 1 << 64]


@dataclasses.dataclass(eq=False)
class TBuf:
    index: int
    proc: int
    whole: Any
    inner: Any


@dataclasses.dataclass(eq=False)
class TSock:
    index: int
    sock: Any
    proc: int
    node: int
    provider: Any
    peer: TSock | None = None

    def __repr__(self) -> str:
        return f"s{self.index}(p{self.proc}@n{self.node})"


@dataclasses.dataclass(eq=False)
class Rec:
    """One reference to a live registration the fuzz made."""

    kind: str  # "memory" | "rdma"
    key: Any  # the handle or the descriptor
    sock: TSock
    loc: Loc  # what it covers
    address: int
    access: int


@dataclasses.dataclass(eq=False)
class Entry:
    """One item of a scatter list, and what the fuzz knows of it."""

    item: Any
    loc: Loc | None = None  # tracked memory it names (a well-formed, non-negative range)
    proc: int | None = None  # the process the buffer belongs to
    handle: Any = None
    fault: str | None = None  # "malformed", "negative", "types"


@dataclasses.dataclass(eq=False)
class POp:
    kind: str
    op: Any
    sock: TSock
    locs: list[Loc]
    handles: list[Any]
    must_fail: bool = False


@dataclasses.dataclass
class Snap:
    regs: dict[int, tuple[tuple[str, int, int, int, int], ...]]
    live: list[int]
    data: dict[int, bytes]
    states: dict[int, tuple[bool, bool]]
    done: dict[int, bool]
    leaks: list[str] | None = None


@dataclasses.dataclass
class Effects:
    """What a call that succeeded may change (everything else must stay as it was)."""

    regs: dict[int, tuple[tuple[str, int, int, int, int], ...]] = dataclasses.field(default_factory=dict)
    live: dict[int, int] = dataclasses.field(default_factory=dict)  # node -> delta
    writes: list[tuple[int, int, bytes | None, int]] = dataclasses.field(default_factory=list)
    may_change_state: set[int] = dataclasses.field(default_factory=set)
    may_complete: set[int] = dataclasses.field(default_factory=set)  # sockets whose ops may complete
    dying: set[int] = dataclasses.field(default_factory=set)  # processes killed by the call


class SpiFuzz(RuleBasedStateMachine):
    """Random calls with arbitrary arguments; the invariants of the module docstring after each."""

    make_backend: Callable[[], Any]
    timeout: float = TIMEOUT
    synchronous: bool | None = None  # None: True for the emulator (operations complete inside the call)
    extra_check: Callable[[Any], None] | None = None
    reset_after: bool = True

    def __init__(self) -> None:
        super().__init__()
        self.backend = type(self).make_backend()
        leaks = [str(leak) for leak in self.backend.leaks()]
        assert not leaks, "the fuzz needs a clean backend\n" + leak_message(leaks)
        self.caps = frozenset(self.backend.capabilities)
        sync = type(self).synchronous
        self.sync = self.backend.name == "emulator" if sync is None else sync
        nodes = list(self.backend.nodes)
        self.nodes = nodes
        n1, n2 = min(1, len(nodes) - 1), min(2, len(nodes) - 1)
        plan = [(0, False), (n1, n1 == 0), (0, True), (n2, n2 in (0, n1))]  # four distinct processes
        if "process_kill" in self.caps:
            plan.append((n1, True))  # the victim: killed by a rule
        self.victim = 4 if "process_kill" in self.caps else None
        self.procs = [nodes[n].spawn_process() if spawn else nodes[n].default_process for n, spawn in plan]
        self.proc_node = [n for n, _ in plan]
        self.dead: set[int] = set()
        self.bufs: list[TBuf] = []
        for pi, p in enumerate(self.procs):
            for size in SIZES:
                whole = p.alloc(size + 2 * GUARD)
                whole.write(bytes([0xA5]) * GUARD + _pattern(len(self.bufs), size) + bytes([0xA5]) * GUARD)
                self.bufs.append(TBuf(len(self.bufs), pi, whole, whole.view(GUARD, size)))
        self.socks: list[TSock] = []
        self._ids = itertools.count()
        self.ops: list[POp] = []
        self.slots: list[tuple[TSock, TSock]] = []
        self.slots = [self._connect(0, 1), self._connect(0, 1), self._connect(2, 3)]
        if self.victim is not None:
            self.slots.append(self._connect(self.victim, 0))
        self.recs: list[Rec] = []
        self.stale: list[Any] = []  # handles and descriptors deregistered (or of closed sockets)
        self.allocs: list[tuple[int, Any]] = []  # (node, allocation) live
        self.freed: list[tuple[int, Any]] = []
        self.blocks: list[tuple[int, int, int, Any]] = []  # (node, base, nbytes, cache type) live
        self.adapters: list[list[Any]] = []  # [node, adapter, put?, [(length, logical, virtual, cache)]]
        self.down: list[tuple[int, int]] = []  # links dropped (node indices)
        self.steps = 0
        a = self.slots[0][0]
        try:
            a.provider.register_rdma_memory(a.sock, self.bufs[0].inner, Access.READ, 0)
        except SanError as exc:
            assert exc.code is E.WSAEFAULT and _is_int(exc.required_size), exc
            self.desc_size: int = exc.required_size  # type: ignore[assignment]
        else:
            raise AssertionError("descriptor_size=0 was accepted (R14: the descriptor-too-small probe)")

    # -- the world --------------------------------------------------------------------------------

    def _connect(self, pa: int, pb: int) -> tuple[TSock, TSock]:
        sa, sb = self.backend.connect_sockets(self.procs[pa], self.procs[pb])
        return self._track_pair(sa, pa, sb, pb)

    def _track_pair(self, sa: Any, pa: int, sb: Any, pb: int) -> tuple[TSock, TSock]:
        a, b = (TSock(next(self._ids), sock, p, self.proc_node[p], self.procs[p].node.provider)
                for sock, p in ((sa, pa), (sb, pb)))
        a.peer, b.peer = b, a
        self.socks += [a, b]
        if len(self.socks) > MAX_SOCKETS:  # forget the oldest closed sockets no slot and no operation uses
            slots = {t for pair in self.slots for t in pair}
            busy = {o.sock for o in self.ops}
            old = [t for t in self.socks if t not in slots and t not in busy and t not in (a, b) and self._closed(t)]
            for t in old[:len(self.socks) - MAX_SOCKETS]:
                self.socks.remove(t)
        return a, b

    def _open(self) -> list[TSock]:
        return [s for s in self.socks if not self._closed(s)]

    def _closed(self, s: TSock) -> bool:
        return s.proc in self.dead or bool(s.sock.closed)

    def _my_bufs(self, proc: int) -> list[TBuf]:
        return [b for b in self.bufs if b.proc == proc]

    def _recs(self, s: TSock, kind: str) -> list[Rec]:
        return [r for r in self.recs if r.sock is s and r.kind == kind]

    def _in_use(self, s: TSock, handle: Any) -> bool:
        return any(o.sock is s and not o.op.done() and any(h is handle or (_is_int(h) and h == handle)
                                                          for h in o.handles) for o in self.ops)

    def _regs_of(self, s: TSock) -> tuple[tuple[str, int, int, int, int], ...]:
        try:
            regs = s.provider.registrations(s.sock)
        except SanError as exc:
            assert exc.code is E.WSAENOTSOCK, f"registrations({s}): {exc}"
            return ()
        return tuple(sorted((r.kind, int(r.address), int(r.length), int(r.access), int(r.refs)) for r in regs))

    def snap(self, leaks: bool = False) -> Snap:
        return Snap(
            regs={s.index: self._regs_of(s) for s in self.socks},
            live=[n.proxy.live_allocations() for n in self.nodes],
            data={b.index: b.whole.read() for b in self.bufs if b.proc not in self.dead},
            states={s.index: (bool(s.sock.connected), bool(s.sock.closed)) for s in self.socks
                    if s.proc not in self.dead},
            done={id(o): o.op.done() for o in self.ops},
            leaks=sorted(str(x) for x in self.backend.leaks()) if leaks else None,
        )

    # -- the check after every call ---------------------------------------------------------------

    def _outcome(self, what: str, call: Callable[[], Any]) -> Any:
        """The call's result, or the allowed exception it raised; any other exception fails the fuzz."""
        try:
            return call()
        except ALLOWED as exc:
            return exc
        except Exception as exc:
            raise AssertionError(f"{what}: {type(exc).__name__} escaped the call: {exc}") from exc

    def _check(self, what: str, before: Snap, after: Snap, refused: bool, fx: Effects) -> None:
        # Registrations: as before, except what a successful call changed.
        for i, regs in after.regs.items():
            want = fx.regs.get(i, before.regs.get(i, ()))
            if refused:
                want = before.regs.get(i, ())
            assert regs == want, f"{what}: registrations of {self._by_index(i)} are {regs}, expected {want}"
        for n, live in enumerate(after.live):
            want_live = before.live[n] + (0 if refused else fx.live.get(n, 0))
            assert live == want_live, (f"{what}: proxy of node {n} has {live} live allocations, expected "
                                       f"{want_live} (before {before.live[n]})")
        # Bytes: only where a successful transfer (or a receive still pending, or completing) wrote.
        allowed: dict[int, list[tuple[int, int]]] = {}
        exact: dict[int, list[tuple[int, bytes]]] = {}
        if not refused:
            for bi, start, data, length in fx.writes:
                allowed.setdefault(bi, []).append((start, start + length))
                if data is not None:
                    exact.setdefault(bi, []).append((start, data))
        for o in self.ops:
            if o.kind != "recv" or before.done.get(id(o), False):
                continue
            completed_ok = o.op.done() and o.op.wait(0).status is Status.SUCCESS
            if self.sync and not completed_ok:
                continue  # synchronous: a receive writes exactly when it completes
            for bi, start, length in o.locs:
                allowed.setdefault(bi, []).append((start, start + length))
        for bi, data in after.data.items():
            old = before.data.get(bi)
            if old is None or self.bufs[bi].proc in fx.dying:
                continue
            assert len(data) == len(old), f"{what}: buffer {bi} changed size {len(old)} -> {len(data)}"
            if data != old:
                ranges = allowed.get(bi, [])
                bad = [i for i in range(len(old)) if data[i] != old[i] and not any(a <= i < b for a, b in ranges)]
                assert not bad, (f"{what}: bytes {bad[:8]}{'...' if len(bad) > 8 else ''} of buffer {bi} "
                                 f"(process {self.bufs[bi].proc}, guards are 0..{GUARD - 1} and the last {GUARD}) "
                                 f"changed outside what the call may write ({ranges})")
            if exact.get(bi):  # the writes, in order (a later entry overlapping an earlier one wins)
                want_data = bytearray(old)
                for start, want_bytes in exact[bi]:
                    want_data[start:start + len(want_bytes)] = want_bytes
                for start, want_bytes in exact[bi]:
                    end = start + len(want_bytes)
                    got, want_here = data[start:end], bytes(want_data[start:end])
                    assert got == want_here, \
                        f"{what}: buffer {bi}[{start}:] holds {got.hex()}, expected {want_here.hex()}"
        # Socket states and pending operations.
        for i, state in after.states.items():
            old_state = before.states.get(i)
            if old_state is None or old_state == state:
                continue
            s = self._by_index(i)
            # On a real NIC a QP goes to error when it does, and either end learns it at its next call
            # (a violation seen by the responder, a retry exhausted): connected -> error, never closed.
            free = (not refused and i in fx.may_change_state) or (
                not self.sync and (s.peer is None or not before.states.get(s.peer.index, (False, True))[0]
                                   or (old_state[0] and not state[0] and not state[1])))
            assert free, f"{what}: {s} went from (connected, closed)={old_state} to {state}"
            assert not (old_state[1] and not state[1]), f"{what}: {s} was closed and is open again"
        if self.sync:
            for o in self.ops:
                was = before.done.get(id(o))
                if was is False and o.op.done():
                    assert not refused and o.sock.index in fx.may_complete, \
                        f"{what}: a pending {o.kind} on {o.sock} completed {o.op.wait(0)} meanwhile"
        for o in self.ops:  # completed operations: error completions moved nothing, reported 0 bytes
            if o.op.done() and before.done.get(id(o), False) is False:
                done = o.op.wait(0)
                assert isinstance(done, Completion), f"{what}: {o.kind} completed with {done!r}"
                if done.status is not Status.SUCCESS:
                    assert done.bytes == 0, f"{what}: {o.kind} on {o.sock} completed {done}: an error moves no byte"
                else:
                    assert not o.must_fail, f"{what}: {o.kind} on {o.sock} with bad input completed {done}"
                    assert 0 <= done.bytes <= sum(n for _, _, n in o.locs), f"{what}: {o.kind} completed {done}"
        self.ops = [o for o in self.ops if not o.op.done()]
        if type(self).extra_check is not None:
            type(self).extra_check(self.backend)  # type: ignore[misc]

    def _registrations_delta(self, s: TSock, before: Snap, add: tuple[str, int, int, int] | None,
                             remove: tuple[str, int, int, int] | None) -> tuple[tuple[Any, ...], int]:
        """The socket's registrations after adding/removing one reference, and the live-count delta."""
        regs = [list(r) for r in before.regs.get(s.index, ())]
        delta = 0
        if add is not None:
            same = [r for r in regs if tuple(r[:4]) == add]
            if same:
                same[0][4] += 1
            else:
                regs.append([*add, 1])
                delta = 1
        if remove is not None:
            same = [r for r in regs if tuple(r[:4]) == remove]
            assert same, f"{remove} is not among the registrations of {s}: {regs}"
            same[0][4] -= 1
            if same[0][4] == 0:
                regs.remove(same[0])
                delta = -1
        return tuple(sorted(tuple(r) for r in regs)), delta

    # -- choosing arguments -----------------------------------------------------------------------

    def _pick_socket(self, rnd: random.Random, fit: Sequence[TSock] = (), connected: bool = True) -> Any:
        """What to pass as the socket: mostly one of ``fit`` (or of the open ones), sometimes any, or junk."""
        x = rnd.random()
        if x < 0.93:
            live = list(fit) or [s for s in self._open() if not connected or s.sock.connected]
            if live:
                weights = [6 if s in self.slots[0] else 1 for s in live]
                return weighted(rnd, live, weights).sock
        if x < 0.98 or not self.socks:
            return rnd.choice(self.socks).sock
        return rnd.choice([*JUNK, self.procs[0], self.bufs[0].inner])

    def _useful(self, kind: str) -> list[TSock]:
        """Connected sockets of the slots on which ``kind`` can succeed."""
        local, remote = {"rdma_write": (1, 2), "rdma_read": (2, 1), "send": (1, 0), "recv": (2, 0),
                         "memory": (0, 0), "rdma": (0, 0)}[kind]
        out = []
        for s in (t for pair in self.slots for t in pair):
            if s.proc in self.dead or not s.sock.connected:
                continue
            if local and not any(r.access & local for r in self._recs(s, "memory")):
                continue
            if remote and (s.peer is None or not any(r.access & remote for r in self._recs(s.peer, "rdma"))):
                continue
            out.append(s)
        return out

    def _by_index(self, i: int) -> TSock:
        return next(s for s in self.socks if s.index == i)

    def _tsock(self, sock: Any) -> TSock | None:
        return next((s for s in self.socks if s.sock is sock), None)

    def _provider_for(self, rnd: random.Random, s: TSock | None) -> tuple[Any, bool]:
        """(provider, is it the socket's own); sometimes another node's provider."""
        if s is not None and rnd.random() < 0.95:
            return s.provider, True
        node = rnd.randrange(len(self.nodes))
        return self.nodes[node].provider, s is not None and node == s.node

    def _sub(self, rnd: random.Random, bi: int, base: int, length: int, allow_empty: bool = False,
             cap: int | None = None) -> Loc:
        """A sub-range (offset in the whole buffer) of [base, base + length), at most ``cap`` long."""
        lo = 0 if allow_empty else 1
        if cap is not None and rnd.random() < 0.5 and cap >= lo:
            n = rnd.randint(lo, min(cap, length))  # often as large as allowed
            return bi, base + rnd.randint(0, length - n), n
        o = rnd.randrange(length + (1 if allow_empty else 0))
        n = rnd.randint(lo, length - o) if length - o >= lo else 0
        if cap is not None:
            n = max(min(n, cap), 0 if allow_empty else min(n, 1))
        return bi, base + o, n

    def _register_target(self, rnd: random.Random, proc: int, clean: bool,
                         home: int) -> tuple[Any, Loc | None, str | None]:
        """(buffer, the tracked memory it names, why it is bad or None): memory of ``proc``, the socket
        being that of ``home``."""
        mine = self._my_bufs(proc)
        b = rnd.choice(mine)
        shape = weighted(rnd, ["range", "whole", "empty", "negative", "overrun", "unmapped", "foreign",
                                     "duck", "duck_junk", "junk"], [40, 10, 6, 8, 5, 5, 8, 4, 4, 6])
        if clean:
            shape = rnd.choice(["range", "range", "whole"])
        if proc in self.dead:
            shape = "range"
        if shape in ("range", "whole"):
            bi, off, n = (b.index, GUARD, b.inner.length) if shape == "whole" \
                else self._sub(rnd, b.index, GUARD, b.inner.length)
            return b.whole.view(off, n), (bi, off, n), None if proc not in self.dead else "dead"
        if shape == "empty":
            return b.inner.view(rnd.randrange(b.inner.length + 1), 0), None, "empty"
        p = self.procs[proc]
        if shape == "negative":
            return p.buffer_at(b.inner.address + rnd.randrange(b.inner.length), -rnd.randint(1, 64)), None, "negative"
        # Past the end of the buffer's last page (into the guard page): the bytes up to it are mapped.
        past = -(-(b.whole.address + b.whole.length) // PAGE_SIZE) * PAGE_SIZE
        if shape == "overrun":
            start = b.whole.address + rnd.randrange(8)
            return p.buffer_at(start, past - start + rnd.randint(1, 1 << 20)), None, "unmapped"
        if shape == "unmapped":
            past += 8
            address = rnd.choice([0, 0x1000, past, -4096, 1 << 64, _huge(rnd)])
            return p.buffer_at(address, rnd.choice([1, 16, 4096])), None, "unmapped"
        if shape == "foreign":
            other = rnd.choice([t for t in self.bufs if t.proc != home])
            return other.inner, None, "foreign"
        if shape == "duck":
            _, off, n = self._sub(rnd, b.index, GUARD, b.inner.length)
            return types.SimpleNamespace(address=b.whole.address + off, length=n, process=p), (b.index, off, n), None
        if shape == "duck_junk":
            return types.SimpleNamespace(address=rnd.choice([float(b.inner.address), None, str(b.inner.address)]),
                                         length=rnd.choice([8, 8.0, True, "8", None]), process=p), None, "types"
        return rnd.choice(JUNK), None, "junk"

    def _access(self, rnd: random.Random, clean: bool) -> tuple[Any, bool]:
        if clean or rnd.random() < 0.75:
            return rnd.choice([1, 2, 3, Access.READ, Access.WRITE, Access.READWRITE]), True
        return rnd.choice([0, 4, 7, -1, 0x10, True, False, 1.0, 3.0, "1", None, [1], _huge(rnd)]), False

    # -- rules: registration ----------------------------------------------------------------------

    def register(self, rnd: random.Random, kind: str) -> None:
        clean = rnd.random() < CLEAN
        sock = self._pick_socket(rnd, self._useful(kind))
        s = self._tsock(sock)
        provider, own = self._provider_for(rnd, s)
        proc = s.proc if s is not None else 0
        if s is not None and not clean and rnd.random() < 0.1:
            proc = rnd.randrange(len(self.procs))
        buffer, loc, bad = self._register_target(rnd, proc, clean, s.proc if s is not None else proc)
        if s is not None and proc != s.proc and bad != "junk":
            bad = "foreign"  # another process's buffer is refused first (WSAEFAULT), whatever else is wrong
        access, access_ok = self._access(rnd, clean)
        size: Any = None
        size_fault = None
        if kind == "rdma" and not clean and rnd.random() < 0.4:
            size = rnd.choice([self.desc_size, self.desc_size + 8, 1 << 40, 0, self.desc_size - 1, -1,
                               str(self.desc_size), float(self.desc_size), True, b"20", None])
            if size is not None:
                size_fault = None if _is_int(size) and size >= self.desc_size else (
                    "small" if _is_int(size) else "types")
        what = (f"register_{'rdma_' if kind == 'rdma' else ''}memory({s or repr(sock)[:40]}, {buffer!r:.80}, "
                f"{access!r}, size={size!r}) [bad={bad}, access_ok={access_ok}, own={own}]")
        call: Callable[[], Any]
        if kind == "memory":
            def call() -> Any:
                return provider.register_memory(sock, buffer, access)
        else:
            def call() -> Any:
                return provider.register_rdma_memory(sock, buffer, access, size)
        armed = rnd.randrange(len(self.nodes)) if not clean and rnd.random() < 0.1 else None
        if armed is not None and self._arm(armed):  # the proxy refuses the next allocation there
            what += f" [allocation fails on node {armed}]"
        else:
            armed = None
        before = self.snap()
        try:
            result = self._outcome(what, call)
        finally:
            if armed is not None:
                self._disarm(armed)
        refused = isinstance(result, BaseException)
        usable = (s is not None and own and not self._closed(s) and bool(before.states.get(s.index, (0, 0))[0]))
        must_fail = bad is not None or not access_ok or size_fault is not None or not usable
        fx = Effects()
        if not refused:
            assert not must_fail, f"{what}: accepted, returned {result!r}"
            assert s is not None and loc is not None
            if kind == "memory":
                assert _is_int(result), f"{what}: a handle is an integer, got {result!r}"
            else:
                assert isinstance(result, bytes) and 0 < len(result) <= self.desc_size, f"{what}: {result!r}"
            address = self.bufs[loc[0]].whole.address + loc[1]
            regs, delta = self._registrations_delta(s, before, (kind, address, loc[2], int(access)), None)
            assert not (delta and armed == s.node), f"{what}: registered new memory though the proxy refused"
            fx.regs[s.index] = regs
            fx.live[s.node] = delta
            self.recs.append(Rec(kind, result, s, loc, address, int(access)))
        else:
            faults = {bad} - {None}
            if not access_ok:
                faults.add("access")
            if size_fault:
                faults.add(size_fault)
            if usable and faults == {"small"}:
                assert isinstance(result, SanError) and result.code is E.WSAEFAULT, f"{what}: {result!r}"
                assert result.required_size == self.desc_size, f"{what}: R14 probe gave {result!r}"
            if usable and faults == {"access"}:
                assert isinstance(result, TypeError) or (isinstance(result, SanError) and result.code is E.WSAEINVAL), \
                    f"{what}: bad access flags gave {result!r}, not WSAEINVAL"
            if usable and faults == {"negative"}:
                assert isinstance(result, SanError) and result.code is E.WSAEINVAL, f"{what}: {result!r}"
            if usable and faults in ({"empty"}, {"unmapped"}, {"foreign"}):
                assert isinstance(result, SanError) and result.code is E.WSAEFAULT, f"{what}: {result!r}"
        self._check(what, before, self.snap(), refused, fx)

    def deregister(self, rnd: random.Random, kind: str) -> None:
        mine = [r for r in self.recs if r.kind == kind]
        x = rnd.random()
        rec: Rec | None = None
        if mine and x < 0.75:
            rec = rnd.choice(mine)
            s: TSock | None = rec.sock if rnd.random() < 0.9 else rnd.choice(self.socks)
            key: Any = rec.key
        else:
            s = rnd.choice(self.socks)
            pool = [r.key for r in self.recs] + self.stale + [0, -1, 1 << 70, True, None, "h", 1.0, b"", b"\0" * 20]
            key = rnd.choice(pool)
            if isinstance(key, bytes) and key and rnd.random() < 0.3:
                key = rnd.choice([key[:-1], key + b"\0", bytearray(key), memoryview(key), key.hex()])
        assert s is not None
        provider, own = self._provider_for(rnd, s)
        method = provider.deregister_memory if kind == "memory" else provider.deregister_rdma_memory
        what = f"deregister_{'rdma_' if kind == 'rdma' else ''}memory({s}, {key!r:.60}) [own={own}]"
        # A descriptor may come as any bytes-like object; a handle is exactly an int.
        norm = bytes(key) if kind == "rdma" and isinstance(key, (bytes, bytearray, memoryview)) else key
        match = [r for r in self.recs if r.sock is s and r.kind == kind and type(r.key) is type(norm) and r.key == norm]
        strict = type(key) is (int if kind == "memory" else bytes)
        before = self.snap()
        result = self._outcome(what, lambda: method(s.sock, key))
        refused = isinstance(result, BaseException)
        fx = Effects()
        busy = bool(match) and kind == "memory" and self._in_use(s, key)
        if refused:
            if match and strict and own and not self._closed(s) and not busy:
                raise AssertionError(f"{what}: a live registration that no pending operation uses was refused: "
                                     f"{result!r}")
        else:
            assert match and own and not busy, f"{what}: accepted (live: {bool(match)}, in use: {busy})"
            r = match[0]
            regs, delta = self._registrations_delta(s, before, None, (kind, r.address, r.loc[2], r.access))
            fx.regs[s.index] = regs
            fx.live[s.node] = delta
            self.recs.remove(r)
            if not any(x.key == r.key and x.sock is s for x in self.recs):
                self.stale.append(r.key)
        self._check(what, before, self.snap(), refused, fx)

    # -- rules: transfers -------------------------------------------------------------------------

    def _entries(self, rnd: random.Random, s: TSock | None, need: int, clean: bool,
                 budget: int | None = None) -> tuple[Any, list[Entry], str | None]:
        """(the scatter list as passed, its entries, a fault of the list itself); ``budget``: at most that
        many bytes in all (so that a transfer fits its window)."""
        proc = s.proc if s is not None else 0
        recs = self._recs(s, "memory") if s is not None else []
        fit = [r for r in recs if r.access & need]
        count = weighted(rnd, list(range(MAX_SGE_TRIED + 1)), [2, 40, 20, 10, 6, 3, 2])
        if clean:
            count = max(1, min(count, 4))
        entries = []
        for _ in range(count):
            kind = weighted(rnd, ["good", "zero", "negative", "outside", "foreign", "handle", "malformed",
                                        "duck", "duck_junk"], [45, 6, 8, 6, 6, 8, 8, 5, 8])
            if clean:
                kind = "zero" if rnd.random() < 0.05 else "good"
            r = rnd.choice(fit) if fit and rnd.random() < 0.95 else (rnd.choice(recs) if recs else None)
            if r is None and kind in ("good", "zero", "negative", "outside", "duck"):
                kind = "handle"
            if kind in ("good", "zero", "duck"):
                assert r is not None
                loc = self._sub(rnd, r.loc[0], r.loc[1], r.loc[2], allow_empty=kind == "zero", cap=budget)
                if kind == "zero":
                    loc = (loc[0], loc[1], 0)
                if budget is not None:
                    budget = max(0, budget - loc[2])
                whole = self.bufs[loc[0]].whole
                item: Any = whole.view(loc[1], loc[2]) if kind != "duck" else types.SimpleNamespace(
                    address=whole.address + loc[1], length=loc[2], process=self.procs[self.bufs[loc[0]].proc])
                entries.append(Entry((item, r.key), loc, self.bufs[loc[0]].proc, r.key))
            elif kind == "negative":
                assert r is not None
                start = r.address + rnd.randrange(r.loc[2])
                buf = self.procs[proc].buffer_at(start, -rnd.randint(1, 256))
                entries.append(Entry((buf, r.key), None, proc, r.key, "negative"))
            elif kind == "outside":
                assert r is not None
                b = self.bufs[r.loc[0]]
                loc = self._sub(rnd, b.index, 0, b.whole.length)
                entries.append(Entry((b.whole.view(loc[1], loc[2]), r.key), loc, b.proc, r.key))
            elif kind == "foreign":
                b = rnd.choice([t for t in self.bufs if t.proc != proc])
                loc = self._sub(rnd, b.index, GUARD, b.inner.length)
                handle = r.key if r is not None else 1
                entries.append(Entry((b.whole.view(loc[1], loc[2]), handle), loc, b.proc, handle))
            elif kind == "handle":
                b = rnd.choice(self._my_bufs(proc))
                loc = self._sub(rnd, b.index, GUARD, b.inner.length)
                handle = rnd.choice([*(x.key for x in self.recs), *self.stale, 0, -1, 1 << 70, True, None, "h", 2.0])
                entries.append(Entry((b.whole.view(loc[1], loc[2]), handle), loc, proc, handle))
            elif kind == "duck_junk":
                handle = r.key if r is not None else 1
                duck = types.SimpleNamespace(address=rnd.choice([None, "0", 1.0]), length=rnd.choice([8, 8.0, None]),
                                             process=self.procs[proc])
                entries.append(Entry((duck, handle), None, proc, handle, "types"))
            else:
                b = rnd.choice(self._my_bufs(proc))
                handle = r.key if r is not None else 1
                item = rnd.choice([None, (b.inner,), (b.inner, handle, 0), (None, handle), ("buffer", handle), 5,
                                   "ab", (5, handle), [b.inner]])
                entries.append(Entry(item, None, proc, handle, "malformed"))
        items = [e.item for e in entries]
        shape = weighted(rnd, ["list", "tuple", "none", "str", "generator", "pair", "int"],
                               [80, 6, 3, 3, 3, 3, 2])
        if clean:
            shape = "list"
        if shape == "list":
            return items, entries, None
        if shape == "tuple":
            return tuple(items), entries, None
        junk = {"none": None, "str": "ab", "int": 3, "generator": (i for i in items),
                "pair": items[0] if items else (None, None)}[shape]
        return junk, entries, "malformed"

    def _local_ok(self, s: TSock, entries: list[Entry], need: int) -> bool:
        """Would an HCA take these local entries (every one inside a live registration of ``s``)?"""
        for e in entries:
            if e.loc is None or e.fault is not None or e.proc != s.proc:
                return False
            recs = [r for r in self.recs if r.sock is s and r.kind == "memory" and type(r.key) is type(e.handle)
                    and r.key == e.handle]
            if not recs:
                return False
            r = recs[0]
            bi, off, n = e.loc
            if not r.access & need or bi != r.loc[0] or off < r.loc[1] or off + n > r.loc[1] + r.loc[2]:
                return False
        return True

    def _descriptor(self, rnd: random.Random, s: TSock | None, need: int, clean: bool) -> Any:
        peer = s.peer if s is not None else None
        windows = self._recs(peer, "rdma") if peer is not None else []
        fit = [w for w in windows if w.access & need]
        x = rnd.random()
        if fit and (clean or x < 0.6):
            return rnd.choice(fit).key
        if windows and x < 0.75:
            return rnd.choice(windows).key  # maybe the wrong access (R6, R7)
        descs = [r.key for r in self.recs if r.kind == "rdma"] + [k for k in self.stale if isinstance(k, bytes)]
        if descs and x < 0.93:
            return rnd.choice(descs)  # another connection's, our own, or stale (R2, R3)
        d = rnd.choice(descs) if descs else b"\1" * self.desc_size
        return rnd.choice([b"", d[:-1], d + b"\0", bytearray(d), memoryview(d), d.hex(), None, 5, 1.5, [1, 2],
                           b"\0" * self.desc_size, b"\xff" * self.desc_size])

    def _offset(self, rnd: random.Random, room: int, clean: bool) -> tuple[Any, bool]:
        x = rnd.random()
        if clean or x < 0.7:
            return rnd.randint(0, max(0, room)), True
        if x < 0.95:
            return rnd.choice([-1, -room - 1, room + 1, _huge(rnd), 1 << 64, -(1 << 63)]), True
        return rnd.choice([True, False, 0.0, 1.5, "0", None, [0]]), False

    def rdma(self, rnd: random.Random, kind: str) -> None:
        clean = rnd.random() < CLEAN
        sock = self._pick_socket(rnd, self._useful(kind))
        s = self._tsock(sock)
        provider, own = self._provider_for(rnd, s)
        write = kind == "rdma_write"
        need_local, need_remote = (1, 2) if write else (2, 1)
        if not self.sync and s is not None and any(o.sock is s and o.kind == "send" and not o.op.done()
                                                   for o in self.ops):
            # A real RC queue runs in order: this transfer would wait behind a send that waits for the
            # peer's receive (the emulator lets it pass). Waiting for it here would only time out.
            return
        desc = self._descriptor(rnd, s, need_remote, clean)
        win = None
        if s is not None and s.peer is not None and isinstance(desc, (bytes, bytearray, memoryview)):
            win = next((r for r in self._recs(s.peer, "rdma") if r.key == bytes(desc)), None)
        budget = win.loc[2] if win is not None and (clean or rnd.random() < 0.8) else None
        buffers, entries, list_fault = self._entries(rnd, s, need_local, clean, budget)
        total = sum(e.loc[2] for e in entries if e.loc is not None)
        offset, offset_ok = self._offset(rnd, (win.loc[2] - total) if win is not None else 64, clean)
        what = (f"{kind}({s or repr(sock)[:40]}, {[e.item for e in entries]!r:.300} (list fault {list_fault}), "
                f"{desc!r:.60}, {offset!r}) [own={own}]")
        before = self.snap()
        result = self._outcome(what, lambda: getattr(provider, kind)(sock, buffers, desc, offset))
        completion = self._settle(what, result)
        refused = isinstance(result, BaseException)  # an error completion is checked as a call that moved nothing
        faults = {e.fault for e in entries if e.fault} | ({list_fault} if list_fault else set())
        usable = s is not None and own and not self._closed(s) and bool(before.states.get(s.index, (0, 0))[0])
        if isinstance(result, BaseException):
            if usable and faults == {"malformed"} and len(entries) <= 4 and offset_ok and win is not None:
                assert isinstance(result, TypeError), f"{what}: a malformed scatter list gave {result!r}"
            if usable and faults == {"negative"} and len(entries) <= 4 and offset_ok and win is not None:
                assert isinstance(result, SanError) and result.code in (E.WSAEINVAL, E.WSAEFAULT), f"{what}: {result!r}"
        fx = Effects()
        if s is not None:
            fx.may_change_state = {s.index} | ({s.peer.index} if s.peer is not None else set())
            fx.may_complete = set(fx.may_change_state)
        if completion is not None and completion.ok:
            assert s is not None and s.peer is not None
            local = self._local_ok(s, entries, need_local)
            remote = (win is not None and win.access & need_remote and _is_int(offset) and offset >= 0
                      and offset + total <= win.loc[2])
            if total == 0 and "verbs" in self.caps:
                # A documented alternative: a verbs NIC need not check the rkey of a zero-length transfer
                # (the IB spec), so only the peer could say whether that window is still there.
                remote = remote or (_is_int(offset) and offset >= 0)
            assert usable and not faults and offset_ok and local and remote, (
                f"{what}: completed {completion} though usable={usable} faults={faults} offset_ok={offset_ok} "
                f"local_ok={local} remote_ok={remote}")
            assert completion.bytes == total, f"{what}: {completion}, expected {total} bytes"
            if total == 0:
                self._check(what, before, self.snap(), refused, fx)
                return
            assert win is not None
            wb, woff = win.loc[0], win.loc[1] + offset
            locs = [e.loc for e in entries if e.loc is not None]
            # Source and target overlapping (a process connected to itself): what lands there is undefined.
            overlap = any(bi == wb and o < woff + total and woff < o + n for bi, o, n in locs)
            if write:
                data = b"".join(before.data[bi][o:o + n] for bi, o, n in locs)
                fx.writes.append((wb, woff, None if overlap else data, total))
            else:
                data = before.data[wb][woff:woff + total]
                pos = 0
                for bi, o, n in locs:
                    fx.writes.append((bi, o, None if overlap else data[pos:pos + n], n))
                    pos += n
        self._check(what, before, self.snap(), refused, fx)

    def _settle(self, what: str, result: Any) -> Completion | None:
        if isinstance(result, BaseException):
            return None
        try:
            done = result.wait(self.timeout)
        except Exception as exc:
            raise AssertionError(f"{what}: waiting for the operation raised {exc!r}") from exc
        assert isinstance(done, Completion), f"{what}: wait gave {done!r}"
        if not done.ok:
            assert done.bytes == 0, f"{what}: error completion {done} reports bytes"
        return done

    def message(self, rnd: random.Random, kind: str) -> None:
        clean = rnd.random() < CLEAN
        useful = self._useful(kind)
        waiting = [t for t in useful if t.peer is not None and any(o.sock is t.peer and o.kind != kind
                                                                     for o in self.ops)]
        sock = self._pick_socket(rnd, waiting if waiting and rnd.random() < 0.8 else useful)
        s = self._tsock(sock)
        provider, own = self._provider_for(rnd, s)
        if s is not None and len([o for o in self.ops if o.sock is s]) >= 4:
            return  # keep the queues short, so that sends and receives meet
        buffers, entries, list_fault = self._entries(rnd, s, 1 if kind == "send" else 2, clean,
                                                     24 if kind == "send" else None)
        what = (f"{kind}({s or repr(sock)[:40]}, {[e.item for e in entries]!r:.300} (list fault {list_fault})) "
                f"[own={own}]")
        before = self.snap()
        result = self._outcome(what, lambda: getattr(provider, kind)(sock, buffers))
        faults = {e.fault for e in entries if e.fault} | ({list_fault} if list_fault else set())
        usable = s is not None and own and not self._closed(s) and bool(before.states.get(s.index, (0, 0))[0])
        refused = isinstance(result, BaseException)
        if refused and usable and faults == {"malformed"} and len(entries) <= 4:
            assert isinstance(result, TypeError), f"{what}: a malformed scatter list gave {result!r}"
        if not refused:
            # Accepted at the call: with bad input it must end in an error completion (checked when it completes).
            assert s is not None, f"{what}: accepted ({result!r}) on a junk socket"
            locs = [e.loc for e in entries if e.loc is not None and e.fault is None]
            must_fail = not usable or bool(faults) or not self._local_ok(s, entries, 1 if kind == "send" else 2)
            self.ops.append(POp(kind, result, s, locs, [e.handle for e in entries], must_fail))
            if self.sync and must_fail:
                assert result.done() and not result.wait(0).ok, f"{what}: accepted, {result!r}"
        fx = Effects()
        if s is not None and not refused:
            fx.may_change_state = {s.index} | ({s.peer.index} if s.peer is not None else set())
            fx.may_complete = set(fx.may_change_state)
        self._check(what, before, self.snap(), refused, fx)

    # -- rules: sockets, processes, the switch ----------------------------------------------------

    def socket_calls(self, rnd: random.Random) -> None:
        """getsockopt and registrations with arbitrary arguments: refused cleanly, or an answer."""
        sock = self._pick_socket(rnd, connected=False)
        s = self._tsock(sock)
        provider, own = self._provider_for(rnd, s)
        option = rnd.choice([0x700D, 0x700E, 0x700D, 0, -1, 0x700F, "x", None, 1.5, float(0x700D), True, [0x700D]])
        what = f"getsockopt({s or repr(sock)[:40]}, {option!r}) [own={own}]"
        before = self.snap()
        result = self._outcome(what, lambda: provider.getsockopt(sock, option))
        if not isinstance(result, BaseException):
            assert s is not None and own and _is_int(option) and option in (0x700D, 0x700E), \
                f"{what}: answered {result!r}"
            assert _is_int(result) and result > 0, f"{what}: {result!r}"
        elif own and s is not None and not self._closed(s) and not (_is_int(option) and option in (0x700D, 0x700E)):
            assert isinstance(result, SanError) and result.code is E.WSAEINVAL, f"{what}: {result!r}"
        what = f"registrations({s or repr(sock)[:40]}) [own={own}]"
        result = self._outcome(what, lambda: provider.registrations(sock))
        if not isinstance(result, BaseException):
            assert s is not None and own, f"{what}: answered {result!r:.80}"
        self._check(what, before, self.snap(), True, Effects())

    def process_calls(self, rnd: random.Random) -> None:
        """alloc, buffer_at, read, write, view with arguments of the wrong type or sign: refused, nothing changes."""
        pi = rnd.randrange(len(self.procs))
        p, b = self.procs[pi], rnd.choice(self.bufs)
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("alloc", lambda: p.alloc(rnd.choice([0, -1, 1.5, "64", None, True, 1 << 62]))),
            ("buffer_at", lambda: p.buffer_at(rnd.choice([1.5, "0", None]), 8)),
            ("buffer_at", lambda: p.buffer_at(b.whole.address, rnd.choice([1.5, "8", None]))),
            ("read", lambda: b.whole.read(rnd.choice([1.5, "8", -1, b.whole.length + 1]))),
            ("read", lambda: b.whole.read(4, rnd.choice([-1, 1.5, None, b.whole.length]))),
            ("write", lambda: b.whole.write(rnd.choice([None, "text", 5, [1]]))),
            ("write", lambda: b.whole.write(b"zz", rnd.choice([-1, 1.5, None, b.whole.length - 1]))),
            ("view", lambda: b.whole.view(rnd.choice([-1, 1.5, None]), 4)),
            ("view", lambda: b.whole.view(0, rnd.choice([-1, 1.5, b.whole.length + 1]))),
        ]
        name, call = rnd.choice(calls)
        what = f"{name} on process {pi} / buffer {b.index}"
        before = self.snap()
        result = self._outcome(what, call)
        assert isinstance(result, BaseException), f"{what}: accepted, returned {result!r:.80}"
        self._check(what, before, self.snap(), True, Effects())

    def connect_sockets(self, rnd: random.Random) -> None:
        """backend.connect_sockets of two processes (or junk, or a killed process)."""
        def pick() -> tuple[Any, int | None]:
            if rnd.random() < 0.85:
                i = rnd.randrange(len(self.procs))
                return self.procs[i], i
            return rnd.choice([None, "p", 1, self.nodes[0], self.bufs[0].inner]), None
        (a, ia), (b, ib) = pick(), pick()
        what = f"connect_sockets({a!r:.40}, {b!r:.40})"
        before = self.snap()
        result = self._outcome(what, lambda: self.backend.connect_sockets(a, b))
        if not isinstance(result, BaseException):
            assert ia is not None and ib is not None and ia not in self.dead and ib not in self.dead, \
                f"{what}: accepted"
            sa, sb = result
            self._track_pair(sa, ia, sb, ib)
        self._check(what, before, self.snap(), True, Effects())

    def close(self, rnd: random.Random) -> None:
        sock = self._pick_socket(rnd, connected=False)
        s = self._tsock(sock)
        provider, own = self._provider_for(rnd, s)
        what = f"close_socket({s or repr(sock)[:40]}) [own={own}]"
        before = self.snap()
        result = self._outcome(what, lambda: provider.close_socket(sock))
        refused = isinstance(result, BaseException)
        fx = Effects()
        if not refused:
            assert s is not None and own and not before.states[s.index][1], f"{what}: accepted"
            fx.regs[s.index] = ()
            gone = before.regs.get(s.index, ())
            fx.live[s.node] = -len(gone)
            fx.may_change_state = {s.index} | ({s.peer.index} if s.peer is not None else set())
            fx.may_complete = set(fx.may_change_state)
            self._forget(s)
        self._check(what, before, self.snap(), refused, fx)

    def _forget(self, s: TSock) -> None:
        for r in [r for r in self.recs if r.sock is s]:
            self.recs.remove(r)
            self.stale.append(r.key)

    def kill(self, rnd: random.Random) -> None:
        """The victim process dies: the OS closes its sockets, its memory is gone."""
        victim = self.victim
        assert victim is not None
        what = f"kill process {victim}"
        before = self.snap()
        result = self._outcome(what, self.procs[victim].kill)
        assert not isinstance(result, BaseException), f"{what}: {result!r}"
        fx = Effects(dying={victim})
        for s in self.socks:
            if s.proc == victim:
                fx.regs[s.index] = ()
                fx.live[s.node] = fx.live.get(s.node, 0) - len(before.regs.get(s.index, ()))
                fx.may_change_state |= {s.index} | ({s.peer.index} if s.peer is not None else set())
                self._forget(s)
        fx.may_complete = set(fx.may_change_state)
        self.dead.add(victim)
        self._check(what, before, self.snap(), False, fx)

    def reconnect(self, rnd: random.Random) -> None:
        """A slot whose connection is broken or closed gets a fresh one (the old sockets stay tracked a while)."""
        broken = [i for i, (a, b) in enumerate(self.slots) if a.proc not in self.dead and b.proc not in self.dead
                  and not (a.sock.connected and b.sock.connected)]
        if not broken:
            return
        i = rnd.choice(broken)
        a, b = self.slots[i]
        try:
            self.slots[i] = self._connect(a.proc, b.proc)
        except SanError as exc:  # the link between them is down
            assert exc.code is E.WSAENETDOWN, f"reconnecting {a} and {b}: {exc!r}"

    def switch_connect(self, rnd: random.Random) -> None:
        """The switch's connect with arbitrary peers and options, sometimes with a refused allocation:
        all or nothing -- a failure leaves exactly what was there; a success closes clean."""
        def where() -> Any:
            x = rnd.random()
            if x < 0.6:
                return None
            if x < 0.8:
                return rnd.choice(self.nodes)
            if x < 0.95:
                return rnd.choice(self.procs)
            return rnd.choice(["node1", 1, object(), self.bufs[0].inner])
        options: dict[str, Any] = {}
        for name, good, bad in (("message_size", [64, 256, 4096], [8, 0, -1, "4096", 4096.0, True, 1 << 40]),
                                ("message_count", [1, 2, 8, 65], [0, -1, None, 2.0, True]),
                                ("rdma_threshold", [None, 0, 100, 4096], [-1, "x", 1.5]),
                                ("rdma_mode", ["auto", "read", "write"], ["x", None, 1])):
            if rnd.random() < 0.3:
                options[name] = rnd.choice(good if rnd.random() < 0.7 else bad)
        if rnd.random() < 0.05:
            options["bogus"] = 1
        peer, process = where(), where()
        fail = rnd.randrange(len(self.nodes)) if rnd.random() < 0.3 else None
        if fail is not None and not self._arm(fail):
            fail = None
        what = f"switch.connect(peer={peer!r:.40}, process={process!r:.40}, {options}) [fail on node {fail}]"
        before = self.snap(leaks=True)
        switch = Switch(self.backend)
        try:
            conn = self._outcome(what, lambda: switch.connect(peer=peer, process=process, **options))
        finally:
            if fail is not None:
                self._disarm(fail)
        if not isinstance(conn, BaseException):
            try:
                if rnd.random() < 0.3:  # the application's calls with junk: refused, the connection unharmed
                    junk = rnd.choice([None, "text", 5, [b"x"], 1.5])
                    bad = self._outcome(what + f" send({junk!r})", lambda: conn.local.send(junk))
                    assert isinstance(bad, TypeError), f"{what}: send({junk!r}) gave {bad!r}"
                    nbytes = rnd.choice([None, -1, 1.5, "4", True])
                    bad = self._outcome(what + f" recv({nbytes!r})", lambda: conn.remote.recv(nbytes, timeout=1.0))
                    assert isinstance(bad, (TypeError, ValueError)), f"{what}: recv({nbytes!r}) gave {bad!r}"
                data = _pattern(self.steps, rnd.choice([1, 100, 300, 5000]))
                sent = self._outcome(what + " send", lambda: conn.local.send(data))
                assert not isinstance(sent, BaseException), f"{what}: send: {sent!r}"
                got = self._outcome(what + " recv", lambda: conn.remote.recv(len(data), timeout=self.timeout))
                assert got == data, f"{what}: received {got!r:.60}"
            finally:
                closed = self._outcome(what + " close", switch.close_all)
            assert not isinstance(closed, BaseException), f"{what}: close_all: {closed!r}"
        after = self.snap(leaks=True)
        assert after.leaks == before.leaks, f"{what}: leaks before {before.leaks}, after {after.leaks}"
        self._check(what, before, after, True, Effects())

    # -- rules: the proxy -------------------------------------------------------------------------

    def proxy_memory(self, rnd: random.Random) -> None:
        """allocate / free with arbitrary sizes and objects (P2)."""
        n = rnd.randrange(len(self.nodes))
        proxy = self.nodes[n].proxy
        fx = Effects()
        if self.allocs and rnd.random() < 0.4:
            x = rnd.random()
            if x < 0.7:
                owner, allocation = rnd.choice(self.allocs)
            elif x < 0.85 and self.freed:
                owner, allocation = rnd.choice(self.freed)
            else:
                owner, allocation = -1, rnd.choice(JUNK)
            what = f"free({allocation!r:.60}) on node {n} (node {owner}'s)"
            before = self.snap()
            result = self._outcome(what, lambda: proxy.free(allocation))
            refused = isinstance(result, BaseException)
            if not refused:
                assert (owner, allocation) in self.allocs and owner == n, f"{what}: accepted"
                self.allocs.remove((owner, allocation))
                self.freed.append((owner, allocation))
                fx.live[n] = -1
            elif (owner, allocation) in self.allocs and owner == n:
                raise AssertionError(f"{what}: a live allocation of this proxy was refused: {result!r}")
        else:
            nbytes = rnd.choice([1, 100, 4096, 5000, 65536, 0, -1, -4096, True, 1.0, "4096", None, 1 << 62,
                                 1 << 64, _huge(rnd)])
            what = f"allocate({nbytes!r}) on node {n}"
            before = self.snap()
            result = self._outcome(what, lambda: proxy.allocate(nbytes))
            refused = isinstance(result, BaseException)
            if not refused:
                assert _is_int(nbytes) and 0 < nbytes < 1 << 40, f"{what}: accepted"
                self.allocs.append((n, result))
                fx.live[n] = 1
        self._check(what, before, self.snap(), refused, fx)

    def proxy_contiguous(self, rnd: random.Random) -> None:
        """allocate_contiguous / free_contiguous with arbitrary values (P4)."""
        n = rnd.randrange(len(self.nodes))
        proxy = self.nodes[n].proxy
        fx = Effects()
        caches = [CacheType.NON_CACHED, CacheType.CACHED, CacheType.WRITE_COMBINED, 0, 1, 2]
        if self.blocks and rnd.random() < 0.5:
            owner, base, nbytes, cache = rnd.choice(self.blocks)
            args = [base, nbytes, cache]
            exact = owner == n and rnd.random() < 0.6
            if not exact:
                i = rnd.randrange(3)
                args[i] = rnd.choice([args[i] + 4096, 3, True, 1.0 * args[i], None, "x", -1]) if i < 2 \
                    else rnd.choice([3, True, 1.0, None, "x", (cache + 1) % 3])
            what = f"free_contiguous{tuple(args)} on node {n} (node {owner}'s block)"
            before = self.snap()
            result = self._outcome(what, lambda: proxy.free_contiguous(*args))
            refused = isinstance(result, BaseException)
            if not refused:
                # Every node has its own memory: node n may well hold a block with the very same values.
                same = [blk for blk in self.blocks if blk[0] == n and all(_is_int(v) for v in args)
                        and (blk[1], blk[2], int(blk[3])) == (args[0], args[1], int(args[2]))]
                assert same, f"{what}: accepted"
                self.blocks.remove(same[0])
                fx.live[n] = -1
            elif exact:
                raise AssertionError(f"{what}: the exact values were refused: {result!r}")
        else:
            ok = rnd.random() < 0.7
            nbytes = rnd.choice([1, 4096, 3 * 4096 + 5, 1 << 20]) if ok else rnd.choice(
                [0, -1, 4096.0, "4096", None, True, 1 << 62])
            lowest = rnd.choice([0, 1 << 20, 1 << 32]) if ok else rnd.choice([-1, 0.0, None, "0", 1 << 70])
            highest = rnd.choice([(1 << 32) - 1, (1 << 33) - 1, 1 << 64]) if ok else rnd.choice([-1, 1.5, None, 0])
            boundary = rnd.choice([0, 0, 1 << 16, 1 << 20]) if ok else rnd.choice([-1, 1.5, None, 4096])
            cache = rnd.choice(caches) if ok else rnd.choice([3, -1, True, 1.0, None, "x"])
            args = [nbytes, lowest, highest, boundary, cache]
            what = f"allocate_contiguous{tuple(args)} on node {n}"
            before = self.snap()
            result = self._outcome(what, lambda: proxy.allocate_contiguous(*args))
            refused = isinstance(result, BaseException)
            if not refused and result is not None:
                assert all(_is_int(v) for v in args) and nbytes > 0 and lowest >= 0 and highest >= 0 \
                    and boundary >= 0 and int(cache) in (0, 1, 2), f"{what}: accepted"
                assert _is_int(result) and lowest <= result and result + nbytes - 1 <= highest, f"{what}: {result}"
                self.blocks.append((n, result, nbytes, cache))
                fx.live[n] = 1
        self._check(what, before, self.snap(), refused, fx)

    def proxy_dma(self, rnd: random.Random) -> None:
        """get_dma_adapter, common buffers and put_dma_adapter with arbitrary values (P5)."""
        n = rnd.randrange(len(self.nodes))
        proxy = self.nodes[n].proxy
        fx = Effects()
        live = [a for a in self.adapters if not a[2]]
        x = rnd.random()
        if not live or x < 0.3:
            d = DeviceDescription.zeroed()
            d.version, d.master, d.scatter_gather, d.maximum_length = 2, True, True, 1 << 20
            d.dma32, d.dma64 = rnd.choice([(True, False), (False, True)])
            good = rnd.random() < 0.6
            desc: Any = d
            if not good:
                field = rnd.choice(["version", "master", "scatter_gather", "dma32", "dma64", "maximum_length",
                                    "interface_type", "whole"])
                if field == "whole":
                    desc = rnd.choice([None, "description", DeviceDescription(), {"version": 2}])
                else:
                    setattr(d, field, rnd.choice([None, "1", 1.5, 2 if field in ("master", "dma32") else True, -1]))
            what = f"get_dma_adapter({desc!r:.120}) on node {n}"
            before = self.snap()
            result = self._outcome(what, lambda: proxy.get_dma_adapter(desc))
            refused = isinstance(result, BaseException)
            if good:
                assert not refused, f"{what}: a good description was refused: {result!r}"
            if not refused:
                self.adapters.append([n, result, False, []])
                fx.live[n] = 1
        elif x < 0.6:
            entry = rnd.choice(self.adapters)
            an, adapter, put, bufs = entry
            ok = rnd.random() < 0.7
            length = rnd.choice([1, 4096, 5 * 4096 + 3]) if ok else rnd.choice([0, -1, 1.5, "4096", None, True])
            cache = rnd.choice([True, False]) if ok or rnd.random() < 0.5 else rnd.choice([1, 0, None, "yes"])
            what = f"allocate_common_buffer({length!r}, {cache!r}) of an adapter of node {an} (put={put})"
            before = self.snap()
            result = self._outcome(what, lambda: adapter.allocate_common_buffer(length, cache))
            refused = isinstance(result, BaseException)
            if not refused and result is not None:
                assert not put and _is_int(length) and length > 0 and isinstance(cache, bool), f"{what}: accepted"
                bufs.append((length, result[1], result[0], cache))
                fx.live[an] = 1
        elif x < 0.8 and any(a[3] for a in live):
            entry = rnd.choice([a for a in live if a[3]])
            an, adapter, put, bufs = entry
            length, logical, virtual, cache = rnd.choice(bufs)
            args: list[Any] = [length, logical, virtual, cache]
            exact = rnd.random() < 0.6
            if not exact:
                i = rnd.randrange(4)
                args[i] = rnd.choice([None, "x", 1.5, True, -1] + ([args[i] + 4096] if i < 3 else [not cache, 1]))
            what = f"free_common_buffer{tuple(args)} of an adapter of node {an}"
            before = self.snap()
            result = self._outcome(what, lambda: adapter.free_common_buffer(*args))
            refused = isinstance(result, BaseException)
            if exact:
                assert not refused, f"{what}: the exact values were refused: {result!r}"
            if not refused:
                assert args == [length, logical, virtual, cache] and all(type(v) is type(w) for v, w in
                                                                         zip(args, (length, logical, virtual, cache),
                                                                             strict=True)), f"{what}: accepted"
                bufs.remove((length, logical, virtual, cache))
                fx.live[an] = -1
        else:
            entry = rnd.choice(self.adapters) if rnd.random() < 0.9 else [n, rnd.choice(JUNK), True, []]
            an, adapter, put, bufs = entry
            what = f"put_dma_adapter({adapter!r:.60}) on node {n} (of node {an}, put={put}, {len(bufs)} buffers)"
            before = self.snap()
            result = self._outcome(what, lambda: proxy.put_dma_adapter(adapter))
            refused = isinstance(result, BaseException)
            if not refused:
                assert an == n and not put and not bufs and entry in self.adapters, f"{what}: accepted"
                entry[2] = True
                fx.live[n] = -1
            elif an == n and not put and not bufs and entry in self.adapters:
                raise AssertionError(f"{what}: refused: {result!r}")
        self._check(what, before, self.snap(), refused, fx)

    # -- the rules: which calls, how often ----------------------------------------------------------
    # Hypothesis picks among the rules about evenly; each rule below picks the call. Transfers get
    # two rules, so a third of the steps move (or try to move) bytes.

    @rule(rnd=RND)
    def registration(self, rnd: random.Random) -> None:
        self._revive(rnd)
        if (self.recs or self.stale) and rnd.random() < 0.3:
            self.deregister(rnd, "rdma" if rnd.random() < 0.4 else "memory")
        else:
            self.register(rnd, "rdma" if rnd.random() < 0.45 else "memory")

    @rule(rnd=RND)
    def transfer(self, rnd: random.Random) -> None:
        self._transfer(rnd)

    @rule(rnd=RND)
    def transfer_again(self, rnd: random.Random) -> None:
        self._transfer(rnd)

    def _transfer(self, rnd: random.Random) -> None:
        self._revive(rnd)
        if rnd.random() < 0.7:
            kind = "rdma_write" if rnd.random() < 0.55 else "rdma_read"
        else:
            kind = "send" if rnd.random() < 0.5 else "recv"
        if not self._useful(kind) and rnd.random() < 0.9:
            # Nowhere could it succeed yet: register what it needs first (a connection that broke lost it all).
            self.register(rnd, "rdma" if kind.startswith("rdma") and rnd.random() < 0.5 else "memory")
        elif kind.startswith("rdma"):
            self.rdma(rnd, kind)
        else:
            self.message(rnd, kind)

    def _revive(self, rnd: random.Random) -> None:
        """Mostly, an application gives up a broken connection and makes a new one."""
        if rnd.random() < 0.5:
            self.reconnect(rnd)

    @rule(rnd=RND)
    def sockets_and_processes(self, rnd: random.Random) -> None:
        x = rnd.random()
        if x < 0.3:
            self.socket_calls(rnd)
        elif x < 0.5:
            self.process_calls(rnd)
        elif x < 0.65:
            self.connect_sockets(rnd)
        elif x < 0.8:
            self.close(rnd)
        elif x < 0.85 and self.victim is not None and self.victim not in self.dead:
            self.kill(rnd)
        elif x < 0.92 and self.backend.faults is not None and len(self.nodes) > 1:
            self.link(rnd)
        else:
            self.reconnect(rnd)

    def link(self, rnd: random.Random) -> None:
        """Drop a link between two nodes (its connections reset), or restore one."""
        faults = self.backend.faults
        assert faults is not None
        if self.down and rnd.random() < 0.6:
            a, b = self.down.pop(rnd.randrange(len(self.down)))
            faults.restore_link(self.nodes[a], self.nodes[b])
            return
        a, b = rnd.sample(range(len(self.nodes)), 2)
        what = f"drop_link(node {a}, node {b})"
        before = self.snap()
        result = self._outcome(what, lambda: faults.drop_link(self.nodes[a], self.nodes[b]))
        refused = isinstance(result, BaseException)  # a backend may not inject that fault: then nothing changes
        if not refused:
            self.down.append((a, b))
        fx = Effects()
        fx.may_change_state = {s.index for s in self.socks if s.peer is not None and {s.node, s.peer.node} == {a, b}}
        fx.may_complete = set(fx.may_change_state)
        self._check(what, before, self.snap(), refused, fx)

    def _arm(self, node: int) -> bool:
        """The proxy of ``node`` refuses its next allocation, if the backend can inject that."""
        faults = self.backend.faults
        if faults is None:
            return False
        return not isinstance(self._outcome("fail_allocations", lambda: faults.fail_allocations(self.nodes[node], 1)),
                              BaseException)

    def _disarm(self, node: int) -> None:
        faults = self.backend.faults
        assert faults is not None
        faults.fail_allocations(self.nodes[node], 0)

    @rule(rnd=RND)
    def proxy(self, rnd: random.Random) -> None:
        calls = [self.proxy_memory]
        if "contiguous" in self.caps:
            calls.append(self.proxy_contiguous)
        if "dma_adapter" in self.caps:
            calls.append(self.proxy_dma)
        rnd.choice(calls)(rnd)

    @rule(rnd=RND)
    def switch(self, rnd: random.Random) -> None:
        self.switch_connect(rnd)

    # -- invariants and the end -------------------------------------------------------------------

    @invariant()
    def tick(self) -> None:
        self.steps += 1

    def teardown(self) -> None:
        failing = sys.exc_info()[1] is not None  # hypothesis tears down in a finally: a step already failed
        try:
            self._release_everything()
        except Exception:
            if not failing:
                raise  # otherwise the step's own failure is the one to report
        finally:
            if type(self).reset_after:
                self.backend.reset()

    def _release_everything(self) -> None:
        faults = self.backend.faults
        for a, b in self.down:
            assert faults is not None
            faults.restore_link(self.nodes[a], self.nodes[b])
        # Every registration the fuzz made deregisters, one reference at a time, wherever no pending
        # operation of the socket could hold it: a refused call must not have left it marked in use.
        for s in self.socks:
            if self._closed(s) or any(o.sock is s and not o.op.done() for o in self.ops):
                continue
            for r in [r for r in self.recs if r.sock is s]:
                method = s.provider.deregister_memory if r.kind == "memory" else s.provider.deregister_rdma_memory
                result = self._outcome(f"teardown: deregister {r.kind} {r.key!r} on {s}",
                                       lambda m=method, t=s, k=r.key: m(t.sock, k))
                assert not isinstance(result, BaseException), \
                    f"teardown: deregistering {r.kind} {r.key!r} on {s} (idle) was refused: {result!r}"
                self.recs.remove(r)
            regs = self._regs_of(s)
            assert regs == (), f"teardown: {s} still has registrations {regs} the fuzz does not know of"
        for s in self.socks:
            if not self._closed(s):
                s.provider.close_socket(s.sock)
        for n, allocation in self.allocs:
            self.nodes[n].proxy.free(allocation)
        for n, base, nbytes, cache in self.blocks:
            self.nodes[n].proxy.free_contiguous(base, nbytes, cache)
        for n, adapter, put, bufs in self.adapters:
            for length, logical, virtual, cache in bufs:
                adapter.free_common_buffer(length, logical, virtual, cache)
            if not put:
                self.nodes[n].proxy.put_dma_adapter(adapter)
        leaks = [str(leak) for leak in self.backend.leaks()]
        assert not leaks, leak_message(leaks)
        live = [node.proxy.live_allocations() for node in self.nodes]
        assert not any(live), f"proxies still count live allocations after everything was released: {live}"


def fuzz_machine(make_backend: Callable[[], Any], *, timeout: float = TIMEOUT, synchronous: bool | None = None,
                 extra_check: Callable[[Any], None] | None = None, reset: bool = True) -> type[SpiFuzz]:
    """A SpiFuzz state machine class over the backends ``make_backend`` returns (one per example)."""
    return type("SpiFuzzOf", (SpiFuzz,), {
        "make_backend": staticmethod(make_backend), "timeout": timeout, "synchronous": synchronous,
        "extra_check": None if extra_check is None else staticmethod(extra_check), "reset_after": reset,
    })


def run_fuzz(make_backend: Callable[[], Any], *, max_examples: int = 100, steps: int = 40,
             derandomize: bool = False, timeout: float = TIMEOUT, synchronous: bool | None = None,
             extra_check: Callable[[Any], None] | None = None, reset: bool = True, **settings_kw: Any) -> None:
    """Fuzz the backends ``make_backend`` returns: ``max_examples`` sequences of up to ``steps`` calls.

    Raises (Hypothesis' shrunk failure, an AssertionError saying what was called with what) when an
    invariant of the module docstring breaks.
    """
    machine = fuzz_machine(make_backend, timeout=timeout, synchronous=synchronous, extra_check=extra_check,
                           reset=reset)
    options: dict[str, Any] = {
        "max_examples": max_examples, "stateful_step_count": steps, "deadline": None, "database": None,
        "derandomize": derandomize, "print_blob": True,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
    }
    options.update(settings_kw)
    run_state_machine_as_test(machine, settings=settings(**options))


def main() -> None:
    parser = argparse.ArgumentParser(description="Fuzz the emulator's SPI, proxy and switch entry points.")
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout, for tests/
    from pytest_san.spi.emulator import EmulatorBackend
    from tests.pytest_san.spi.emulator.test_fuzz_spi import emulator_internals_agree

    run_fuzz(EmulatorBackend, max_examples=args.examples, steps=args.steps, extra_check=emulator_internals_agree)
    print(f"{args.examples} examples of up to {args.steps} steps: no invariant broken")


if __name__ == "__main__":
    main()
