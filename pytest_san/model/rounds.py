"""Rounds: the steps of a sequence the model can predict, made together and then judged one by one.

A step names everything by index, and the next step is drawn from the seed and the model's state, which a
step moves on as the model expects (``Model.apply``), not as the backend answered. So on a backend whose
every call is a round trip (``Pipelining``: a lab) the model draws and applies the next steps before the
backend has answered the last ones: a *round* is such a run of steps, each step's call, the waits for the
completions it expects and the questions of its check, made together (``pytest_san.together``: one round trip
per host for the whole round, a later call naming what an earlier one returned). Each step is then judged in
order exactly as a step made alone is (``Side.judge``: the same expectations, problems, divergences), from
the round's answers; shrinking and replay run steps the same way.

The calls of one round run on every host at once, each host's in order, so a round holds only steps whose
order across hosts does not matter (a host is a *domain*: one node of the plan). A step can join the round:

- unless its domain is *frozen* in it (another domain's step changed something of it, or will look at it
  after the round: nothing more may run there before that look);
- unless it changes another domain (a transfer, or a close whose peer is open, reaches the peer's) that
  already has calls in the round; that domain is frozen after it;
- unless it names what a register step of this round on another domain returned, or a descriptor cut from
  one (its value is known only once the round is answered).

Its checks and waits in its own domain follow its call; those in other domains run at the start of the next
round there (the step is judged once they are answered). A step whose expectation depends on an answer ends
the round before it: a reconnect (its connect needs the peer's listening address) runs alone, and so does a step
whose call may refuse instead of what the model expects (``Expect.instead``: what the model and the next steps
expect depends on which) and every step while a send that may give up waiting on its own
(``send-wait-bounded``) has waited half the time the model allows before asking (``GIVE_UP_AFTER``).

A step that expects an error completion (an error, ABORTED, CONNECTION_RESET: any status but SUCCESS) runs alone
too: such a completion moves a socket on its own host on its own time (rxe: to error after the round's questions
were read), so its check is asked once the completion is in, and before any later step has run (a later step of
its round would already have changed what the check looks at).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..contract import Status
from ..protocols import Call
from ..together import Earlier, together
from .alternatives import RNR_BOUNDED
from .execute import GIVE_UP_AFTER, Answers, Asked, Seen, Side, Waited
from .reference import Model
from .state import Expect, not_a_key
from .steps import Close, Deregister, Key, Reconnect, Register, Scribble, Step, Transfer

__all__ = ["Rounds"]


class Placeholder(bytes):
    """What a register step of the round returns, unknown while the round is planned: equal only to itself.

    A descriptor's is ``desc_size`` bytes long (as a well-formed one is); a handle's is empty. Being bytes, the
    model's code takes it where it takes a key; it never reaches a backend (a call gets ``Earlier`` instead).
    """

    reg: int

    def __new__(cls, reg: int, length: int) -> Placeholder:
        made = super().__new__(cls, b"\xff" * length)
        made.reg = reg
        return made

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<what step reg#{self.reg} returns>"

    def __deepcopy__(self, memo: dict[int, object]) -> Placeholder:
        return self  # equal only to itself: a copy of the model (transfers.py's undo) keeps this very one


@dataclasses.dataclass(eq=False)
class Planned:
    """One step of a round, and its answers as they arrive (its own round's, then the next one's)."""

    step: Step
    exp: Expect
    call: int | None = None  # the step's call (None: the model skips it, or it makes none)
    waits: dict[int, int] = dataclasses.field(default_factory=dict)  # op id -> call index
    asks: dict[Asked, int] = dataclasses.field(default_factory=dict)  # question -> call index
    later: int = 0  # of those, how many run in the next round
    result: object = None
    waited: Waited = dataclasses.field(default_factory=dict)
    asked: Answers = dataclasses.field(default_factory=dict)
    answered: int = 0

    @property
    def ready(self) -> bool:
        return self.answered == len(self.waits) + len(self.asks) + (self.call is not None)


@dataclasses.dataclass
class _Item:
    """A call of a round and where its outcome goes."""

    call: Call
    planned: Planned
    role: str  # call | wait | ask
    key: Any = None  # the op id of a wait, the question of an ask


class Round:
    """The calls of one round, domain by domain, as steps join it."""

    def __init__(self, rounds: Rounds, carried: list[_Item]) -> None:
        self.rounds = rounds
        self.items: list[_Item] = []
        self.domains: dict[int, int] = {}  # domain -> items in this round
        self.frozen: set[int] = set()
        self.later: list[_Item] = []  # the next round's first items
        self.regs: dict[int, tuple[int, int]] = {}  # register step id -> (its call's index, domain)
        self.ops: dict[int, int] = {}  # op id -> the index of the call that made it
        self.planned: list[Planned] = []
        for item in carried:
            self._add(item, self.rounds.domain_of_item(item))

    def _add(self, item: _Item, domain: int) -> int:
        self.items.append(item)
        self.domains[domain] = self.domains.get(domain, 0) + 1
        return len(self.items) - 1

    @property
    def empty(self) -> bool:
        return not self.items and not self.planned

    # -- can a step join? -------------------------------------------------------------------------

    def admits(self, step: Step, spec: Model) -> bool:
        if isinstance(step, Reconnect):
            return False
        own = self.rounds.domain_of(step, spec)
        if own is None:
            return True  # skipped by the model: no call
        if own in self.frozen:
            return False
        for other in self.rounds.reaches(step, spec) - {own}:
            if other in self.frozen or self.domains.get(other):
                return False
        for key in _keys(step):
            if key.reg is not None and key.reg in self.regs and (self.regs[key.reg][1] != own or key.cut):
                return False
        return True

    # -- a step joins -----------------------------------------------------------------------------

    def join(self, step: Step, spec: Model) -> Planned:
        """Apply ``step`` to ``spec`` and add its call, waits and questions (``admits`` said it may join)."""
        rounds = self.rounds
        own = rounds.domain_of(step, spec)
        reaches = rounds.reaches(step, spec) if own is not None else set()
        args = rounds.side.call_args(step, spec, lambda key: self._value(key, spec)) if own is not None else None
        exp = spec.apply(step)
        planned = Planned(step, exp)
        self.planned.append(planned)
        if exp.skip or own is None or args is None:
            return planned
        planned.call = self._add(_Item(args, planned, "call"), own)
        if isinstance(step, Register) and not exp.raises:  # the same registration again keeps its key (R13)
            spec.bind(step, Placeholder(step.reg, spec.desc_size if step.kind == "rdma" else 0))
            self.regs[step.reg] = (planned.call, own)
        if isinstance(step, Transfer):
            self.ops[step.op] = planned.call
        for op_id in exp.done:
            target: object = Earlier(self.ops[op_id]) if op_id in self.ops else rounds.operation(op_id)
            if target is None:
                continue  # the call that made it failed: nothing to wait for
            self._place(_Item((target, "wait", (rounds.side.timeout,)), planned, "wait", op_id),
                        rounds.side.op_nodes.get(op_id, own), own, planned)
        checked = rounds.side.checked(exp, full=rounds.side.full, model=spec,
                                      known=set(rounds.side.ops) | set(rounds.made) | set(self.ops))
        op_of = {op: (Earlier(self.ops[op]) if op in self.ops else rounds.operation(op)) for op in checked.pending}
        for key, question in rounds.side.questions(checked, op_of):
            self._place(_Item(question, planned, "ask", key), rounds.domain_of_question(key, spec), own, planned)
        self.frozen |= reaches - {own}
        return planned

    def _place(self, item: _Item, domain: int, own: int, planned: Planned) -> None:
        if domain == own:
            index = self._add(item, domain)
            if item.role == "wait":
                planned.waits[item.key] = index
            else:
                planned.asks[item.key] = index
            return
        self.frozen.add(domain)  # looked at after this round: nothing more may change it before
        self.later.append(item)
        planned.later += 1
        if item.role == "wait":
            planned.waits[item.key] = -1
        else:
            planned.asks[item.key] = -1

    def _value(self, key: Key | None, spec: Model) -> object:
        """What a call passes for ``key``: its value, or what names the register call of this round."""
        value = spec.value(key)
        if isinstance(value, Placeholder):
            return Earlier(self.regs[value.reg][0])
        return value

    # -- the answers ------------------------------------------------------------------------------

    def calls(self) -> list[Call]:
        return [item.call for item in self.items]

    def answer(self, outcomes: list[tuple[bool, object]]) -> None:
        for item, outcome in zip(self.items, outcomes, strict=True):
            planned = item.planned
            planned.answered += 1
            if item.role == "call":
                planned.result = outcome[1]  # what it returned or raised
            elif item.role == "wait":
                planned.waited[item.key] = outcome
            else:
                planned.asked[item.key] = outcome


def _alone_for_its_answer(step: Step, spec: Model) -> bool:
    """Whether ``step`` runs alone for what the model expects of it: its call may refuse it instead
    (``Expect.instead``), or an operation may complete otherwise than SUCCESS (its check waits for that)."""
    if not isinstance(step, (Transfer, Close)):
        return False
    exp = copy.deepcopy(spec).apply(step)
    return bool(exp.instead) or any(s != Status.SUCCESS for statuses, _ in exp.done.values() for s in statuses)


def _keys(step: Step) -> list[Key]:
    if isinstance(step, Transfer):
        return [key for _, key in step.entries] + ([step.desc] if step.desc is not None else [])
    if isinstance(step, Deregister):
        return [step.key]
    return []


class Rounds:
    """A sequence's steps on ``side`` in rounds: ``run(draw, count)`` yields each step judged, in order."""

    def __init__(self, side: Side, made_alone: Callable[[Step], Seen]) -> None:
        """``made_alone``: how a step that cannot join a round runs (``side.run``, or what the caller wraps)."""
        self.side = side
        self.made_alone = made_alone
        # Operations a transfer of an earlier round returned, until that step is judged (then ``side.ops`` holds
        # them): a later step's wait for one must be made in its round, before the questions of its check.
        self.made: dict[int, object] = {}

    def operation(self, op_id: int) -> object | None:
        """What stands for operation ``op_id`` made before this round: judged, or only made (None: its call
        returned none)."""
        return self.side.ops.get(op_id, self.made.get(op_id))

    # -- domains ----------------------------------------------------------------------------------

    def domain_of(self, step: Step, model: Model) -> int | None:
        """The node whose provider (or process) the step's call goes to; None if the model skips it."""
        if isinstance(step, Scribble):
            return self.side.world.plan.nodes[step.view[0]]
        if isinstance(step, Reconnect):
            return None
        sock = model.socks.get(step.sock)
        return None if sock is None else sock.node

    def reaches(self, step: Step, model: Model) -> set[int]:
        """The nodes whose state the step may change: its own, and its peer's for a transfer or a close of a
        socket whose peer is still open."""
        own = self.domain_of(step, model)
        if own is None:
            return set()
        if isinstance(step, (Transfer, Close)):
            sock = model.socks[step.sock]
            peer = sock.peer
            if peer is not None and (isinstance(step, Transfer) or peer.state in ("connected", "error")):
                return {own, peer.node}
        return {own}

    def domain_of_question(self, key: Asked, model: Model) -> int:
        kind = key[0]
        if kind == "live":
            return int(key[1])
        if kind == "bytes":
            return self.side.world.plan.nodes[key[1]]
        if kind == "pending":
            return self.side.op_nodes[key[1]]
        return model.socks[key[1]].node

    def domain_of_item(self, item: _Item) -> int:
        model = self.side.model
        assert model is not None
        if item.role == "wait":
            return self.side.op_nodes[item.key]
        return self.domain_of_question(item.key, model)

    # -- the sequence -----------------------------------------------------------------------------

    def run(self, draw: Callable[[Model], Step | None], count: int) -> Iterator[tuple[Step, Seen]]:
        """Draw up to ``count`` steps (``draw(model)``: the next step for that state of the model, None when there
        is none) and yield each judged, in order (stop iterating to stop: what was made is left to the caller)."""
        waiting: list[Planned] = []  # made, not yet judged: some of their answers come with the next round
        carried: list[_Item] = []  # the next round's first calls: those answers
        pending: Step | None = None  # drawn, in no round yet
        drawn = 0

        def next_step(spec: Model) -> Step | None:
            nonlocal drawn
            if drawn >= count:
                return None
            step = draw(spec)
            drawn += 1
            return step

        while True:
            spec = self._speculate(waiting)
            if pending is None:
                pending = next_step(spec)
            self._note(pending, spec)
            if pending is not None and (isinstance(pending, Reconnect) or self._alone(spec)
                                        or _alone_for_its_answer(pending, spec)):
                yield from self._judge_all(waiting, carried)  # everything before it first
                waiting, carried = [], []
                step, pending = pending, None
                yield step, self.made_alone(step)
                continue
            round_ = Round(self, carried)
            while (pending is not None and round_.admits(pending, spec) and not self._alone(spec)
                   and not _alone_for_its_answer(pending, spec)):  # else it runs alone, after this round
                round_.join(pending, spec)
                pending = next_step(spec)
                self._note(pending, spec)
            if round_.empty:
                return
            self._make(round_)
            carried = round_.later
            waiting += round_.planned
            while waiting and waiting[0].ready:
                planned = waiting.pop(0)
                yield planned.step, self._judged(planned)

    def _note(self, step: Step | None, model: Model) -> None:
        """The node of the operation a transfer makes: where its completion is waited for."""
        if isinstance(step, Transfer) and step.sock in model.socks:
            self.side.op_nodes[step.op] = model.socks[step.sock].node

    def _alone(self, spec: Model) -> bool:
        """Whether the next step runs alone: a send may give up waiting on its own about now."""
        side = self.side
        if RNR_BOUNDED not in side.alts:
            return False
        now = time.monotonic()
        return any(now - side.posted.get(op, now) > GIVE_UP_AFTER / 2 for _, op in spec.waiting_sends())

    def _speculate(self, waiting: list[Planned]) -> Model:
        """The real model moved on by the steps made and not yet judged (their calls answered): what the next
        round's steps are drawn from."""
        model = self.side.model
        assert model is not None
        spec = copy.deepcopy(model)
        for planned in waiting:
            spec.answered(spec.apply(planned.step), planned.result)
            returned = planned.result
            if (isinstance(planned.step, Register) and planned.call is not None and not planned.exp.raises
                    and not not_a_key(planned.step.kind, returned, spec.desc_size)):
                spec.bind(planned.step, returned)
        return spec

    def _make(self, round_: Round) -> None:
        side = self.side
        t0 = time.perf_counter()
        outcomes = together(side.world.backend, round_.calls()) if round_.items else []
        round_.answer(outcomes)
        now = time.monotonic()
        for planned in round_.planned:
            if isinstance(planned.step, Transfer):
                side.posted.setdefault(planned.step.op, now)
                if planned.call is not None and not isinstance(planned.result, BaseException):
                    self.made[planned.step.op] = planned.result
        side.cost.calls += time.perf_counter() - t0

    def _judge_all(self, waiting: list[Planned], carried: list[_Item]) -> Iterator[tuple[Step, Seen]]:
        """Ask what is outstanding (a round of only those calls) and judge every step made."""
        if carried:
            self._make(Round(self, carried))
        for planned in waiting:
            yield planned.step, self._judged(planned)

    def _judged(self, planned: Planned) -> Seen:
        side = self.side
        t0 = time.perf_counter()
        seen = side.judge(planned.step, planned.result, planned.waited if planned.call is not None else None,
                          planned.asked)
        if isinstance(planned.step, Transfer):
            self.made.pop(planned.step.op, None)  # side.ops has it now (or its completion was taken)
        side.cost.checks += time.perf_counter() - t0
        return seen




