"""What a backend handed out in one sequence, by the names the steps use, and the reads of its state.

A step names sockets and operations by index (``s3``, ``op#2``); ``Handles`` holds what those are on one
backend: its sockets, the node each lives on, and the pending operations its calls returned. What the
engine asks of the backend is made here: a step as one batch (``make``), the reads a check compares
(``reads``), the closes at a sequence's end; the checks themselves are in invariants.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..batch import Batch, Later, batch, is_closed, is_connected, wait_for
from ..spi.contract import Completion
from ..spi.protocols import PendingOperation, Provider, Socket
from .invariants import Asked, Checked
from .kinds import kind_of
from .state import Expect
from .steps import Step
from .world import World

if TYPE_CHECKING:
    from .reference import Model

Looked = tuple[Checked, dict[Asked, Later[Any]]]
"""What a step's batch read for the check after it: what it was to compare, and each read's ``Later``."""


@dataclasses.dataclass
class Made:
    """A step made: what its call returned or raised, the waits for the completions the model expected (empty
    when the call raised: those are looked at one by one), and what the batch read for the check."""

    result: object
    waits: dict[int, Later[Completion]]
    looked: Looked | None


Closing = tuple[int, Expect, Later[None], dict[int, Later[Completion]]]
"""A close made in a batch: the socket, what the model expects of it, the close's ``Later``, its waits."""


