"""The reference model's records (registrations, sockets, pending operations) and what it expects of a step."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

from ..spi.contract import Status
from .steps import View

KeyValue = Hashable
"""A handle (opaque: any hashable value the provider chose, compared by equality) or a descriptor (bytes) as
one backend returned it."""


@dataclasses.dataclass(frozen=True)
class Traits:
    """What the model expects of a backend besides the steps, computed once for each side of a run:

    - ``alts``: the documented alternatives it may take (alternatives.py);
    - ``desc_size``: the descriptor size its ``descriptor_size`` probe said (0 until a sequence has probed);
    - ``sends_wait``: capability ``send_waits`` (False on iWARP: a send no receive waits for ends the connection);
    - ``no_read``: the nodes (indices of the plan) whose provider lacks RdmaRead;
    - ``reference_order``: every node answers a call with several faults in the reference order.
    """

    alts: frozenset[str] = frozenset()
    desc_size: int = 0
    sends_wait: bool = True
    no_read: frozenset[int] = frozenset()
    reference_order: bool = False


def not_a_key(kind: str, value: object, desc_size: int) -> str:
    """Why ``value``, returned by a register call of ``kind``, is no key ("" when it is one): a handle is any
    hashable value but None (CONTRACT.md section 2), a descriptor bytes of the size the probe said."""
    if kind == "memory":
        if value is None:
            return "not a handle (None)"
        try:
            hash(value)
        except Exception:
            return "not a handle (unhashable)"
        return ""
    if not isinstance(value, bytes) or len(value) != desc_size:
        return f"not a descriptor of {desc_size} bytes (the size the descriptor_size probe said)"
    return ""

Statuses = frozenset[Status]


@dataclasses.dataclass(eq=False)
class MReg:
    """A registration (live or, once released, stale)."""

    kind: str  # "memory" | "rdma"
    view: View
    access: int
    sock: MSock
    rid: int  # the register step that made it: later steps name its key Key(reg=rid)
    key: KeyValue | None = None  # bound when the backend returned it
    refs: int = 1
    calls: int = 1  # register calls it answered since it was made: a provider may pin once for each (R12)
    users: int = 0  # pending operations using it
    live: bool = True


@dataclasses.dataclass(eq=False)
class MOp:
    """A pending operation (or, on a backend with an in-order send queue, a queued RDMA transfer)."""

    id: int
    kind: str
    sock: MSock
    views: list[View]
    regs: list[MReg]
    nic_bad: bool = False  # a handle only the NIC can refuse: it fails when the NIC reaches it
    desc: bytes = b""
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return sum(v[3] for v in self.views)


@dataclasses.dataclass(eq=False)
class MSock:
    id: int
    proc: int
    node: int
    slot: int
    state: str = "connected"  # connected | error | disconnected | closed
    peer: MSock | None = None
    regs: dict[int, MReg] = dataclasses.field(default_factory=dict)  # live, by the register step that made each
    recvs: list[MOp] = dataclasses.field(default_factory=list)  # posted receives not yet matched
    sq: list[MOp] = dataclasses.field(default_factory=list)  # sends waiting for a receive, and what queues behind
    dead_peer: bool = False  # the peer went to error without telling this end (local-error-breaks-local-end)
    released: set[bytes] = dataclasses.field(default_factory=set)  # descriptors deregistered here: never again (R3)

    def live(self, kind: str, key: object) -> MReg | None:
        """The live registration of ``kind`` whose key is ``key`` (by value: a backend may reuse keys)."""
        for reg in self.regs.values():
            if reg.kind == kind and type(reg.key) is type(key) and reg.key == key:
                return reg
        return None

    def same(self, kind: str, view: View, access: int) -> list[MReg]:
        """The live registrations of exactly this range and access: one, or (a provider that answers each
        registration with a new key, as R13 allows) several."""
        return [r for r in self.regs.values() if r.kind == kind and r.view == view and r.access == access]

    def has(self, kind: str, need: int) -> bool:
        return any(r.kind == kind and r.access & need for r in self.regs.values())

    def pending(self) -> list[MOp]:
        return [*self.recvs, *self.sq]

    def __repr__(self) -> str:
        return f"s{self.id}({self.state})"


@dataclasses.dataclass
class Touched:
    """What a step could change: what a remote backend checks after it (each check is a round trip)."""

    buffers: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # a transfer could write
    registrations: set[int] = dataclasses.field(default_factory=set)  # sockets (register, deregister, close)
    states: set[int] = dataclasses.field(default_factory=set)  # sockets whose state the step changed
    pending: set[int] = dataclasses.field(default_factory=set)  # sockets whose pending operations could complete
    nodes: set[int] = dataclasses.field(default_factory=set)  # proxies whose live count changed


@dataclasses.dataclass
class Expect:
    """What the model expects of one step.

    ``raises``: the error codes (names) one of which the call must raise; empty: it returns (``returns``
    says what). ``done``: the operations that complete in this step, each with the statuses accepted and
    its byte count. ``same``: the live registration of the same range a register call adds a reference to --
    unless it answers with a key of its own, which R13 allows (``Model.bind`` then makes it a registration).
    ``instead``: a documented alternative's id -> the error codes the call may raise instead of returning as
    expected (a refusal at the call, which changes nothing: ``Model.answered`` then undoes the step).
    """

    skip: str = ""
    raises: frozenset[str] = frozenset()
    returns: str = "none"  # none | handle | descriptor | op | value
    done: dict[int, tuple[Statuses, int]] = dataclasses.field(default_factory=dict)
    same: MReg | None = None
    fresh: MReg | None = None  # a new registration: its key is bound to it
    alternatives: set[str] = dataclasses.field(default_factory=set)
    instead: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    touched: Touched = dataclasses.field(default_factory=Touched)

    def summary(self) -> tuple[object, ...]:
        """What two backends' models must agree on for their answers to be compared (differential mode)."""
        done = sorted((op, tuple(sorted(s.name for s in statuses)), n) for op, (statuses, n) in self.done.items())
        return self.skip != "", self.raises, self.returns, tuple(done)
