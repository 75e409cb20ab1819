"""Every kind of bad value each argument of each SPI call can carry, generated from the reference order
(``pytest_san.spi.checks.ORDER``, CONTRACT.md section 4), and a world to make the calls in.

``KINDS`` says, for each check of the table, the bad values that trip it and the argument (or part of one: a
buffer's process, an entry of a scatter list) each goes in; ``SLOTS`` is generated from it and ``ORDER``: for every
call, every check it makes, every kind, in every argument position it has (each entry of a scatter list, the
second being a zero-length entry). Nothing is listed per call by hand. ``NOT_MADE`` says which checks no case
trips, and why.

Two uses:

* the suite (``pytest_san/scenarios/test_every_argument.py``): every fault alone, on any provider: the contract's
  answer (one fault leaves a provider no choice) and "a refused call changes nothing"; the faults found after the
  call (``entry.handle``: a stale, junk or another socket's handle, on a zero-length entry too) each on a fresh
  connection: an error completion, LOCAL_PROTECTION, 0 bytes;
* the project's tests (``tests/support/fault_pairs.py``): every pair of call-time faults, against a backend that
  follows the reference order, where the answer is the fault that comes first in ``ORDER``.

For each case the call is made on one backend through the public API and must

* be refused with the answer of the fault that comes first in ``pytest_san.spi.checks.ORDER`` (a TypeError, or the
  SanError code; WSAEFAULT of the descriptor-size probe carries the size needed), and
* change nothing: every registration of the world's sockets, both proxies' live allocations, every byte of
  its buffers, every socket's state and its pending operations are as before.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from pytest_san.batch import Batch, Later, batch, is_closed, is_connected
from pytest_san.spi import checks
from pytest_san.spi.burst import rdma_read_burst, rdma_write_burst
from pytest_san.spi.checks import first
from pytest_san.spi.contract import (
    DESCRIPTOR_SIZE,
    MAX_SGE,
    PAGE_SIZE,
    QUEUE_DEPTH,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    Access,
    SanError,
)
from pytest_san.spi.protocols import Backend

BUF = 64  # bytes of each of the world's buffers


@dataclasses.dataclass(frozen=True)
class Fault:
    slot: str  # the argument, or the part of one, that it spoils
    check: str  # the pytest_san.spi.checks id it trips
    name: str
    replaces: bool = False  # it replaces the whole slot: no fault of a part of it can go with it

    def __str__(self) -> str:
        return f"{self.slot}: {self.name}"


KINDS: dict[str, tuple[tuple[str, str], ...]] = {
    "burst": (("count", "0"), ("count", "'2'"), ("depth", "0")),
    "socket": (("socket", "closed"), ("socket", "another host's"), ("socket", "no socket (42)")),
    "connected": (("socket", "its peer closed"),),
    "queue": (("socket", f"{QUEUE_DEPTH} receives pending"),),
    "buffer.type": (("buffer", "no buffer (42)"),),
    "buffer.owner": (("buffer.process", "another host's"),),
    "buffer.range": (("buffer.range", "length -8"), ("buffer.range", "length 8.0")),
    "buffer.empty": (("buffer.range", "length 0"),),
    "buffer.mapped": (("buffer.range", "one byte past its last page"),),
    "access": (("access", "0"), ("access", "True"), ("access", "4")),
    "descriptor_size.type": (("descriptor_size", "'20'"),),
    "descriptor_size.small": (("descriptor_size", "4"),),
    "list.type": (("local_buffers", "'x'"),),
    "list.count": (("local_buffers", f"{MAX_SGE + 1} entries"),),
    "entry.shape": (("local_buffers[{i}]", "None"), ("local_buffers[{i}]", "(42, handle)")),
    "entry.owner": (("local_buffers[{i}].process", "another host's"),),
    "entry.range": (("local_buffers[{i}].range", "length -8"), ("local_buffers[{i}].range", "length 8.0")),
    "descriptor": (("descriptor", "4 bytes"), ("descriptor", "a str")),
    "offset": (("offset", "1.0"), ("offset", "None")),
    "handle": (("handle", "unknown"), ("handle", "'7'"), ("handle", "stale"), ("handle", "another socket's")),
    "descriptor.registered": (("descriptor", "unknown"), ("descriptor", "stale"), ("descriptor", "another host's")),
    "in_use": (("handle", "a pending receive's"),),
    "option": (("option", "1"), ("option", "'x'"), ("option", f"{float(SO_MAX_RDMA_SIZE)}")),
    "entry.handle": (("local_buffers[{i}].handle", "stale"), ("local_buffers[{i}].handle", "junk"),
                     ("local_buffers[{i}].handle", "another socket's")),
}
"""For each check of the reference order, the bad values that trip it, each with the argument it goes in
(``{i}``: every entry of a scatter list). The checks without one are ``NOT_MADE``."""

REPLACES = {"buffer", "local_buffers"} | {f"local_buffers[{i}]" for i in range(2)}
"""Slots whose bad value replaces the whole argument: no fault of a part of it can go with it."""

QUEUE_CALLS = ("recv",)
"""The calls whose queue can be filled without ending the connection (a full send queue needs sends the peer
never receives: that ends the connection on iWARP)."""

IN_USE_CALLS = ("deregister_memory",)
"""An RDMA descriptor is never in use by its own socket's operations: only a handle's deregistration trips
``in_use``."""


def entries_of(call: str) -> tuple[int, ...]:
    """The scatter list positions a call's cases fill: two (the second a zero-length entry), one for a burst
    (each entry costs a round trip more)."""
    if call not in checks.ORDER or not any(c.id == "list.type" for c in checks.ORDER[call]):
        return ()
    return (0,) if call.endswith("_burst") else (0, 1)


def _generate(at_call: bool) -> dict[str, list[Fault]]:
    out: dict[str, list[Fault]] = {}
    for call in checks.CALLS:
        faults: list[Fault] = []
        for check in checks.ORDER[call]:
            if check.at_call != at_call or check.id not in KINDS:
                continue
            if (check.id == "queue" and call not in QUEUE_CALLS) or (check.id == "in_use"
                                                                      and call not in IN_USE_CALLS):
                continue
            for slot, name in KINDS[check.id]:
                for i in (entries_of(call) if "{i}" in slot else (None,)):
                    where = slot.format(i=i) if i is not None else slot
                    faults.append(Fault(where, check.id, name, replaces=where in REPLACES))
        out[call] = faults
    return out


SLOTS: dict[str, list[Fault]] = _generate(at_call=True)
"""The faults each argument of each call can carry at the call, generated from ``KINDS`` and ``ORDER``."""

AFTER_CALL: dict[str, list[Fault]] = {call: faults for call, faults in _generate(at_call=False).items() if faults}
"""The faults found after the call returned (``entry.handle``), per transfer call."""


NOT_MADE: dict[str, str] = {
    "read": "the reference backends all have RDMA read (a provider without it answers WSAEOPNOTSUPP first)",
    "device": "only a device with fewer entries than the contract's trips it (siw's RDMA read: max_sge_rd 1)",
    "resources": "needs the proxy to fail (capability faults, the emulator's only)",
    "queue": "a full send queue needs sends the peer never receives: ends the connection on iWARP (recv only)",
    "in_use": "an RDMA descriptor is never in use by its own socket's operations (deregister_memory only)",
    "remote": "the peer's window's faults: judged by the bounds, access and lifetime scenarios (R3-R8)",
}
"""Checks of the table no case trips, and why (tests/pytest_san/spi/emulator/test_fault_pairs.py holds the rest
to SLOTS)."""


def _compatible(a: Fault, b: Fault) -> bool:
    if a.slot == b.slot:
        return False
    for outer, inner in ((a, b), (b, a)):
        if outer.replaces and inner.slot.startswith((outer.slot + ".", outer.slot + "[")):
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Case:
    call: str
    faults: tuple[Fault, ...]

    @property
    def id(self) -> str:
        return f"{self.call}({'; '.join(map(str, self.faults))})"

    @property
    def expected(self) -> str:
        return first(self.call, [f.check for f in self.faults])

    def fault(self, slot: str) -> str | None:
        return next((f.name for f in self.faults if f.slot == slot), None)


def cases(calls: Sequence[str] = tuple(SLOTS), pairs: bool = True) -> list[Case]:
    """Every fault alone and (``pairs``) every pair of compatible faults, of every call (close_socket takes one
    argument)."""
    out = []
    for call in calls:
        faults = SLOTS[call]
        out += [Case(call, (f,)) for f in faults]
        if pairs:
            out += [Case(call, (a, b)) for a, b in itertools.combinations(faults, 2) if _compatible(a, b)]
    return out


def sample(all_cases: list[Case], size: int | None, seed: int) -> list[Case]:
    """``size`` cases drawn with ``seed`` (all of them when ``size`` is None or not smaller)."""
    if size is None or size >= len(all_cases):
        return list(all_cases)
    return sorted(random.Random(seed).sample(all_cases, size), key=all_cases.index)


class World:
    """Two nodes' default processes, their buffers and sockets, for refused calls to leave as they found them.

    ``sa``-``sb``: the connection every good argument uses (``h`` a READWRITE handle of ``src`` on ``sa``,
    ``desc`` a READWRITE window of ``dst`` on ``sb``, ``mine`` a READ window of ``src`` on ``sa``); ``sc``: a
    closed socket of node 0; ``sd``: one whose peer closed; ``sq``: one with a full receive queue; ``so``: another
    open connection, with a handle ``ho`` of its own; ``pending``: a receive on ``sa`` holding ``hu`` in use;
    ``stale`` and ``stale_desc``: a handle and a window of ``sa`` deregistered before.
    """

    def __init__(self, backend: Backend, scatter_read: bool | None = None) -> None:
        self.backend = backend
        # Whether an RDMA read gets two entries (else one: a device may read into one buffer only).
        self.scatter_read = "rdma_read_scatter" in backend.capabilities if scatter_read is None else scatter_read
        a, b = backend.nodes[0], backend.nodes[1]
        self.pa, self.pb = a.default_process, b.default_process
        self.provider, self.peer = a.provider, b.provider
        self.src, self.dst, self.other = self.pa.alloc(BUF), self.pb.alloc(BUF), self.pb.alloc(BUF)
        self.src.write(bytes(range(1, BUF + 1)))
        self.dst.write(bytes(range(101, 101 + BUF)))
        self.sa, self.sb = backend.connect_sockets(self.pa, self.pb)
        self.sc, closed_peer = backend.connect_sockets(self.pa, self.pb)
        self.sd, gone = backend.connect_sockets(self.pa, self.pb)
        for used in (self.sc, self.sd):  # used before it closed: nothing it answered then may answer for it after
            for option in (SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE):
                self.provider.getsockopt(used, option)
        self.provider.close_socket(self.sc)
        self.peer.close_socket(closed_peer)
        self.peer.close_socket(gone)
        self.sq, self.sq_peer = backend.connect_sockets(self.pa, self.pb)
        self.so, self.so_peer = backend.connect_sockets(self.pa, self.pb)
        self.ho = self.provider.register_memory(self.so, self.src.view(0, 16), Access.READWRITE)
        self.stale = self.provider.register_memory(self.sa, self.src.view(8, 8), Access.READ)
        self.provider.deregister_memory(self.sa, self.stale)
        self.stale_desc = self.provider.register_rdma_memory(self.sa, self.src.view(24, 8), Access.READ)
        self.provider.deregister_rdma_memory(self.sa, self.stale_desc)
        self.mine = self.provider.register_rdma_memory(self.sa, self.src.view(16, 16), Access.READ)
        self.h = self.provider.register_memory(self.sa, self.src, Access.READWRITE)
        self.hu = self.provider.register_memory(self.sa, self.src.view(48, 16), Access.WRITE)
        self.desc = self.peer.register_rdma_memory(self.sb, self.dst, Access.READWRITE)
        self.size = len(self.desc)  # the provider's descriptor size (pytest-san's is DESCRIPTOR_SIZE; longer is legal)
        self.pending = self.provider.recv(self.sa, [(self.src.view(48, 16), self.hu)])
        self.hq = self.provider.register_memory(self.sq, self.src.view(32, 16), Access.WRITE)
        self.queued = [self.provider.recv(self.sq, [(self.src.view(32, 16), self.hq)]) for _ in range(QUEUE_DEPTH)]
        self.baseline = self.snapshot()

    def looks(self, b: Batch) -> list[tuple[str, Later[object]]]:
        """What no refused call may change, each named, added to ``b``."""
        p, q = self.provider, self.peer
        return [("registrations of sa", b.call(p.registrations, self.sa)),
                ("registrations of sq", b.call(p.registrations, self.sq)),
                ("registrations of so", b.call(p.registrations, self.so)),
                ("registrations of sb", b.call(q.registrations, self.sb)),
                ("live allocations of node 0", b.call(self.backend.nodes[0].proxy.live_allocations)),
                ("live allocations of node 1", b.call(self.backend.nodes[1].proxy.live_allocations)),
                ("src", b.call(self.src.read)), ("dst", b.call(self.dst.read)),
                *[(f"{name} {what.__name__}", b.call(what, s))
                  for name, s in (("sa", self.sa), ("sb", self.sb), ("sc", self.sc), ("sd", self.sd), ("sq", self.sq),
                                  ("so", self.so))
                  for what in (is_connected, is_closed)],
                ("pending done", b.call(self.pending.done)), ("queued[0] done", b.call(self.queued[0].done))]

    def snapshot(self) -> dict[str, object]:
        """What no refused call may change, read together (one round trip per host where the backend can)."""
        with batch(self.backend) as b:
            looks = self.looks(b)
        out: dict[str, object] = {}
        for name, later in looks:
            value = later.value
            if name.startswith("registrations"):
                value = sorted((r.kind, r.address, r.length, int(r.access), r.refs) for r in cast(Any, value))
            out[name] = value
        return out

    # -- building a case's arguments ---------------------------------------------------------------------

    def socket(self, case: Case) -> Any:
        return {None: self.sa, "closed": self.sc, "another host's": self.sb, "no socket (42)": 42,
                "its peer closed": self.sd, f"{QUEUE_DEPTH} receives pending": self.sq}[case.fault("socket")]

    def _range(self, fault: str | None, process: Any, mine: Any, theirs: Any) -> Any:
        """The buffer of a slot: ``mine`` (or ``theirs``, of ``process``) with the range fault applied."""
        buffer = mine if process is self.pa else theirs
        if fault is None:
            return buffer
        page_end = -(-(buffer.address + 1) // PAGE_SIZE) * PAGE_SIZE  # the world's buffers are smaller than a page
        address, n = {"length -8": (buffer.address, -8), "length 8.0": (buffer.address, 8.0),
                      "length 0": (buffer.address, 0),
                      "one byte past its last page": (buffer.address, page_end - buffer.address + 1)}[fault]
        return types.SimpleNamespace(address=address, length=n, process=process)

    def buffer(self, case: Case) -> Any:
        if case.fault("buffer") is not None:
            return 42
        process = self.pb if case.fault("buffer.process") else self.pa
        return self._range(case.fault("buffer.range"), process, self.src.view(0, 16), self.other.view(0, 16))

    def entries(self, case: Case) -> Any:
        whole = case.fault("local_buffers")
        if whole == "'x'":
            return "x"
        out: list[Any] = []
        for i, (offset, length) in enumerate(((0, 16), (16, 0))):
            slot = f"local_buffers[{i}]"
            shape = case.fault(slot)
            if shape == "None":
                out.append(None)
                continue
            if shape == "(42, handle)":
                out.append((42, self.h))
                continue
            process = self.pb if case.fault(f"{slot}.process") else self.pa
            buffer = self._range(case.fault(f"{slot}.range"), process, self.src.view(offset, length),
                                 self.other.view(offset, length))
            out.append((buffer, self.h))
        if case.call.endswith("_burst") or (case.call.startswith("rdma_read") and not self.scatter_read):
            out = out[:1]  # a device may read into one buffer only (without ``rdma_read_scatter``)
        if whole is not None:  # too many entries
            out += [(self.src.view(0, 16), self.h)] * (MAX_SGE + 1 - len(out))
        return out

    def target(self, case: Case) -> tuple[Any, Any]:
        descriptor = {None: self.desc, "4 bytes": b"\0" * 4, "a str": "x" * self.size}[case.fault("descriptor")]
        offset = {None: 0, "1.0": 1.0, "None": None}[case.fault("offset")]
        return descriptor, offset

    def make(self, case: Case) -> Callable[[], object]:
        """The call of ``case``, ready to make."""
        p: Any = self.provider  # the bad values are of the wrong types on purpose
        sock, call = self.socket(case), case.call
        if call.startswith("register"):
            access = {None: Access.READ, "0": 0, "True": True, "4": 4}[case.fault("access")]
            if call == "register_memory":
                return lambda: p.register_memory(sock, self.buffer(case), access)
            size = {None: None, "'20'": "20", "4": 4}[case.fault("descriptor_size")]
            return lambda: p.register_rdma_memory(sock, self.buffer(case), access, size)
        if call == "deregister_memory":
            handle = {None: self.h, "unknown": 0x7FFF_FFFF, "'7'": "7", "a pending receive's": self.hu,
                      "stale": self.stale, "another socket's": self.ho}[case.fault("handle")]
            return lambda: p.deregister_memory(sock, handle)
        if call == "deregister_rdma_memory":
            desc = {None: self.mine, "4 bytes": b"\0" * 4, "a str": "x" * self.size,
                    "unknown": b"\xff" * self.size, "stale": self.stale_desc,
                    "another host's": self.desc}[case.fault("descriptor")]
            return lambda: p.deregister_rdma_memory(sock, desc)
        if call == "getsockopt":
            option = {None: SO_RDMA_THRESHOLD_SIZE, "1": 1, "'x'": "x",
                      f"{float(SO_MAX_RDMA_SIZE)}": float(SO_MAX_RDMA_SIZE)}[case.fault("option")]
            return lambda: p.getsockopt(sock, option)
        if call == "close_socket":
            return lambda: p.close_socket(sock)
        entries = self.entries(case)
        if call in ("send", "recv"):
            return lambda: getattr(p, call)(sock, entries)
        descriptor, offset = self.target(case)
        if call in ("rdma_write", "rdma_read"):
            return lambda: getattr(p, call)(sock, entries, descriptor, offset)
        count: Any = {None: 2, "0": 0, "'2'": "2"}[case.fault("count")]  # a bad one on purpose
        depth: Any = {None: 1, "0": 0}[case.fault("depth")]
        burst = rdma_write_burst if call == "rdma_write_burst" else rdma_read_burst
        return lambda: burst(p, sock, entries, descriptor, offset, count=count, depth=depth)

    def close(self) -> None:
        for sock in (self.sa, self.sb, self.sd, self.sq, self.sq_peer, self.so, self.so_peer):
            owner = self.provider if sock in (self.sa, self.sd, self.sq, self.so) else self.peer
            owner.close_socket(sock)


def answer_of(outcome: BaseException | None) -> str:
    if outcome is None:
        return "returned"
    if isinstance(outcome, SanError):
        return outcome.code.name + (f" (required_size {outcome.required_size})" if outcome.required_size else "")
    return type(outcome).__name__


def want(case: Case, descriptor_size: int = DESCRIPTOR_SIZE) -> str:
    """The table's answer to ``case``; the descriptor-size probe's carries the provider's own size (a descriptor
    longer than pytest-san's is legal)."""
    from pytest_san.spi.checks import answer

    expected = answer(case.call, case.expected)
    return expected + (f" (required_size {descriptor_size})" if case.expected == "descriptor_size.small" else "")


