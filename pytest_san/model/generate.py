"""Random sequences of steps, drawn from one seeded ``random.Random`` and the model's state.

Mostly calls that can succeed (registering sub-ranges of a few buffers, transfers between live
registrations, sends meeting receives), so that sequences get far; among them the faults the
contract names: empty, overrunning, unmapped and other processes' ranges, invalid access flags, the
descriptor-size probe, stale, foreign, junk and malformed handles and descriptors, deregistering in
use, wrong access, out of bounds, another connection's descriptor, too many buffers, receives too
small, zero-byte RDMA, closing with operations pending, and closing twice.

``slow`` (a backend whose calls cross a network to a NIC) steers away from the few steps that cost
seconds there and prove nothing new: registering or deregistering RDMA memory on a socket whose send
queue is held by a waiting send (the provider waits for the window's bind), and transfers towards a
peer already in error (they end only when the transport's retries run out).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..spi.contract import MAX_SGE, SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE, Access
from .reference import Model
from .state import MReg, MSock
from .steps import (
    BUFFER_SIZES,
    Close,
    Deregister,
    Getsockopt,
    Key,
    Reconnect,
    Register,
    Scribble,
    Step,
    Transfer,
    View,
)

T = TypeVar("T")
R, W, RW = int(Access.READ), int(Access.WRITE), int(Access.READWRITE)
VALID_ACCESS = (R, W, RW)
INVALID_ACCESS = (0, 4, 7, -1)
JUNK_HANDLES: tuple[int | str, ...] = (0, 1, 0x7FFF_FFFF, "mr-1")
"""Handles no register step returned: an unknown handle of any type is WSAEINVAL or LOCAL_PROTECTION (the one
string is what a provider with string handles might hand out, yet did not on that socket)."""
TRANSFERS = ("rdma_write", "rdma_read", "send", "recv")
SGE_COUNTS = (1, 1, 1, 1, 2, 2, 2, 3, MAX_SGE, MAX_SGE + 1)
QUIET_STEPS = 8  # a close waits this many steps after the last one: connections live a while


OPTIONS = (SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE)
JUNK_OPTIONS: tuple[int | str | float, ...] = (1, "x", float(SO_MAX_RDMA_SIZE), SO_RDMA_THRESHOLD_SIZE + 1)


def weighted(rnd: random.Random, items: Sequence[T], weights: Sequence[float]) -> T:
    x = rnd.random() * sum(weights)
    for item, weight in zip(items, weights, strict=True):
        x -= weight
        if x < 0:
            return item
    return items[-1]


def mostly(rnd: random.Random, p: float = 0.9) -> bool:
    return rnd.random() < p


class Generator:
    """The next step for ``model``'s current state (call ``next``, apply the step, repeat)."""

    def __init__(self, model: Model, rnd: random.Random, *, slow: bool = False) -> None:
        self.model = model
        self.rnd = rnd
        self.slow = slow
        self.next_reg = 0
        self.next_op = 0
        self.next_sock = 2 * len(model.slots)
        self.quiet = 0  # steps since the last close
        self.moved = False  # a transfer since the last scribble

    def rules(self) -> dict[str, tuple[float, Callable[[], Step]]]:
        """The rules that can make a step now, with their weights."""
        m = self.model
        rules: dict[str, tuple[float, Callable[[], Step]]] = {"register": (3, self.register)}
        if m.regs:  # more often the more there is to deregister: registrations should live a while
            live = sum(len(s.regs) for s in self._current())
            rules["deregister"] = (min(2.0, 0.5 + 0.25 * live), self.deregister)
        if any(self._useful(op) for op in TRANSFERS):
            rules["transfer"] = (5, self.transfer)
        if self.moved:
            rules["scribble"] = (1, self.scribble)
        if self.quiet > QUIET_STEPS and m.open_sockets():
            rules["close"] = (1, self.close)
        if self._broken_slots():
            rules["reconnect"] = (2, self.reconnect)
        rules["getsockopt"] = (0.4, self.getsockopt)
        return rules

    def next(self) -> Step:
        rules = list(self.rules().values())
        rule = weighted(self.rnd, [rule for _, rule in rules], [weight for weight, _ in rules])
        self.quiet += 1
        return rule()

    # -- picking things -------------------------------------------------------------------------

    def _current(self) -> list[MSock]:
        return [s for pair in self.model.slots for s in pair]

    def _useful(self, op: str) -> list[MSock]:
        """Connected sockets on which ``op`` can succeed."""
        out = []
        for s in self._current():
            peer = s.peer
            if s.state != "connected" or peer is None or (self.slow and s.dead_peer and op != "recv"):
                continue
            if ((op == "send" and s.has("memory", R) and len(s.sq) < 3 and (self.model.traits.sends_wait or peer.recvs))
                    or (op == "recv" and s.has("memory", W) and len(s.recvs) < 3)
                    or (op == "rdma_write" and s.has("memory", R) and peer.has("rdma", W))
                    or (op == "rdma_read" and s.has("memory", W) and peer.has("rdma", R)
                        and s.node not in self.model.traits.no_read)
                    or op == "register"):
                out.append(s)
        return out

    def _pick_socket(self, fit: list[MSock], prefer: Callable[[MSock], bool] | None = None,
                     transfer: bool = False) -> MSock:
        """Mostly one of ``fit`` (``prefer``-ed ones first), sometimes any socket at all.

        Slot 0 gets most of the traffic, so that one connection gathers the registrations on both
        ends that transfers need; the other slots mostly lend their handles and descriptors."""
        rnd = self.rnd
        if fit and mostly(rnd, 0.95):
            best = [s for s in fit if prefer(s)] if prefer else []
            fit = best if best and mostly(rnd, 0.7) else fit
            return weighted(rnd, fit, [8 if s.slot == 0 else 1 for s in fit])
        anyone = [s for s in self._current() if not (self.slow and transfer and s.dead_peer)]
        return rnd.choice(anyone or self._current())

    def _sub_view(self, within: View, budget: int | None = None, large: bool = False) -> View:
        """A non-empty view inside ``within``, at most ``budget`` long; ``large``: mostly all of it."""
        pi, bi, off, n = within
        if budget is not None and budget < n:
            n = max(1, budget)
        if large and mostly(self.rnd, 0.7):
            return pi, bi, off, n
        o = self.rnd.randrange(n)
        return pi, bi, off + o, self.rnd.randint(1, n - o)

    def _any_view(self, proc: int, whole: bool = False) -> View:
        """A non-empty view of one of the buffers (``whole``: all of it), mostly of process ``proc``."""
        rnd = self.rnd
        pi = proc if mostly(rnd, 0.95) else rnd.randrange(len(self.model.plan.nodes))
        bi = rnd.randrange(len(BUFFER_SIZES))
        buffer = (pi, bi, 0, BUFFER_SIZES[bi])
        return buffer if whole else self._sub_view(buffer)

    def _seen(self, kind: str) -> list[int]:
        return [rid for rid, reg in self.model.regs.items() if reg.kind == kind and rid in self.model.keys]

    def _broken_slots(self) -> list[int]:
        return [i for i, pair in enumerate(self.model.slots)
                if any(s.state != "connected" or s.dead_peer for s in pair)]

    # -- rules ------------------------------------------------------------------------------------

    def register(self) -> Step:
        rnd = self.rnd
        kind = rnd.choice(["memory", "rdma"])
        s = self._pick_socket(self._useful("register"))
        access = rnd.choice(VALID_ACCESS if mostly(rnd, 0.93) else INVALID_ACCESS)
        gap = self._gap()
        if gap is not None and mostly(rnd, 0.4):  # what a transfer on the busiest connection lacks
            s, kind, access = gap
        if kind == "rdma" and self.slow and s.sq:
            kind = "memory"  # a window's bind would wait behind the send queue's head
        shape = "range" if mostly(rnd, 0.95) else rnd.choice(["empty", "overrun", "unmapped"])
        size = None
        if kind == "rdma" and not mostly(rnd, 0.8):
            ds = self.model.traits.desc_size
            size = rnd.choice([ds, ds + 8, 0, ds - 1])
        self.next_reg += 1
        view = self._any_view(s.proc, whole=mostly(rnd, 0.4))
        again = [r for r in s.regs.values() if r.kind == kind and r.view[0] == s.proc]
        if again and shape == "range" and not mostly(rnd, 0.85):  # R13: the same range once more
            reg = rnd.choice(again)
            view, access = reg.view, reg.access
        return Register(s.id, kind, view, access, self.next_reg, shape, size)

    def _gap(self) -> tuple[MSock, str, int] | None:
        """A registration an end of slot 0 lacks for some transfer: (socket, kind, access)."""
        gaps = [(s, kind, need) for s in self.model.slots[0] if s.state == "connected"
                for kind in ("memory", "rdma") for need in (R, W) if not s.has(kind, need)]
        if not gaps:
            return None
        s, kind, need = self.rnd.choice(gaps)
        return s, kind, need if mostly(self.rnd, 0.5) else RW

    def deregister(self) -> Step:
        """A live handle or descriptor mostly (idle ones first), else a stale or foreign one, or junk."""
        rnd, m = self.rnd, self.model
        live = sorted({r.kind for s in self._current() for r in s.regs.values()})
        kind = rnd.choice(live if live and mostly(rnd, 0.9) else ["memory", "rdma"])
        if not self._seen(kind):
            kind = "memory" if kind == "rdma" else "rdma"
        source = rnd.choice(["live", "live", "seen", "junk"])
        fit = [s for s in self._current() if any(r.kind == kind for r in s.regs.values())
               and not (self.slow and kind == "rdma" and s.sq)]
        s = self._pick_socket(fit)
        if self.slow and kind == "rdma" and s.sq:
            kind = "memory"  # the window's invalidation would wait behind the send queue's head
        mine = [r for r in s.regs.values() if r.kind == kind]
        idle = [r for r in mine if not r.users]
        seen = self._seen(kind)
        if mine and source == "live":
            key = Key(reg=rnd.choice(idle if idle and mostly(rnd, 0.8) else mine).rid)
        elif kind == "memory":
            key = Key(reg=rnd.choice(seen)) if source == "seen" and seen else Key(junk=rnd.choice(JUNK_HANDLES))
        elif not seen:
            key = Key(junk=b"")
        elif source == "junk":
            key = rnd.choice([Key(reg=rnd.choice(seen), cut=1), Key(reg=rnd.choice(seen), cut=-1), Key(junk=b""),
                              Key(junk=b"\xff" * m.traits.desc_size)])
        else:
            key = Key(reg=rnd.choice(seen))
        return Deregister(s.id, kind, key)

    def transfer(self) -> Step:
        """rdma_write, rdma_read, send or recv: one that can succeed somewhere (it may still not).

        Mostly a receive where a send waits for one, or a send where a receive waits, when there is one:
        messages that never meet test little."""
        rnd = self.rnd
        useful = {op: self._useful(op) for op in TRANSFERS}
        meets = [(op, s) for op in ("send", "recv") for s in useful[op]
                 if s.peer is not None and (s.peer.recvs if op == "send" else s.peer.sq)]
        self.moved = True
        self.next_op += 1
        if meets and mostly(rnd, 0.8 if self.slow else 0.6):  # slow: a send should not wait for seconds
            kind, s = rnd.choice(meets)
            return self._message(kind, rnd.choice(SGE_COUNTS), s)
        kinds = [op for op in TRANSFERS if useful[op]]
        kind = weighted(rnd, kinds, [3 if op.startswith("rdma") else 1 for op in kinds])
        count = rnd.choice(SGE_COUNTS)
        if kind.startswith("rdma"):
            return self._rdma(kind, count)
        return self._message(kind, count)

    def _clean(self, s: MSock) -> bool:
        """On a slow backend, no local fault where the peer has a send waiting: where only this end breaks
        (verbs), that send ends only when the transport's retries run out, seconds later."""
        return self.slow and s.peer is not None and bool(s.peer.sq)

    def _entries(self, s: MSock, count: int, need: int, *, budget: int | None = None,
                 large: bool = False) -> tuple[tuple[View, Key], ...]:
        """``count`` (view, handle) pairs: mostly inside a registration of ``s`` with ``need`` access."""
        rnd = self.rnd
        mine = [r for r in s.regs.values() if r.kind == "memory"]
        fit = [r for r in mine if r.access & need]
        seen = self._seen("memory")
        clean = self._clean(s)
        out: list[tuple[View, Key]] = []
        for _ in range(count):
            if fit and (clean or mostly(rnd, 0.97)):
                reg = rnd.choice(fit)
                view = self._sub_view(reg.view, budget, large)
                if count > 1 and rnd.random() < 0.04:  # a zero-length entry: moves nothing, its handle still counts
                    view = (view[0], view[1], view[2], 0)
                out.append((view, Key(reg=reg.rid)))
            elif mine and mostly(rnd, 0.5):  # wrong access (R6, R7) or outside the range (R8)
                reg = rnd.choice(mine)
                out.append((self._any_view(s.proc) if mostly(rnd, 0.5) else reg.view, Key(reg=reg.rid)))
            else:  # another socket's or process's handle, a stale or junk one (R1, R3), on a zero-length entry too
                key = Key(reg=rnd.choice(seen)) if seen and mostly(rnd, 0.7) else Key(junk=rnd.choice(JUNK_HANDLES))
                view = self._any_view(s.proc)
                out.append(((view[0], view[1], view[2], 0) if rnd.random() < 0.5 else view, key))
            if budget is not None:
                budget = max(1, budget - out[-1][0][3])
        return tuple(out)

    def _rdma(self, kind: str, count: int) -> Step:
        rnd, m = self.rnd, self.model
        write = kind == "rdma_write"
        need, local_need = (W, R) if write else (R, W)
        s = self._pick_socket(self._useful(kind), transfer=True)
        assert s.peer is not None
        windows = [r for r in s.peer.regs.values() if r.kind == "rdma"]
        fit = [r for r in windows if r.access & need]
        seen = self._seen("rdma")
        win: MReg | None = None
        choice = rnd.random()
        if fit and choice < 0.93:
            win = rnd.choice(fit)
        elif windows and choice < 0.95:  # R6, R7: the wrong access
            win = rnd.choice(windows)
        if win is not None:
            desc = Key(reg=win.rid)
        elif seen and choice < 0.99:  # another connection's, our own, or stale (R2, R3)
            desc = Key(reg=rnd.choice(seen))
        else:
            ds = m.traits.desc_size
            desc = Key(junk=rnd.choice([b"", b"\0" * 4, b"\x01" * (ds + 1), b"\x01" * (ds - 1)]))
        if mostly(rnd, 0.97) or self._clean(s):
            entries = self._entries(s, count, local_need, budget=win.view[3] if win else None, large=not write)
        else:  # zero bytes: nothing to move
            entries = ()
        total = sum(v[3] for v, _ in entries)
        if win is not None and mostly(rnd, 0.95):
            offset = rnd.randint(0, max(0, win.view[3] - total))
        else:  # R8: maybe out of bounds
            offset = rnd.randint(-2, 70)
        return Transfer(s.id, kind, entries, self.next_op, desc, offset)

    def _message(self, kind: str, count: int, s: MSock | None = None) -> Step:
        if s is None:
            s = self._pick_socket(self._useful(kind), transfer=kind == "send")
        send = kind == "send"
        entries = self._entries(s, count, R if send else W, budget=16 if send else None, large=not send)
        return Transfer(s.id, kind, entries, self.next_op)

    def scribble(self) -> Step:
        """The application writes its own memory (never under a pending operation)."""
        self.moved = False
        rnd = self.rnd
        view = self._any_view(rnd.randrange(len(self.model.plan.nodes)))
        pi, bi, off, n = view
        for op in self.model.ops.values():
            if any((v[0], v[1]) == (pi, bi) and v[2] < off + n and off < v[2] + v[3] for v in op.views):
                return self.register()
        return Scribble(view, rnd.randrange(251))

    def close(self) -> Step:
        self.quiet = 0
        current = self._current()
        open_ = [s for s in current if s.state != "closed"]
        return Close(self.rnd.choice(current if not open_ or self.rnd.random() < 0.1 else open_).id)

    def getsockopt(self) -> Step:
        """Mostly an option of an open socket; else a closed socket, the peer's provider, or a junk option."""
        rnd = self.rnd
        known = list(self.model.socks.values())
        open_ = [s for s in known if s.state != "closed"]
        s = rnd.choice(open_ if open_ and mostly(rnd, 0.8) else known)
        option = rnd.choice(OPTIONS) if mostly(rnd, 0.85) else rnd.choice(JUNK_OPTIONS)
        return Getsockopt(s.id, option, foreign=s.peer is not None and rnd.random() < 0.1)

    def reconnect(self) -> Step:
        """The application gives up a broken or closed connection: closes what is left, connects anew."""
        slot = self.rnd.choice(self._broken_slots())
        ids = (self.next_sock, self.next_sock + 1)
        self.next_sock += 2
        return Reconnect(slot, ids)