def close_in_rounds(side: Side, closes: list[tuple[int, Expect]]) -> list[Seen]:
    """The closes at the end of a sequence (``Side.finish``) in rounds: a close joins a round unless its node is
    frozen there or it completes operations of a node (its peer's) that has calls in it; those completions are
    waited for at the start of the next round there. Then each close is judged in order (``Side.closed``).

    Every socket is closed, and nothing is checked between the closes: two closes commute unless one completes
    operations of the other's node, or they close the two ends of a connection and either completes operations
    (an end's pending ones complete ABORTED when it closes first, CONNECTION_RESET when its peer does)."""
    model = side.model
    assert model is not None
    rounds: list[list[tuple[int, int | None, Call]]] = [[]]  # per round: (close, op id or None: the close, call)
    domains: dict[int, int] = {}
    frozen: set[int] = set()
    later: list[tuple[int, tuple[int, int | None, Call]]] = []  # (node, item) for the next round
    closing: dict[int, bool] = {}  # sockets closed in this round -> whether their close completed anything

    def put(node: int, item: tuple[int, int | None, Call]) -> None:
        rounds[-1].append(item)
        domains[node] = domains.get(node, 0) + 1

    def new_round() -> None:
        nonlocal later
        rounds.append([])
        domains.clear()
        frozen.clear()
        closing.clear()
        for node, item in later:
            put(node, item)
        later = []

    for index, (sock_id, exp) in enumerate(closes):
        own = side.nodes_of[sock_id]
        reach = {own} | {side.op_nodes.get(op_id, own) for op_id in exp.done}
        peer = model.socks[sock_id].peer
        both_ends = peer is not None and peer.id in closing and (closing[peer.id] or bool(exp.done))
        if both_ends or own in frozen or any(d in frozen or domains.get(d) for d in reach - {own}):
            new_round()
        closing[sock_id] = bool(exp.done)
        put(own, (index, None, (side._provider(sock_id), "close_socket", (side.socks[sock_id],))))
        for op_id in exp.done:
            op = side.ops.get(op_id)
            if op is None:
                continue  # its call returned no operation: a problem already
            node = side.op_nodes.get(op_id, own)
            item = (index, op_id, (op, "wait", (side.timeout,)))
            if node == own:
                put(own, item)
            else:
                later.append((node, item))
                frozen.add(node)
        frozen |= reach - {own}
    if later:
        new_round()
    results: list[object] = [None] * len(closes)
    waited: list[Waited] = [{} for _ in closes]
    t0 = time.perf_counter()
    for items in rounds:
        if not items:
            continue
        for (index, made, _), outcome in zip(items, together(side.world.backend, [c for _, _, c in items]),
                                             strict=True):
            if made is None:
                results[index] = outcome[1]
            else:
                waited[index][made] = outcome
    side.cost.calls += time.perf_counter() - t0
    return [side.closed(sock_id, exp, results[i], waited[i]) for i, (sock_id, exp) in enumerate(closes)]