class Handles:
    """``world``'s sockets and pending operations in the sequence running on it."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.socks: dict[int, Socket] = {}
        self.nodes_of: dict[int, int] = {}  # socket -> the index of its node
        self.ops: dict[int, PendingOperation] = {}
        self.popped: dict[int, PendingOperation] = {}  # completed since the step's call (a race may judge it twice)
        self.posted: dict[int, float] = {}  # op -> when it was posted (time.monotonic)

    def forget(self) -> None:
        """A new sequence: no socket, no operation (when each operation was posted is kept)."""
        self.socks, self.nodes_of, self.ops = {}, {}, {}

    def connect_all(self) -> None:
        """Every connection slot's sockets, connected at once (a lab: every host's listens in one round trip,
        then its connects)."""
        self.forget()
        world = self.world
        slots = range(len(world.plan.slots))
        with batch(world.backend) as b:
            connects = [b.call(world.backend.connect_sockets, *world.pair(slot)) for slot in slots]
        for slot, connected in zip(slots, connects, strict=True):
            self.connected(slot, (2 * slot, 2 * slot + 1), connected.value)

    def connected(self, slot: int, ids: tuple[int, int], pair: tuple[Socket, Socket]) -> None:
        """Connection slot ``slot``'s sockets ``pair``, named ``ids`` by the steps."""
        plan = self.world.plan
        self.socks[ids[0]], self.socks[ids[1]] = pair
        for sock_id, proc in zip(ids, plan.slots[slot], strict=True):
            self.nodes_of[sock_id] = plan.nodes[proc]

    def provider(self, sock: int) -> Provider:
        return self.world.nodes[self.nodes_of[sock]].provider

    def posted_op(self, op_id: int, op: PendingOperation) -> None:
        """A transfer's call returned ``op``: waiting for it judges it."""
        self.ops[op_id] = op
        self.posted.setdefault(op_id, time.monotonic())

    def make(self, step: Step, model: Model, exp: Expect, checked: Checked, timeout: float,
             direct: Callable[[], None] | None = None) -> Made:
        """``step`` made as one batch (a lab: one round trip per host, two where a host must see what another's
        operation did): its call, the waits for the completions ``exp`` expects of it (each made only if the
        call returned), a barrier, then every read of ``checked``. ``direct``: a step no batch makes."""
        self.popped = {}
        if direct is not None:  # a Reconnect's connect_sockets
            try:
                direct()
                return Made(None, {}, None)
            except Exception as exc:  # judged as any call's answer
                return Made(exc, {}, None)
        call, new_op = kind_of(step).call, kind_of(step).op(step)
        assert call is not None  # a step without a call is made directly (above)
        with batch(self.world.backend) as b:
            try:
                answer = call(self, model, b, step)
            except Exception as exc:  # an argument the backend refused as it was made (judged as the answer)
                return Made(exc, {}, None)
            waits: dict[int, Later[Completion]] = {}
            for op_id in exp.done:
                if op_id == new_op:
                    waits[op_id] = b.call(wait_for, answer.ref, timeout)
                elif op_id in self.ops:
                    waits[op_id] = b.call(wait_for, self.ops[op_id], timeout, answer.ref)
            b.barrier()
            looks = self.reads(b, checked, {**self.ops, **({new_op: answer.ref} if new_op is not None else {})})
        if answer.error is None:
            return Made(answer.value, waits, (checked, looks))
        # Refused: no wait was made, and what the model then expects is waited for one by one; the reads stand
        # only if nothing was to complete (else they may be older than a completion still to come).
        return Made(answer.error, {}, None if waits else (checked, looks))

    def known_after(self, step: Step) -> set[int]:
        """The operations a check after ``step`` may ask about: those held, and the one its call returns."""
        new_op = kind_of(step).op(step)
        return set(self.ops) | ({new_op} if new_op is not None else set())

    def completion(self, op_id: int, waits: Mapping[int, Later[Completion]] | None,
                   timeout: float) -> Completion | Exception | None:
        """Operation ``op_id``'s completion, as ``waits`` saw it, else waited for now (an exception: why none came);
        None: no call returned it. It is no longer pending."""
        op = self.ops.pop(op_id, None)
        if op is None:
            return None
        self.popped[op_id] = op
        try:
            waited = waits.get(op_id) if waits is not None else None
            return waited.value if waited is not None else op.wait(timeout)
        except Exception as exc:
            return exc

    def reads(self, b: Batch, checked: Checked, ops: Mapping[int, Any] | None = None) -> dict[Asked, Later[Any]]:
        """What a check reads, added to ``b``, each by its key (``Asked``); ``ops``: the operations by id (default:
        those held; in a step's batch, the step's own as its call's ``Later.ref``)."""
        ops = self.ops if ops is None else ops
        world = self.world
        looks: dict[Asked, Later[Any]] = {}
        for s in checked.registrations:
            looks["registrations", s] = b.call(self.provider(s).registrations, self.socks[s])
        for n in checked.nodes:
            looks["live", n] = b.call(world.nodes[n].proxy.live_allocations)
        for pi, bi in checked.buffers:
            looks["bytes", pi, bi] = b.call(world.bufs[pi][bi].read)
        # An operation before the states: its error completion moves its socket to error, so read after it a state
        # cannot be older than a completion seen in the same look. Its completion only once it is done (a look,
        # not a wait): TimeoutError while it is pending.
        for op in checked.pending:
            looks["pending", op] = b.call(wait_for, ops[op], 0)
        for s in checked.states:
            looks["connected", s] = b.call(is_connected, self.socks[s])
            looks["closed", s] = b.call(is_closed, self.socks[s])
        return looks

    def closes(self, b: Batch, closes: list[tuple[int, Expect]], timeout: float) -> list[Closing]:
        """Each close in turn, added to ``b`` with the waits for the completions the model expects of it (made
        only if it returned); a barrier wherever the next close is on another node, so none overtakes one before
        it (``Model.close_all`` closes node by node)."""
        made: list[Closing] = []
        for sock_id, exp in closes:
            if made and self.nodes_of[made[-1][0]] != self.nodes_of[sock_id]:
                b.barrier()
            closed = b.call(self.provider(sock_id).close_socket, self.socks[sock_id])
            waits = {op: b.call(wait_for, self.ops[op], timeout, closed.ref) for op in exp.done if op in self.ops}
            made.append((sock_id, exp, closed, waits))
        return made

    def abandon(self) -> bool:
        """After a divergence: close whatever is open. False: something is left (reset the backend)."""
        for sock_id, sock in self.socks.items():
            try:
                if not sock.closed:
                    self.provider(sock_id).close_socket(sock)
            except Exception:  # best effort: the backend is reset if anything is left
                continue
        try:
            return not self.world.backend.leaks()
        except Exception:
            return False