def run_cases(backend: Backend, chosen: Sequence[Case], answers: dict[str, str] | None = None,
              scatter_read: bool | None = None) -> list[str]:
    """Make every case of ``chosen`` on ``backend``: the problems found (empty: every answer is the table's and
    nothing changed). ``answers`` gets each case's answer, by its id."""
    world = World(backend, scatter_read)
    problems = []
    try:
        for case in chosen:
            try:
                world.make(case)()
                outcome: BaseException | None = None
            except (SanError, TypeError, ValueError) as exc:
                outcome = exc
            got, expected = answer_of(outcome), want(case, world.size)
            if answers is not None:
                answers[case.id] = got
            if got != expected:
                problems.append(f"{case.id}: answered {got}, the table says {expected} ({case.expected})")
            after = world.snapshot()
            if after != world.baseline:
                changed = [name for name, was in world.baseline.items() if after[name] != was]
                problems.append(f"{case.id}: changed {', '.join(changed)}")
                break  # the world is not what the next case expects
    finally:
        world.close()
    leaks = backend.leaks()
    if leaks:
        problems.append(f"left behind: {leaks}")
    return problems


def by_call(chosen: Sequence[Case]) -> Iterator[tuple[str, list[Case]]]:
    for call in SLOTS:
        picked = [c for c in chosen if c.call == call]
        if picked:
            yield call, picked
